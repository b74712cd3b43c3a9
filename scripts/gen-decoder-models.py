#!/usr/bin/env python3
"""Export tiny decoder-only transformers for `tilec generate`, with random weights.

Run with the export venv's interpreter (see scripts/setup-export-venv.sh):

    .venv-export/bin/python scripts/gen-decoder-models.py [--out models/decoder]

Writes, under --out (default: <repo>/models/decoder):

  llama-nopast/model.onnx   LLaMA-style: RMSNorm, RoPE, GQA (4 query, 2 KV heads), SwiGLU
  llama-past/model.onnx     the same weights, with past key/value inputs
  gpt2-nopast/model.onnx    GPT-2-style: LayerNorm, learned positions, fused QKV, GELU (tanh),
                            tied LM head
  gpt2-past/model.onnx      the same weights, with past key/value inputs
  <name>/meta.json          the config and the parameter count

Inputs: `input_ids` and `position_ids` (i64 [batch, seq]); the `past` models also take
`past_key_<l>` and `past_value_<l>` (f32 [batch, kv_heads, past, head_dim]) per layer and
return `present_key_<l>`/`present_value_<l>` (the past with the new tokens appended) after
`logits` (f32 [batch, seq, vocab]). Attention is written out as eager PyTorch does it: two
matrix products around a softmax, the causal mask a `where(keep, scores, -inf)` built from
the positions of queries and keys. The modules are plain PyTorch (no `transformers`), so the
export is the same for every version of the library.

Each export is checked with onnxruntime against eager PyTorch, the past form also against
the no-past form on the concatenated sequence.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "models" / "decoder"
SEED = 0
MAX_POS = 64

LLAMA = dict(vocab=128, hidden=64, layers=2, heads=4, kv_heads=2, inter=128, theta=10000.0, eps=1e-6)
GPT2 = dict(vocab=128, hidden=64, layers=2, heads=4, inter=128, positions=MAX_POS, eps=1e-5)


def causal_keep(s: int, t: int, device=None) -> torch.Tensor:
    """keep[i, j]: query i (the last `s` of `t` positions) sees key j."""
    q = torch.arange(s, device=device) + (t - s)
    k = torch.arange(t, device=device)
    return k[None, :] <= q[:, None]


def attend(q, k, v, scale):
    """q [b, h, s, d], k/v [b, h, t, d] (heads already repeated)."""
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    keep = causal_keep(q.shape[2], k.shape[2])
    scores = torch.where(keep, scores, torch.tensor(float("-inf")))
    p = torch.softmax(scores, dim=-1)
    return torch.matmul(p, v)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, nh, nkv = c["hidden"], c["heads"], c["kv_heads"]
        self.nh, self.nkv, self.hd = nh, nkv, h // nh
        self.q = nn.Linear(h, nh * self.hd, bias=False)
        self.k = nn.Linear(h, nkv * self.hd, bias=False)
        self.v = nn.Linear(h, nkv * self.hd, bias=False)
        self.o = nn.Linear(nh * self.hd, h, bias=False)
        self.gate = nn.Linear(h, c["inter"], bias=False)
        self.up = nn.Linear(h, c["inter"], bias=False)
        self.down = nn.Linear(c["inter"], h, bias=False)
        self.ln1 = RMSNorm(h, c["eps"])
        self.ln2 = RMSNorm(h, c["eps"])

    def forward(self, x, cos, sin, past):
        b, s, _ = x.shape
        y = self.ln1(x)
        q = self.q(y).view(b, s, self.nh, self.hd).transpose(1, 2)
        k = self.k(y).view(b, s, self.nkv, self.hd).transpose(1, 2)
        v = self.v(y).view(b, s, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        present = (k, v)
        rep = self.nh // self.nkv
        t = k.shape[2]
        kr = k[:, :, None].expand(b, self.nkv, rep, t, self.hd).reshape(b, self.nh, t, self.hd)
        vr = v[:, :, None].expand(b, self.nkv, rep, t, self.hd).reshape(b, self.nh, t, self.hd)
        a = attend(q, kr, vr, 1.0 / math.sqrt(self.hd))
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        y = self.ln2(x)
        x = x + self.down(F.silu(self.gate(y)) * self.up(y))
        return x, present


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(LlamaLayer(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"], c["eps"])
        self.head = nn.Linear(c["hidden"], c["vocab"], bias=False)
        hd = c["hidden"] // c["heads"]
        inv = 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, input_ids, position_ids, *past):
        x = self.embed(input_ids)
        f = position_ids[:, :, None].float() * self.inv_freq[None, None, :]
        emb = torch.cat((f, f), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        presents = []
        for i, layer in enumerate(self.layers):
            x, pr = layer(x, cos, sin, (past[2 * i], past[2 * i + 1]) if past else None)
            presents += pr
        logits = self.head(self.norm(x))
        return (logits, *presents) if past else logits


class Gpt2Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden"]
        self.nh, self.hd = c["heads"], h // c["heads"]
        self.ln1 = nn.LayerNorm(h, eps=c["eps"])
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h, eps=c["eps"])
        self.fc = nn.Linear(h, c["inter"])
        self.out = nn.Linear(c["inter"], h)

    def forward(self, x, past):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q = q.view(b, s, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, s, self.nh, self.hd).transpose(1, 2)
        v = v.view(b, s, self.nh, self.hd).transpose(1, 2)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        a = attend(q, k, v, 1.0 / math.sqrt(self.hd))
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        x = x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x, (k, v)


class Gpt2(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c["vocab"], c["hidden"])
        self.wpe = nn.Embedding(c["positions"], c["hidden"])
        self.layers = nn.ModuleList(Gpt2Layer(c) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(c["hidden"], eps=c["eps"])

    def forward(self, input_ids, position_ids, *past):
        x = self.wte(input_ids) + self.wpe(position_ids)
        presents = []
        for i, layer in enumerate(self.layers):
            x, pr = layer(x, (past[2 * i], past[2 * i + 1]) if past else None)
            presents += pr
        logits = torch.matmul(self.ln_f(x), self.wte.weight.t())
        return (logits, *presents) if past else logits


def randomize(m: nn.Module) -> None:
    """Weights N(0, 0.2), embeddings N(0, 0.5), biases and norm scales random too: the layers
    weigh as much as the embeddings (the continuation depends on the context, not just the last
    token) and the logits spread over several units, so a greedy choice is never a near tie."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1:
                if name.endswith("bias"):
                    p.normal_(0.0, 0.1)
                else:
                    p.uniform_(0.8, 1.2)
            elif "embed" in name or "wte" in name or "wpe" in name:
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.2)


