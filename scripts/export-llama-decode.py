#!/usr/bin/env python3
"""Export a LLaMA-style decoder from a transformers LlamaConfig, with random weights, for
`tilec generate`.

    python3 scripts/export-llama-decode.py WORK [--config 1b|tiny] [--device cuda|cpu] [--tied]

Builds `transformers.LlamaForCausalLM` from its config with random weights (the library's own
initialization under a fixed seed) in bf16 and writes, under WORK:

  hf/            the transformers checkpoint (save_pretrained), which the peer loads
  onnx/model.onnx (+ model.onnx.data)   the same weights as a decoder-only ONNX model with
                 inputs `input_ids` and `position_ids` (i64 [batch, seq], both symbolic) and
                 output `logits` (f32 [batch, seq, vocab]), without past key/value inputs
  prompts.json   the prompts (16 of 128 token ids, fixed seed) and the config

With --test-model (a model for tilec's tests): weights spread wider (see randomize), only
WORK/model.onnx (no external data), its f32 twin WORK/model-f32.onnx (the same weights widened,
every op in f32) and WORK/meta.json.

The ONNX model is not transformers' module exported as is (its export depends on the library's
version: caches, mask helpers) but a plain PyTorch module with the same arithmetic, loaded with
the checkpoint's weights: RMSNorm in f32 between casts, RoPE with cos/sin computed in f32 and
rounded to bf16, grouped-query attention with the KV heads repeated by expand/reshape and a
causal `where(keep, scores, -inf)`, SwiGLU, the LM head (tied to the embedding with --tied).
One difference from transformers' eager attention: the softmax runs on the bf16 scores (its
output rounded to bf16), not on f32 scores. Linear weights are stored transposed ([in, out]) so
that the graph reads them as they are. The export is checked against transformers' logits on a
short prompt (rel. error printed: bf16 alone gives about 1e-2 at 2 layers and 2e-2 at 22 (on
the CPU); a wrong architecture gives errors of order 1, and the export fails above 0.25).

Configs: `1b` is the 1.1B TinyLlama shape (hidden 2048, 22 layers, 32 query / 4 KV heads of
64, MLP 5632, vocab 32000, untied head); `tiny` the same architecture at hidden 256, 2 layers,
8 / 2 heads, MLP 512, vocab 1000 (for the CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SEED = 0
PROMPTS, PROMPT_LEN = 16, 128
CONFIGS = {
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=1000),
    "test": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128),
}


def llama_config(name: str, tied: bool):
    import transformers

    return transformers.LlamaConfig(
        **CONFIGS[name], max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=tied, attention_bias=False, mlp_bias=False, bos_token_id=1,
        eos_token_id=2, pad_token_id=0,
    )


class RMSNorm(nn.Module):
    def __init__(self, w: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(w.clone(), requires_grad=False)
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dt)


def weight_t(w: torch.Tensor) -> nn.Parameter:
    """A Linear weight [out, in] stored as [in, out]: `x @ w`."""
    return nn.Parameter(w.t().contiguous(), requires_grad=False)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def causal_keep(s: int, t: int, device) -> torch.Tensor:
    """keep[i, j]: query i (the last `s` of `t` positions) sees key j."""
    q = torch.arange(s, device=device) + (t - s)
    k = torch.arange(t, device=device)
    return k[None, :] <= q[:, None]


class Layer(nn.Module):
    def __init__(self, sd: dict, p: str, c):
        super().__init__()
        self.nh, self.nkv = c.num_attention_heads, c.num_key_value_heads
        self.hd = c.hidden_size // self.nh
        for n in ("q", "k", "v", "o"):
            setattr(self, n, weight_t(sd[f"{p}self_attn.{n}_proj.weight"]))
        for n in ("gate", "up", "down"):
            setattr(self, n, weight_t(sd[f"{p}mlp.{n}_proj.weight"]))
        self.ln1 = RMSNorm(sd[f"{p}input_layernorm.weight"], c.rms_norm_eps)
        self.ln2 = RMSNorm(sd[f"{p}post_attention_layernorm.weight"], c.rms_norm_eps)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        y = self.ln1(x)
        q = (y @ self.q).view(b, s, self.nh, self.hd).transpose(1, 2)
        k = (y @ self.k).view(b, s, self.nkv, self.hd).transpose(1, 2)
        v = (y @ self.v).view(b, s, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k[:, :, None].expand(b, self.nkv, rep, s, self.hd).reshape(b, self.nh, s, self.hd)
        v = v[:, :, None].expand(b, self.nkv, rep, s, self.hd).reshape(b, self.nh, s, self.hd)
        scores = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(self.hd))
        keep = causal_keep(s, s, scores.device)
        scores = torch.where(keep, scores, torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device))
        a = torch.matmul(torch.softmax(scores, dim=-1), v)
        x = x + a.transpose(1, 2).reshape(b, s, self.nh * self.hd) @ self.o
        y = self.ln2(x)
        return x + (F.silu(y @ self.gate) * (y @ self.up)) @ self.down


class Decoder(nn.Module):
    """transformers' LlamaForCausalLM arithmetic, from its state dict."""

    def __init__(self, hf):
        super().__init__()
        c = hf.config
        sd = {k: v.detach().to("cpu") for k, v in hf.state_dict().items()}
        self.embed = nn.Parameter(sd["model.embed_tokens.weight"].clone(), requires_grad=False)
        self.layers = nn.ModuleList(Layer(sd, f"model.layers.{i}.", c) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(sd["model.norm.weight"], c.rms_norm_eps)
        self.tied = c.tie_word_embeddings
        if not self.tied:
            self.head = weight_t(sd["lm_head.weight"])
        self.register_buffer("inv_freq", hf.model.rotary_emb.inv_freq.detach().float().cpu().clone(), persistent=False)

    def forward(self, input_ids, position_ids):
        x = F.embedding(input_ids, self.embed)
        f = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((f, f), dim=-1)
        cos, sin = emb.cos().to(x.dtype)[:, None], emb.sin().to(x.dtype)[:, None]
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        logits = x @ self.embed.t() if self.tied else x @ self.head
        return logits.float()


def randomize(m: nn.Module) -> None:
    """Weights N(0, 0.2), the embedding N(0, 0.5), norm scales U(0.8, 1.2) (as
    scripts/gen-decoder-models.py does): logits spread over several units, so that a greedy
    choice is not a near tie that bf16 rounding could flip."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.8, 1.2)
            elif "embed" in name:
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.2)


def export(module: nn.Module, path: Path, vocab: int, external: bool = True) -> None:
    b, s = 2, 8
    ids = torch.arange(b * s, dtype=torch.int64).view(b, s) % vocab
    pos = torch.arange(s, dtype=torch.int64)[None].expand(b, s).contiguous()
    batch, seq = torch.export.Dim("batch", min=1, max=256), torch.export.Dim("seq", min=1, max=2048)
    dyn = {"input_ids": {0: batch, 1: seq}, "position_ids": {0: batch, 1: seq}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, (ids, pos), dynamo=True, input_names=["input_ids", "position_ids"],
                                    output_names=["logits"], dynamic_shapes=dyn, optimize=True, verbose=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    for f in path.parent.iterdir():
        f.unlink()
    program.save(str(path), external_data=external)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="1b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tied", action="store_true", help="tie the LM head to the embedding")
    ap.add_argument("--test-model", action="store_true", help="a model for tilec's tests (see above)")
    a = ap.parse_args()
    import transformers

    t0 = time.time()
    work = a.work
    work.mkdir(parents=True, exist_ok=True)
    cfg = llama_config(a.config, a.tied)
    torch.manual_seed(SEED)
    with torch.device(a.device):
        hf = transformers.LlamaForCausalLM(cfg)
    if a.test_model:
        randomize(hf)
    hf = hf.to(torch.bfloat16).eval()
    params = sum(p.numel() for p in hf.parameters())
    if not a.test_model:
        hf.save_pretrained(work / "hf")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {params} parameters on {a.device} "
          f"({time.time() - t0:.1f} s)", flush=True)

    rng = np.random.default_rng(SEED)
    prompts = rng.integers(3, cfg.vocab_size, (PROMPTS, PROMPT_LEN)).tolist()
    meta = dict(config=a.config, tied=a.tied, params=params, seed=SEED, prompts=prompts,
                hidden=cfg.hidden_size, layers=cfg.num_hidden_layers, heads=cfg.num_attention_heads,
                kv_heads=cfg.num_key_value_heads, inter=cfg.intermediate_size, vocab=cfg.vocab_size)
    if a.test_model:
        meta = dict(config=CONFIGS[a.config], tied=a.tied, params=params, seed=SEED, dtype="bf16",
                    torch=torch.__version__, transformers=transformers.__version__)
        (work / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    else:
        (work / "prompts.json").write_text(json.dumps(meta) + "\n")

    dec = Decoder(hf).eval()
    # The plain module against transformers on a short prompt (both in bf16 on the device).
    ids = torch.tensor(prompts[:2], device=a.device)[:, :16]
    pos = torch.arange(16, device=a.device)[None].expand(2, 16)
    with torch.no_grad():
        want = hf(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
        got = dec.to(a.device)(ids, pos)
    dec = dec.to("cpu")
    rel = float((got - want).norm() / want.norm())
    print(f"plain module vs transformers: logits rel. error {rel:.2e}", flush=True)
    if not rel < 0.25:
        raise SystemExit(f"the plain module does not compute transformers' logits (rel. error {rel:.2e})")
    del hf
    t1 = time.time()
    if a.test_model:
        tmp = work / "onnx-tmp" / "model.onnx"
        export(dec, tmp, cfg.vocab_size, external=False)
        tmp.replace(work / "model.onnx")
        # Its f32 twin (the same bf16 weights widened, every op in f32): the tests' yardstick
        # for how far bf16 rounding alone moves the logits.
        export(dec.float(), tmp, cfg.vocab_size, external=False)
        tmp.replace(work / "model-f32.onnx")
        tmp.parent.rmdir()
        print(f"exported {work / 'model.onnx'}", flush=True)
        return
    export(dec, work / "onnx" / "model.onnx", cfg.vocab_size)
    size = sum(f.stat().st_size for f in (work / "onnx").iterdir())
    print(f"exported {work / 'onnx' / 'model.onnx'}: {size / 1e6:.1f} MB in {time.time() - t1:.1f} s "
          f"(total {time.time() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
