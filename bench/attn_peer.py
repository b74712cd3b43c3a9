"""Peers for tilec's FlashAttention benchmark (crates/tilec-cuda/examples/attn_bench.rs, phase
`bench`), on the same labels and shapes: PyTorch's scaled_dot_product_attention restricted to
one backend at a time with torch.nn.attention.sdpa_kernel, the flash backend (FlashAttention-2)
and the cuDNN backend. Q, K and V are [b, h, s, d] tensors (GPT-2's as the QKV projection
leaves them: [b, s, h, d] transposed, a view), random in [-1, 1).
Prints one JSON object per line: label, backend, ms (median over CUDA events of a CUDA graph of
`--reps` calls, per call), tflops (4*b*h*sq*sk*d, halved when causal), or error when the backend
does not run the shape.
usage: python3 bench/attn_peer.py [--iters 20] [--reps 10]"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CASES = [
    # label, b, h, s, d, dtype, causal, bshd
    ("attn_prefill_bf16_b4h32s4096d128", 4, 32, 4096, 128, torch.bfloat16, False, False),
    ("attn_prefill_causal_bf16_b4h32s4096d128", 4, 32, 4096, 128, torch.bfloat16, True, False),
    ("attn_f16_b8h12s512d64", 8, 12, 512, 64, torch.float16, False, True),
]


def graph_ms(fn, reps, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in ev)
    return t[len(t) // 2] / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}))
    for label, b, h, s, d, dt, causal, bshd in CASES:
        def mk():
            if bshd:
                return (torch.rand(b, s, h, d, device="cuda", dtype=dt) * 2 - 1).transpose(1, 2)
            return torch.rand(b, h, s, d, device="cuda", dtype=dt) * 2 - 1
        q, k, v = mk(), mk(), mk()
        flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
        for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
            try:
                with sdpa_kernel([backend]):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    ms = graph_ms(fn, a.reps, a.iters)
                print(json.dumps({"label": label, "backend": name, "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}))
            except Exception as e:  # a backend that does not take the shape
                print(json.dumps({"label": label, "backend": name, "error": str(e)[:300]}))


if __name__ == "__main__":
    main()
