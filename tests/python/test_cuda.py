"""The package on a GPU: `target="cuda"` sessions take and return CUDA tensors (they stay on the
device), and `torch.compile(..., backend="tilec", options={"target": "cuda"})` matches eager.
Skipped, with the reason, where PyTorch or a CUDA device is missing. On a GPU machine without
pytest: `python3 tests/python/test_cuda.py` runs the same checks."""

import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (scripts/setup-export-venv.sh)")

import tilec  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

GPT2 = pathlib.Path(__file__).resolve().parents[2] / "models" / "gpt2" / "model.onnx"


def test_cuda_session_keeps_tensors_on_the_device_and_matches_the_cpu():
    cpu = tilec.compile(GPT2)
    gpu = tilec.compile(GPT2, target="cuda")
    gen = torch.Generator().manual_seed(3)
    for batch, seq in [(2, 16), (1, 37)]:
        ids = torch.randint(0, 1000, (batch, seq), generator=gen)
        want = cpu.run({"input_ids": ids.numpy()})
        got = gpu.run({"input_ids": ids.cuda()})
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert isinstance(g, torch.Tensor) and g.is_cuda, type(g)
            assert tuple(g.shape) == w.shape
            np.testing.assert_allclose(g.cpu().numpy(), w, rtol=1e-3, atol=1e-3)


def test_cuda_session_rejects_a_wrong_shape_with_a_clear_error():
    gpu = tilec.compile(GPT2, target="cuda")
    with pytest.raises(tilec.TilecError, match="input_ids"):
        gpu.run({"input_ids": torch.zeros((2, 3, 4), dtype=torch.int64, device="cuda")})


def test_cuda_session_waits_for_pytorchs_current_stream():
    # The input is written on a side stream behind tens of milliseconds of queued products: a
    # session that read it on its own stream without waiting would see stale memory.
    cpu = tilec.compile(GPT2)
    gpu = tilec.compile(GPT2, target="cuda")
    ids_host = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(5))
    want = cpu.run({"input_ids": ids_host.numpy()})
    src = ids_host.cuda()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):
            a = torch.tanh(a @ a)
        ids = src.clone()
        got = gpu.run({"input_ids": ids})
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.cpu().numpy(), w, rtol=1e-3, atol=1e-3)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean(dim=(2, 3)))


def test_torch_compile_on_cuda_matches_eager():
    torch.manual_seed(0)
    model = _Net().cuda().eval()
    x = torch.randn(4, 3, 24, 24, device="cuda")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tilec", options={"target": "cuda"})
    with torch.no_grad():
        want = model(x)
        got = compiled(x)
    assert got.is_cuda
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print("ok", name)
