"""cuBLAS (through PyTorch) on the shapes of tilec's tensor-core GEMM benchmark
(crates/tilec-cuda/examples/gemm_bench.rs, phase `bench`), measured in the same run.
Prints one JSON object per line: label, impl, ms (median of CUDA-event timings), tflops, tb_s.
Layouts follow the label: `_rc` (and the GELU and M = 16 shapes) multiply by a column-major B,
i.e. torch.matmul(a, w.t()) with w stored N x K, as nn.Linear does.
usage: python3 bench/gemm_tc_peer.py [--iters 30]"""
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    torch.manual_seed(0)
    print(json.dumps({"peer": "torch", "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                      "blas": str(torch.backends.cuda.preferred_blas_library())}), flush=True)
    for label, m, n, k, dt, bcol in SHAPES:
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