def export(module, example, input_names, output_names, dyn):
    dims = {
        "batch": torch.export.Dim("batch", min=1, max=256),
        "seq": torch.export.Dim("seq", min=1, max=MAX_POS),
        "past": torch.export.Dim("past", min=1, max=MAX_POS),
    }
    spec = {n: {i: dims[d] for i, d in dyn[n].items()} for n in input_names}
    # forward(input_ids, position_ids, *past): the past tensors are one argument to torch.export.
    dynamic_shapes = {"input_ids": spec["input_ids"], "position_ids": spec["position_ids"]}
    past = tuple(spec[n] for n in input_names[2:])
    if past:
        dynamic_shapes["past"] = past
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module, example, dynamo=True, input_names=input_names, output_names=output_names,
            dynamic_shapes=dynamic_shapes, optimize=True, verbose=False,
        )
    model = program.model_proto
    if len(model.functions):
        model = onnx.inliner.inline_local_functions(model)
        del model.functions[:]
    del model.metadata_props[:]
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        del vi.metadata_props[:]
    for init in model.graph.initializer:
        del init.metadata_props[:]
    for node in model.graph.node:
        del node.metadata_props[:]
    model.producer_version = ""
    onnx.checker.check_model(model, full_check=True)
    return model


def check_ort(model: onnx.ModelProto, feeds: dict, expected: list) -> None:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4)


def gen(arch: str, out: Path) -> None:
    torch.manual_seed(SEED)
    c = LLAMA if arch == "llama" else GPT2
    module = (Llama if arch == "llama" else Gpt2)(c).eval()
    randomize(module)
    params = sum(p.numel() for p in module.parameters())
    kvh = c.get("kv_heads", c["heads"])
    hd = c["hidden"] // c["heads"]
    rng = np.random.default_rng(SEED)
    b, s, p = 2, 5, 3
    ids = torch.from_numpy(rng.integers(0, c["vocab"], (b, p + s), dtype=np.int64))
    pos = torch.arange(p + s, dtype=torch.int64)[None].expand(b, p + s).contiguous()
    layers = c["layers"]

    # Without past: the whole sequence.
    names_in = ["input_ids", "position_ids"]
    with torch.no_grad():
        full = module(ids, pos)
    model = export(module, (ids, pos), names_in, ["logits"], {n: {0: "batch", 1: "seq"} for n in names_in})
    check_ort(model, {"input_ids": ids.numpy(), "position_ids": pos.numpy()}, [full.numpy()])
    save(model, out / f"{arch}-nopast", c, params, past=False)

    # With past: the last `s` tokens after a past of `p`.
    with torch.no_grad():
        _, *pres = module(ids[:, :p], pos[:, :p], *[torch.zeros(b, kvh, 0, hd)] * (2 * layers))
        past = [t.contiguous() for t in pres]
        outs = module(ids[:, p:].contiguous(), pos[:, p:].contiguous(), *past)
    np.testing.assert_allclose(outs[0].numpy(), full[:, p:].numpy(), rtol=1e-4, atol=1e-4)
    past_names = [f"past_{kv}_{l}" for l in range(layers) for kv in ("key", "value")]
    out_names = ["logits"] + [f"present_{kv}_{l}" for l in range(layers) for kv in ("key", "value")]
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "position_ids": {0: "batch", 1: "seq"}}
    dyn.update({n: {0: "batch", 2: "past"} for n in past_names})
    example = (ids[:, p:].contiguous(), pos[:, p:].contiguous(), *past)
    model = export(module, example, names_in + past_names, out_names, dyn)
    feeds = {"input_ids": example[0].numpy(), "position_ids": example[1].numpy()}
    feeds.update({n: t.numpy() for n, t in zip(past_names, past)})
    check_ort(model, feeds, [t.numpy() for t in outs])
    save(model, out / f"{arch}-past", c, params, past=True)

    # A greedy continuation, to see that it depends on the context.
    seq = ids[:1, :4]
    with torch.no_grad():
        for _ in range(12):
            n = seq.shape[1]
            logits = module(seq, torch.arange(n)[None])
            top2 = logits[0, -1].topk(2).values
            seq = torch.cat([seq, logits[0, -1].argmax().view(1, 1)], dim=1)
    print(f"{arch}: greedy {seq[0].tolist()}, last gap between the top two logits {float(top2[0] - top2[1]):.3f}")


def save(model: onnx.ModelProto, d: Path, c: dict, params: int, past: bool) -> None:
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    onnx.save(model, d / "model.onnx")
    meta = dict(config=c, params=params, past=past, max_positions=MAX_POS, torch=torch.__version__)
    (d / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"{d}: {params} parameters, {(d / 'model.onnx').stat().st_size} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", default="llama,gpt2")
    a = ap.parse_args()
    torch.set_num_threads(1)
    for arch in a.only.split(","):
        gen(arch, a.out)


if __name__ == "__main__":
    main()
