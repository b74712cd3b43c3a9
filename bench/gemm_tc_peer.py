"""cuBLAS (through PyTorch) on the shapes of tilec's tensor-core GEMM benchmark
(crates/tilec-cuda/examples/gemm_bench.rs, phase `bench`), measured in the same run.
Prints one JSON object per line: label, impl, ms (median of CUDA-event timings), tflops, tb_s.
Layouts follow the label: `_rc` (and the GELU and M = 16 shapes) multiply by a column-major B,
i.e. torch.matmul(a, w.t()) with w stored N x K, as nn.Linear does.
Narrow types: gemm_fp8_8192 is torch._scaled_mm (e4m3, B column-major, per-tensor scales, bf16
out) with fast accumulation (impl `cublas`, accumulating in the wgmma accumulator as tilec's
kernel does) and without (`cublas_split_accum`); gemm_tf32_8192 is torch.matmul on f32 with
allow_tf32 (B column-major, f32 out); gemm_f32_8192 is exact f32 (allow_tf32 off, B row-major),
the peer of the SIMT GEMM.
usage: python3 bench/gemm_tc_peer.py [--iters 30] [--only SUBSTRING[,SUBSTRING...]]"""
import argparse
import json

import torch
import torch.nn.functional as F


def median_ms(fn, warmup=5, iters=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in events:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in events)
    return times[len(times) // 2]


SHAPES = [
    # label, m, n, k, dtype, B column-major
    ("gemm_bf16_8192", 8192, 8192, 8192, torch.bfloat16, False),
    ("gemm_bf16_8192_rc", 8192, 8192, 8192, torch.bfloat16, True),
    ("gemm_f16_8192", 8192, 8192, 8192, torch.float16, False),
    ("gemm_bf16_4096", 4096, 4096, 4096, torch.bfloat16, False),
    ("gemm_bias_gelu_bf16_8192x4096x16384", 8192, 4096, 16384, torch.bfloat16, True),
    ("gemv_bf16_16x8192x8192", 16, 8192, 8192, torch.bfloat16, True),
]


def emit(label, impl, ms, flops, nbytes=None):
    j = {"label": label, "impl": impl, "ms": ms, "tflops": flops / ms / 1e9}
    if nbytes is not None:
        j["tb_s"] = nbytes / ms / 1e9
    print(json.dumps(j), flush=True)


def narrow(label, iters):
    """The fp8, tf32 and exact f32 peers (8192 cubed)."""
    m = n = k = 8192
    flops = 2.0 * m * n * k
    if label == "gemm_fp8_8192":
        f8 = torch.float8_e4m3fn
        a = torch.empty(m, k, device="cuda").uniform_(-1, 1).to(f8)
        w = torch.empty(n, k, device="cuda").uniform_(-1, 1).to(f8)
        b = w.t()  # column-major K x N, as _scaled_mm wants
        sa = torch.tensor(0.75, device="cuda")
        sb = torch.tensor(1.25, device="cuda")
        nbytes = m * k + k * n + 2 * m * n
        for impl, fast in [("cublas", True), ("cublas_split_accum", False)]:
            ms = median_ms(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                                    use_fast_accum=fast), iters=iters)
            emit(label, impl, ms, flops, nbytes)
        return
    tf32 = label == "gemm_tf32_8192"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        a = torch.empty(m, k, device="cuda").uniform_(-1, 1)
        if tf32:
            b = torch.empty(n, k, device="cuda").uniform_(-1, 1).t()
        else:
            b = torch.empty(k, n, device="cuda").uniform_(-1, 1)
        c = torch.empty(m, n, device="cuda")
        ms = median_ms(lambda: torch.matmul(a, b, out=c), iters=iters)
        emit(label, "cublas", ms, flops, 4 * (m * k + k * n + m * n))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


NARROW = ["gemm_fp8_8192", "gemm_tf32_8192", "gemm_f32_8192"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = [o for o in args.only.split(",") if o]
    selected = lambda label: not only or any(o in label for o in only)
    torch.manual_seed(0)
    print(json.dumps({"peer": "torch", "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                      "blas": str(torch.backends.cuda.preferred_blas_library())}), flush=True)
    for label in NARROW:
        if not selected(label):
            continue
        try:
            narrow(label, args.iters)
        except Exception as e:  # report and go on with the other shapes
            print(json.dumps({"label": label, "impl": "cublas", "error": repr(e)}), flush=True)
        torch.cuda.empty_cache()
    for label, m, n, k, dt, bcol in SHAPES:
        if not selected(label):
            continue
        a = torch.empty(m, k, device="cuda", dtype=dt).uniform_(-1, 1)
        if bcol:
            w = torch.empty(n, k, device="cuda", dtype=dt).uniform_(-1, 1)
            b = w.t()
        else:
            b = torch.empty(k, n, device="cuda", dtype=dt).uniform_(-1, 1)
        c = torch.empty(m, n, device="cuda", dtype=dt)
        ms = median_ms(lambda: torch.matmul(a, b, out=c), iters=args.iters)
        flops = 2.0 * m * n * k
        nbytes = (m * k + k * n + m * n) * a.element_size()
        print(json.dumps({"label": label, "impl": "cublas", "ms": ms, "tflops": flops / ms / 1e9,
                          "tb_s": nbytes / ms / 1e9}), flush=True)
        if "gelu" in label:
            bias = torch.empty(n, device="cuda", dtype=dt).uniform_(-1, 1)
            ms2 = median_ms(lambda: F.gelu(F.linear(a, w, bias)), iters=args.iters)
            print(json.dumps({"label": label, "impl": "torch_linear_gelu", "ms": ms2,
                              "tflops": flops / ms2 / 1e9}), flush=True)
        del a, b, c
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
