"""Peers for tilec's memory-bound GPU kernels, measured in the same run as tilec:
PyTorch eager and torch.compile on softmax, LayerNorm, RMSNorm and gelu(x*w + b) over the last
axis of a ROWS x COLS tensor, in bf16 and fp32, plus the device-to-device copy bandwidth.
Prints one JSON object per line (same fields as tilec's gpu_bench: op, dtype, impl, ms, tb_s).
usage: python3 bench/gpu_peers.py [--rows 32768] [--cols 8192]"""
import argparse
import json

import torch
import torch.nn.functional as F


def median_ms(fn, warmup=5, iters=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--cols", type=int, default=8192)
    args = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    print(json.dumps({"peer": "torch", "torch": torch.__version__, "device": torch.cuda.get_device_name(0)}), flush=True)

    n = 1 << 30
    src = torch.empty(n, device=dev, dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    print(json.dumps({"op": "copy_dtod", "impl": "torch", "bytes": 2 * n * 2, "ms": ms, "tb_s": 2 * n * 2 / ms / 1e9}), flush=True)
    del src, dst

    R, C = args.rows, args.cols
    for dtype, name in [(torch.bfloat16, "bf16"), (torch.float32, "f32")]:
        x = torch.randn(R, C, device=dev, dtype=dtype)
        w = torch.randn(C, device=dev, dtype=dtype)
        b = torch.randn(C, device=dev, dtype=dtype)

        def rmsnorm(x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)

        ops = {
            "softmax": lambda x: torch.softmax(x, dim=-1),
            "layernorm": lambda x: F.layer_norm(x, (C,), w, b, 1e-5),
            "rmsnorm": rmsnorm,
            "gelu_bias": lambda x: F.gelu(x * w + b),
        }
        moved = 2 * R * C * x.element_size()  # read x once, write y once
        for op, f in ops.items():
            ms = median_ms(lambda: f(x))
            print(json.dumps({"op": op, "dtype": name, "rows": R, "cols": C, "impl": "torch_eager", "ms": ms, "tb_s": moved / ms / 1e9}), flush=True)
            cf = torch.compile(f)
            cf(x)
            torch.cuda.synchronize()
            ms = median_ms(lambda: cf(x))
            print(json.dumps({"op": op, "dtype": name, "rows": R, "cols": C, "impl": "torch_compile", "ms": ms, "tb_s": moved / ms / 1e9}), flush=True)
        del x


if __name__ == "__main__":
    main()
