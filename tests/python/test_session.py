"""tilec.compile and CompiledModel: the repository's models against their recorded outputs and
onnxruntime, symbolic dimensions, tensors in and out, explain and profile."""

import subprocess
import sys
import threading

import numpy as np
import pytest

import tilec
from conftest import LIGHT, MODELS, assert_close, recorded


def _add_relu_model():
    """y = relu(x + b) with x: f32[batch, 4] and b a constant, built with onnx.helper."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    b = numpy_helper.from_array(np.arange(4, dtype=np.float32) - 1.5, "b")
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        "add_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [b],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_gpt2_matches_recorded_outputs():
    m = tilec.compile(MODELS / "gpt2" / "model.onnx")
    (x,), (want,) = recorded(MODELS / "gpt2")
    assert m.input_names == ["input_ids"] and m.output_names == ["logits"]
    (got,) = m.run({"input_ids": x})
    assert_close(got, want)


def test_bert_two_inputs_in_order_as_a_list():
    m = tilec.compile(str(MODELS / "bert" / "model.onnx"))
    ins, (want,) = recorded(MODELS / "bert")
    assert m.input_names == ["input_ids", "attention_mask"]
    (got,) = m.run(ins)
    assert_close(got, want)


def test_light_model_from_bytes():
    path = LIGHT / "squeezenet" / "model.onnx"
    if not path.exists():
        pytest.skip("testdata/gen is missing: run scripts/setup-venv.sh")
    m = tilec.compile(path.read_bytes())
    (x,), (want,) = recorded(path.parent)
    (got,) = m.run([x])
    assert_close(got, want, rtol=1e-3, atol=1e-5)


def test_model_proto_and_symbolic_batch_compiled_once_per_size():
    m = tilec.compile(_add_relu_model())
    assert m.input_types == [("x", "float32", ("batch", 4))]
    for batch in (1, 3, 3, 7):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        (y,) = m.run({"x": x})
        assert_close(y, np.maximum(x + (np.arange(4, dtype=np.float32) - 1.5), 0))
    assert m.builds == 3


def test_dims_fix_a_symbolic_dimension():
    m = tilec.compile(_add_relu_model(), dims={"batch": 2})
    assert m.input_types == [("x", "float32", (2, 4))]
    (y,) = m.run([np.ones((2, 4), np.float32)])
    assert y.shape == (2, 4)
    with pytest.raises(tilec.InvalidInputError, match=r"dimension 0 must be 2, is 3"):
        m.run([np.ones((3, 4), np.float32)])


def test_gpt2_against_onnxruntime_on_random_inputs():
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (scripts/setup-export-venv.sh)")
    path = str(MODELS / "gpt2" / "model.onnx")
    m = tilec.compile(path)
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in [(1, 5), (3, 17)]:
        x = rng.integers(0, 1024, shape, dtype=np.int64)
        (got,) = m.run({"input_ids": x})
        (want,) = s.run(None, {"input_ids": x})
        assert_close(got, want)
    assert m.builds == 2


def test_non_contiguous_read_only_and_list_inputs():
    m = tilec.compile(_add_relu_model())
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, :4] - 10  # strided view
    want = np.maximum(x + (np.arange(4, dtype=np.float32) - 1.5), 0)
    assert_close(m.run([x])[0], want)
    x = np.ascontiguousarray(x)
    x.flags.writeable = False
    assert_close(m.run([x])[0], want)
    assert_close(m.run([x.tolist()])[0], want)


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (scripts/setup-export-venv.sh)")
    m = tilec.compile(_add_relu_model())
    x = torch.randn(5, 4, requires_grad=True)
    (y,) = m.run({"x": x})
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    want = torch.relu(x.detach() + (torch.arange(4, dtype=torch.float32) - 1.5))
    assert torch.allclose(y, want)
    (y,) = m.run([x.detach().t().contiguous().t()])  # a column-major tensor
    assert torch.allclose(y, want)


def test_explain_and_profile():
    m = tilec.compile(MODELS / "gpt2" / "model.onnx")
    x = np.zeros((1, 8), np.int64)
    with pytest.raises(tilec.InvalidInputError, match="symbolic dimensions"):
        m.explain()
    with pytest.raises(tilec.InvalidInputError, match="run the model first"):
        m.profile()
    text = m.explain({"input_ids": x})
    assert "kernels (" in text and "gemm" in text
    table = m.profile({"input_ids": x}, reps=2)
    assert "kernel" in table and "calls" in table and "gemm" in table
    m.run([x])
    assert "kernels (" in m.explain()
    assert "gemm" in m.profile(reps=1)  # zeros shaped as the last run's inputs


def test_bf16_runs_close_to_f32():
    m32 = tilec.compile(MODELS / "gpt2" / "model.onnx")
    m16 = tilec.compile(MODELS / "gpt2" / "model.onnx", dtype="bfloat16")
    x = np.random.default_rng(1).integers(0, 1024, (1, 8), dtype=np.int64)
    (a,) = m32.run([x])
    (b,) = m16.run([x])
    assert b.dtype == np.float32
    assert np.abs(a - b).max() < 0.1 * np.abs(a).max()
    assert np.abs(a - b).max() > 0  # really ran in 16 bits


def test_threads_share_a_model():
    m = tilec.compile(_add_relu_model())
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            x = rng.standard_normal((1 + seed % 3, 4)).astype(np.float32)
            (y,) = m.run([x])
            if not np.allclose(y, np.maximum(x + (np.arange(4, dtype=np.float32) - 1.5), 0)):
                errors.append(seed)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []


def test_import_does_not_import_torch():
    code = "import sys, tilec; assert 'torch' not in sys.modules; print(tilec.__version__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == tilec.__version__
