"""Peers for tilec's mma.sync GEMM benchmark (crates/tilec-cuda/examples/mma_bench.rs, phase
`bench`, and crates/tilec-cuda/examples/gemv_bench.rs, whose gemv_ and llm_ labels are the same),
measured in the same run: cuBLAS through torch.matmul for the decode and LLM shapes
(B column-major as nn.Linear stores it; `_rr` row-major), cuDNN through torch's conv2d for
ResNet-50's 53 convolutions at batch 64 (f16, channels-last, no bias), and GPT-2 small's
projections at 8 x 512 and 1 x 128 and its output projection (f16, cuBLAS). Prints one JSON object
per line: label, ms (the lesser of the eager median and the median per call of ten calls replayed
from a CUDA graph: the GPU's time, not the CPU's dispatch), ms_eager.
usage: python3 bench/mma_peer.py [--iters 30] [--only PREFIX,...]"""
import argparse
import json

import torch
import torch.nn.functional as F


def median_ms(fn, warmup=5, iters=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in ev)
    return t[len(t) // 2]


def graph_ms(fn, reps=10, iters=30):
    """Median per call of `reps` calls captured in one CUDA graph: the GPU's time without the
    CPU's dispatch between calls (which, for small kernels, eager timing measures instead)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return median_ms(g.replay, warmup=3, iters=iters) / reps


def resnet50_convs():
    v = [(224, 3, 64, 7, 2)]
    cin = 64
    for blocks, width, size, stride in [(3, 64, 56, 1), (4, 128, 56, 2), (6, 256, 28, 2), (3, 512, 14, 2)]:
        out = width * 4
        for b in range(blocks):
            s, at = (stride, size) if b == 0 else (1, size // stride)
            v.append((at, cin, width, 1, 1))
            v.append((at, width, width, 3, s))
            v.append((at // s, width, out, 1, 1))
            if b == 0:
                v.append((at, cin, out, 1, s))
            cin = out
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--only", default="", help="comma-separated label prefixes")
    args = ap.parse_args()
    prefixes = [p for p in args.only.split(",") if p]
    wanted = lambda label: not prefixes or any(label.startswith(p) for p in prefixes)
    torch.backends.cudnn.benchmark = True
    print(json.dumps({"peer": "torch", "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                      "device": torch.cuda.get_device_name(0)}), flush=True)
    shapes = [("gemv_bf16_16x8192x8192", 16, 8192, 8192, True), ("gemv_bf16_16x8192x8192_rr", 16, 8192, 8192, False)]
    for m in (1, 16):
        for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (2560, 2048), (2048, 2048), (11264, 2048), (2048, 5632), (32000, 2048)):
            shapes.append((f"llm_bf16_{m}x{n}x{k}", m, n, k, True))
    # GPT-2 small's projections (Conv1D weights: B row-major) and its tied output projection.
    gpt2 = [(f"gpt2_{w}_f16_{m}x{n}x{k}", m, n, k, False) for m in (4096, 128)
            for w, n, k in (("qkv", 2304, 768), ("proj", 768, 768), ("fc1", 3072, 768), ("fc2", 768, 3072))]
    gpt2 += [("gpt2_lmhead_f16_4096x50257x768", 4096, 50257, 768, True), ("gpt2_lmhead_rr_f16_4096x50257x768", 4096, 50257, 768, False)]
    for label, m, n, k, bcol in shapes + gpt2:
        if not wanted(label):
            continue
        dt = torch.float16 if label.startswith("gpt2") else torch.bfloat16
        a = torch.empty(m, k, device="cuda", dtype=dt).uniform_(-1, 1)
        b = torch.empty(n, k, device="cuda", dtype=dt).uniform_(-1, 1).t() if bcol else \
            torch.empty(k, n, device="cuda", dtype=dt).uniform_(-1, 1)
        eager = median_ms(lambda: torch.matmul(a, b), iters=args.iters)
        ms = min(eager, graph_ms(lambda: torch.matmul(a, b), iters=args.iters))
        print(json.dumps({"label": label, "impl": "cuBLAS (torch.matmul)", "ms": ms, "ms_eager": eager,
                          "tb_s": (m * k + k * n + m * n) * 2 / ms / 1e9, "tflops": 2 * m * n * k / ms / 1e9}), flush=True)
    if not wanted("resnet50_conv"):
        return
    total = 0.0
    for i, (h, c, o, k, s) in enumerate(resnet50_convs()):
        x = torch.empty(64, c, h, h, device="cuda", dtype=torch.float16).uniform_(-1, 1).to(memory_format=torch.channels_last)
        w = torch.empty(o, c, k, k, device="cuda", dtype=torch.float16).uniform_(-1, 1).to(memory_format=torch.channels_last)
        conv = lambda: F.conv2d(x, w, stride=s, padding=k // 2)
        eager = median_ms(conv, iters=args.iters)
        ms = min(eager, graph_ms(conv, iters=args.iters))
        total += ms
        print(json.dumps({"label": f"resnet50_conv{i:02}_{h}x{c}x{o}_k{k}s{s}", "impl": "cuDNN (torch conv2d)", "ms": ms,
                          "ms_eager": eager}), flush=True)
    print(json.dumps({"label": "resnet50_convs_f16_b64", "impl": "cuDNN (torch conv2d)", "ms": total}), flush=True)


if __name__ == "__main__":
    main()
