#!/usr/bin/env python3
"""Export tiny transformers the way users export them: default attention (SDPA).

Run with the export venv's interpreter (see scripts/setup-export-venv.sh):

    .venv-export/bin/python scripts/gen-sdpa-models.py [--out models/sdpa] [--only gpt2,vit]

`scripts/gen-models.py` exports with transformers' `eager` attention (MatMul /
Softmax / MatMul spelled out by the model code). Users keep the library's
default, `sdpa`: `torch.nn.functional.scaled_dot_product_attention`, which the
dynamo exporter decomposes differently (K transposed through Reshape ->
Transpose -> Reshape, sqrt of the scale on Q and on K, boolean masks turned
into additive ones and an `IsNaN -> Where` guard after the softmax). Modules
built on `nn.MultiheadAttention` (torchvision's ViT) add an in-projection
followed by a select of q, k and v.

Models, all tiny (2 layers, hidden 64 or 128, random weights under seed 0, so
that each file stays well under 2 MB and can be committed):

  gpt2        GPT2LMHeadModel, causal, input_ids only
  bert        BertModel (no pooler), input_ids + attention_mask (padding)
  distilbert  DistilBertModel, input_ids + attention_mask (padding)
  llama       LlamaForCausalLM, GQA (4 query heads, 2 KV heads), input_ids only
  qwen2       Qwen2ForCausalLM, GQA (8 query heads, 2 KV heads), input_ids +
              attention_mask (causal and padding masks combined). The reference
              uses trailing padding: with left padding a padded query row sees no
              key at all, which eager PyTorch and the exported graph (its IsNaN
              guard gives zeros) answer differently; tilec's tests feed such
              masks and compare with the graph's own semantics instead.
  vit         torchvision-style ViT (nn.MultiheadAttention, packed in-projection),
              pixel_values [batch, 3, 32, 32]
  mha         a plain nn.MultiheadAttention (batch_first) used as cross-attention:
              query [batch, seq, 64], memory [batch, mem, 64] and a boolean
              key_padding_mask [batch, mem]

Layout under --out (default <repo>/models/sdpa), as for gen-models.py:

  <name>/model.onnx, <name>/meta.json, <name>/test_data_set_0/{input,output}_<i>.pb

Reference outputs come from PyTorch eager (f32, one thread); every model is
also run with onnxruntime on the reference inputs and at other shapes and
compared with eager. The export uses the same exporter settings as
gen-models.py (dynamo, default opset, symbolic batch and sequence dims).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
import torch
import transformers
from onnx import numpy_helper

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "models" / "sdpa"

_spec = importlib.util.spec_from_file_location("gen_models", REPO_ROOT / "scripts" / "gen-models.py")
gm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gm)

SEED = 0
BATCH = 2
SEQ = 32
MAX_SEQ = 64
VOCAB = 256
RTOL = 1e-3
ATOL = 1e-4
IMAGE = 32


def build_gpt2():
    c = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=MAX_SEQ, n_embd=64, n_layer=2, n_head=4,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, use_cache=False,
    )
    return transformers.GPT2LMHeadModel(c)


def build_bert():
    c = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=256, max_position_embeddings=MAX_SEQ,
    )
    return transformers.BertModel(c, add_pooling_layer=False)


def build_distilbert():
    c = transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=256,
        max_position_embeddings=MAX_SEQ,
    )
    return transformers.DistilBertModel(c)


def build_llama():
    c = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_SEQ,
        use_cache=False,
    )
    return transformers.LlamaForCausalLM(c)


def build_qwen2():
    c = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=MAX_SEQ,
        use_cache=False, tie_word_embeddings=True,
    )
    return transformers.Qwen2ForCausalLM(c)


class EncoderBlock(torch.nn.Module):
    """torchvision.models.vision_transformer.EncoderBlock, minus dropout."""

    def __init__(self, heads: int, hidden: int, mlp: int):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(hidden, eps=1e-6)
        self.self_attention = torch.nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.ln_2 = torch.nn.LayerNorm(hidden, eps=1e-6)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(hidden, mlp), torch.nn.GELU(), torch.nn.Linear(mlp, hidden))

    def forward(self, x):
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class TinyViT(torch.nn.Module):
    """torchvision's VisionTransformer structure (conv patchify, class token, learned
    positions, pre-norm encoder blocks on nn.MultiheadAttention, linear head)."""

    def __init__(self, image=IMAGE, patch=8, layers=2, heads=4, hidden=64, mlp=256, classes=10):
        super().__init__()
        self.patch = patch
        self.conv_proj = torch.nn.Conv2d(3, hidden, kernel_size=patch, stride=patch)
        n = (image // patch) ** 2 + 1
        self.class_token = torch.nn.Parameter(torch.zeros(1, 1, hidden))
        self.pos_embedding = torch.nn.Parameter(torch.empty(1, n, hidden).normal_(std=0.02))
        self.layers = torch.nn.Sequential(*[EncoderBlock(heads, hidden, mlp) for _ in range(layers)])
        self.ln = torch.nn.LayerNorm(hidden, eps=1e-6)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, pixel_values):
        x = self.conv_proj(pixel_values)
        x = x.flatten(2).transpose(1, 2)
        cls = self.class_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embedding
        x = self.ln(self.layers(x))
        return self.head(x[:, 0])


class CrossMHA(torch.nn.Module):
    """A plain nn.MultiheadAttention as cross-attention with a key padding mask."""

    def __init__(self, hidden=64, heads=4):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(hidden, heads, batch_first=True)

    def forward(self, query, memory, key_padding_mask):
        y, _ = self.attn(query, memory, memory, key_padding_mask=key_padding_mask, need_weights=False)
        return y


def build_vit():
    m = TinyViT()
    with torch.no_grad():
        m.class_token.normal_(std=0.02)
    return m


def build_mha():
    return CrossMHA()


# name: (builder, input names, output names, dynamic dims per input, layers)
MODELS = {
    "gpt2": (build_gpt2, ["input_ids"], ["logits"], {"input_ids": ("batch", "seq")}, 2),
    "bert": (build_bert, ["input_ids", "attention_mask"], ["last_hidden_state"],
             {"input_ids": ("batch", "seq"), "attention_mask": ("batch", "seq")}, 2),
    "distilbert": (build_distilbert, ["input_ids", "attention_mask"], ["last_hidden_state"],
                   {"input_ids": ("batch", "seq"), "attention_mask": ("batch", "seq")}, 2),
    "llama": (build_llama, ["input_ids"], ["logits"], {"input_ids": ("batch", "seq")}, 2),
    "qwen2": (build_qwen2, ["input_ids", "attention_mask"], ["logits"],
              {"input_ids": ("batch", "seq"), "attention_mask": ("batch", "seq")}, 2),
    "vit": (build_vit, ["pixel_values"], ["logits"], {"pixel_values": ("batch",)}, 2),
    "mha": (build_mha, ["query", "memory", "key_padding_mask"], ["output"],
            {"query": ("batch", "seq"), "memory": ("batch", "mem"), "key_padding_mask": ("batch", "mem")}, 1),
}


def make_inputs(name: str, batch: int = BATCH, seq: int = SEQ, seed: int = SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "vit":
        return {"pixel_values": rng.standard_normal((batch, 3, IMAGE, IMAGE)).astype(np.float32)}
    if name == "mha":
        mem = seq + 8 if seq + 8 <= MAX_SEQ else seq - 1
        pad = np.zeros((batch, mem), dtype=bool)
        if batch > 1:
            pad[-1, mem - mem // 4:] = True  # last row: trailing quarter is padding
        return {
            "query": rng.standard_normal((batch, seq, 64)).astype(np.float32),
            "memory": rng.standard_normal((batch, mem, 64)).astype(np.float32),
            "key_padding_mask": pad,
        }
    inputs = {"input_ids": rng.integers(0, VOCAB, size=(batch, seq), dtype=np.int64)}
    if name in ("bert", "distilbert", "qwen2"):
        mask = np.ones((batch, seq), dtype=np.int64)
        if batch > 1:
            mask[-1, seq - seq // 4:] = 0  # last row: trailing quarter is padding
        inputs["attention_mask"] = mask
    return inputs


def outputs_of(name: str, result) -> list[torch.Tensor]:
    _, _, output_names, _, _ = MODELS[name]
    if isinstance(result, torch.Tensor):
        return [result]
    return [result[n] for n in output_names]


def export(module, example, input_names, output_names, dyn: dict[str, tuple[str, ...]]):
    dims = {
        "batch": torch.export.Dim("batch", min=1, max=1024),
        "seq": torch.export.Dim("seq", min=2, max=MAX_SEQ),
        "mem": torch.export.Dim("mem", min=2, max=MAX_SEQ),
    }
    dynamic_shapes = {n: {i: dims[d] for i, d in enumerate(dyn[n])} for n in input_names}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module, example, dynamo=True, input_names=input_names, output_names=output_names,
            dynamic_shapes=dynamic_shapes, optimize=True, verbose=False,
        )
    return program.model_proto


def gen(name: str, out_dir: Path) -> None:
    builder, input_names, output_names, dyn, layers = MODELS[name]
    gm.seed_everything(SEED)
    module = builder().eval()
    gm.randomize_affine(module)
    params = sum(p.numel() for p in module.parameters())
    impl = getattr(getattr(module, "config", None), "_attn_implementation", "nn.MultiheadAttention / sdpa")

    np_inputs = make_inputs(name)
    example = tuple(torch.from_numpy(np_inputs[n]) for n in input_names)
    with torch.no_grad():
        expected = [t.detach().numpy().astype(np.float32) for t in outputs_of(name, module(*example))]

    model = export(module, example, input_names, output_names, dyn)
    if len(model.functions):
        model = onnx.inliner.inline_local_functions(model)
        del model.functions[:]
    gm.strip_metadata(model)
    onnx.checker.check_model(model, full_check=True)

    model_dir = out_dir / name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    data_dir = model_dir / "test_data_set_0"
    data_dir.mkdir(parents=True)
    model_path = model_dir / "model.onnx"
    onnx.save_model(model, model_path)

    graph_inputs = [i.name for i in model.graph.input]
    graph_outputs = [o.name for o in model.graph.output]
    assert graph_inputs == input_names, graph_inputs
    assert graph_outputs == output_names, graph_outputs
    for i, n in enumerate(graph_inputs):
        (data_dir / f"input_{i}.pb").write_bytes(numpy_helper.from_array(np_inputs[n], n).SerializeToString())
    for i, n in enumerate(graph_outputs):
        (data_dir / f"output_{i}.pb").write_bytes(numpy_helper.from_array(expected[i], n).SerializeToString())
    meta = {
        "rtol": RTOL,
        "atol": ATOL,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "params": params,
        "layers": layers,
        "attention": impl,
    }
    (model_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")

    checks = [((BATCH, SEQ), gm.ort_run(model_path, np_inputs), expected)]
    shapes = [(1, 1 if name != "mha" else 2), (3, 17), (1, MAX_SEQ)]
    for b, t in shapes:
        feeds = make_inputs(name, b, t, seed=SEED + 1)
        with torch.no_grad():
            want = [x.numpy() for x in outputs_of(name, module(*(torch.from_numpy(feeds[n]) for n in input_names)))]
        checks.append(((b, t), gm.ort_run(model_path, feeds), want))

    hist = gm.op_histogram(model)
    size = model_path.stat().st_size
    print(f"[{name}] params={params} attention={impl} bytes={size}")
    for v in model.graph.input:
        print(f"[{name}]   input  {gm.describe_value(v)}")
    ok_all = True
    for (b, t), got, want in checks:
        for n, g, e in zip(graph_outputs, got, want):
            err = float(np.max(np.abs(g - e)))
            ok = g.shape == e.shape and bool(np.allclose(g, e, rtol=RTOL, atol=ATOL))
            ok_all &= ok
            print(f"[{name}]   onnxruntime vs torch eager [{b}, {t}] {n}: max|diff|={err:.3e} ok={ok}")
    print(f"[{name}]   nodes={sum(hist.values())} ops={dict(sorted(hist.items()))}")
    if not ok_all:
        raise SystemExit(f"[{name}] onnxruntime output differs from torch eager")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", default=",".join(MODELS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    names = [n for n in args.only.split(",") if n]
    for n in names:
        if n not in MODELS:
            ap.error(f"unknown model {n!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    for n in names:
        gen(n, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
