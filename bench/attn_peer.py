"""Peers for tilec's FlashAttention benchmark (crates/tilec-cuda/examples/attn_bench.rs, phase
`bench`), on the same labels and shapes: PyTorch's scaled_dot_product_attention restricted to
one backend at a time with torch.nn.attention.sdpa_kernel, the flash backend (FlashAttention-2)
and the cuDNN backend. Q, K and V are [b, h, s, d] tensors (GPT-2's as the QKV projection
leaves them: [b, s, h, d] transposed, a view), random in [-1, 1).
Prints one JSON object per line: label, backend, ms (median over CUDA events of a CUDA graph of
`--reps` calls, per call), tflops (4*b*h*sq*sk*d, halved when causal), or error when the backend
does not run the shape.
Decode labels (attn_decode_*, the paged decode step of attn_bench): one query per sequence
against 8192 keys, K and V contiguous [b, h_kv, s, d] tensors (the usual layout; GQA through
enable_gqa, no repeated heads), PyTorch's default dispatch and each backend that takes it,
reported in TB/s of K and V bytes read; and a device-to-device copy of 4 GiB (TB/s of bytes
read plus written), the bandwidth a decode kernel can hope for.
usage: python3 bench/attn_peer.py [--iters 20] [--reps 10] [--only SUBSTRING]"""
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

DECODE = [
    # label, b, h_q, h_kv, keys, d, dtype
    ("attn_decode_bf16_b32h32kv8192d128", 32, 32, 32, 8192, 128, torch.bfloat16),
    ("attn_decode_gqa_bf16_b32h32g8kv8192d128", 32, 32, 8, 8192, 128, torch.bfloat16),
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
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}))
    for label, b, h, s, d, dt, causal, bshd in [c for c in CASES if a.only in c[0]]:
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

    decode(a)


def decode(a):
    backends = [("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)]
    for label, b, hq, hkv, s, d, dt in [c for c in DECODE if a.only in c[0]]:
        q = torch.rand(b, hq, 1, d, device="cuda", dtype=dt) * 2 - 1
        k = torch.rand(b, hkv, s, d, device="cuda", dtype=dt) * 2 - 1
        v = torch.rand(b, hkv, s, d, device="cuda", dtype=dt) * 2 - 1
        kv_bytes = 2.0 * b * hkv * s * d * k.element_size()
        gqa = {"enable_gqa": True} if hq != hkv else {}
        for name, backend in backends:
            try:
                fn = lambda: F.scaled_dot_product_attention(q, k, v, **gqa)
                if backend is None:
                    ms = graph_ms(fn, a.reps, a.iters)
                else:
                    with sdpa_kernel([backend]):
                        ms = graph_ms(fn, a.reps, a.iters)
                print(json.dumps({"label": label, "backend": name, "ms": ms, "us": ms * 1e3, "kv_gb": kv_bytes / 1e9,
                                  "tbps": kv_bytes / (ms * 1e-3) / 1e12}))
            except Exception as e:  # a backend that does not take the shape
                print(json.dumps({"label": label, "backend": name, "error": str(e)[:300]}))
        del q, k, v
        torch.cuda.empty_cache()
    if a.only == "" or a.only in "attn_decode_copy_4gib":
        n = 4 << 30
        src = torch.empty(n, device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        ms = graph_ms(lambda: dst.copy_(src), 1, a.iters)
        print(json.dumps({"label": "attn_decode_copy_4gib", "backend": "copy_", "ms": ms, "tbps": 2.0 * n / (ms * 1e-3) / 1e12}))


if __name__ == "__main__":
    main()
