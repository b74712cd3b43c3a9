#!/usr/bin/env python3
"""Export small randomly initialised transformers to ONNX, with reference data.

Run with the export venv's interpreter (see scripts/setup-export-venv.sh):

    .venv-export/bin/python scripts/gen-models.py [--out models] [--only gpt2,bert,llama]

Layout written under --out (default: <repo>/models):

  <name>/model.onnx                              weights inline (external data
                                                 `model.onnx.data` only past ~20 MB)
  <name>/meta.json                               {"rtol", "atol", "torch",
                                                 "transformers", "params"}
  <name>/test_data_set_0/input_<i>.pb, output_<i>.pb

Models are built with `transformers` from a config only (no hub download), with
weights drawn by the library's own initialisers under a fixed seed (biases and
norm scales redrawn so they are not all 0 / 1), and exported
with PyTorch's dynamo-based exporter (`torch.onnx.export(..., dynamo=True)`) at
the exporter's default opset, f32, with symbolic `batch` and `seq` dims. If the
exporter emits model-local functions they are inlined before saving.

Reference inputs are batch 2 x seq 64 token ids from a fixed-seed numpy RNG;
expected outputs come from PyTorch eager in f32 on one thread. Every exported
model is also run with onnxruntime and compared with the eager outputs; the
script fails if the difference is outside meta.json's tolerances.

Each model directory is rebuilt from scratch on every run, and the output is
byte-for-byte deterministic for fixed package versions.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import random
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
import torch
import transformers
from onnx import numpy_helper

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "models"

SEED = 0
BATCH = 2
SEQ = 64
# Bound for the symbolic sequence dim: the position tables have 128 rows.
MAX_SEQ = 128
VOCAB = 1024
RTOL = 1e-3
ATOL = 1e-4
# Extra (batch, seq) shapes the exported model is checked at with
# onnxruntime against eager, to make sure the symbolic dims really are free.
CHECK_SHAPES = [(1, 1), (3, 17), (1, MAX_SEQ)]
# Past this the weights go to `model.onnx.data` next to the model.
INLINE_LIMIT_BYTES = 20 * 1024 * 1024


def build_gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=MAX_SEQ,
        n_embd=256,
        n_layer=4,
        n_head=4,
        bos_token_id=1023,
        eos_token_id=1023,
        use_cache=False,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config)


def build_bert() -> torch.nn.Module:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=MAX_SEQ,
        attn_implementation="eager",
    )
    return transformers.BertModel(config, add_pooling_layer=False)


def build_llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=MAX_SEQ,
        use_cache=False,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(config)


def make_inputs(name: str, batch: int = BATCH, seq: int = SEQ, seed: int = SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = {"input_ids": rng.integers(0, VOCAB, size=(batch, seq), dtype=np.int64)}
    if name == "bert":
        mask = np.ones((batch, seq), dtype=np.int64)
        if batch > 1:
            mask[-1, seq - seq // 4 :] = 0  # last row: trailing quarter is padding
        inputs["attention_mask"] = mask
    return inputs


MODELS = {
    # name: (builder, input names, output names)
    "gpt2": (build_gpt2, ["input_ids"], ["logits"]),
    "bert": (build_bert, ["input_ids", "attention_mask"], ["last_hidden_state"]),
    "llama": (build_llama, ["input_ids"], ["logits"]),
}


def randomize_affine(model: torch.nn.Module) -> None:
    """Make biases and norm scales random too.

    The library initialises biases to 0 and LayerNorm/RMSNorm scales to 1,
    which would let a wrong bias or scale go unnoticed and lets the exporter
    merge the identical tensors into one initializer. Linear and embedding
    weights keep the library's N(0, 0.02) initialisation.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() != 1:
                continue
            if name.endswith("bias"):
                p.normal_(0.0, 0.02)
            else:  # 1-D weight: a LayerNorm / RMSNorm scale
                p.normal_(1.0, 0.1)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def export(module: torch.nn.Module, example: tuple[torch.Tensor, ...], input_names, output_names, dynamic: bool):
    dynamic_shapes = None
    if dynamic:
        batch = torch.export.Dim("batch", min=1, max=1024)
        seq = torch.export.Dim("seq", min=2, max=MAX_SEQ)
        dynamic_shapes = {n: {0: batch, 1: seq} for n in input_names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            example,
            dynamo=True,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes,
            optimize=True,
            verbose=False,
        )
    return program.model_proto


def op_histogram(model: onnx.ModelProto) -> collections.Counter:
    hist: collections.Counter = collections.Counter()

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            hist[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"] += 1
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    for fn in model.functions:
        for node in fn.node:
            hist[f"(fn {fn.name}) {node.op_type}"] += 1
    return hist


def describe_value(v: onnx.ValueInfoProto) -> str:
    t = v.type.tensor_type
    dims = [d.dim_param if d.HasField("dim_param") else str(d.dim_value) if d.HasField("dim_value") else "?" for d in t.shape.dim]
    return f"{v.name}: {onnx.TensorProto.DataType.Name(t.elem_type)}[{', '.join(dims)}]"


def save_model(model: onnx.ModelProto, path: Path) -> None:
    size = model.ByteSize()
    if size > INLINE_LIMIT_BYTES:
        onnx.save_model(
            model,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, path)


def ort_run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def gen(name: str, out_dir: Path) -> dict:
    builder, input_names, output_names = MODELS[name]
    seed_everything(SEED)
    module = builder().eval()
    randomize_affine(module)
    params = sum(p.numel() for p in module.parameters())

    np_inputs = make_inputs(name)
    example = tuple(torch.from_numpy(np_inputs[n]) for n in input_names)
    with torch.no_grad():
        result = module(*example)
    expected = [result[n].detach().numpy().astype(np.float32) for n in output_names]

    dynamic = True
    try:
        model = export(module, example, input_names, output_names, dynamic=True)
    except Exception as exc:  # noqa: BLE001 - fall back to a static export
        print(f"[{name}] dynamic export failed ({type(exc).__name__}: {exc}); exporting static [{BATCH}, {SEQ}]")
        dynamic = False
        model = export(module, example, input_names, output_names, dynamic=False)

    had_functions = len(model.functions)
    if had_functions:
        model = onnx.inliner.inline_local_functions(model)
        # Drop whatever is left (functions only referenced by other functions).
        del model.functions[:]
    # The exporter records Python source locations (stack traces, file paths)
    # in metadata; drop them so files do not depend on where they were built.
    strip_metadata(model)
    onnx.checker.check_model(model, full_check=True)

    model_dir = out_dir / name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    data_dir = model_dir / "test_data_set_0"
    data_dir.mkdir(parents=True)
    model_path = model_dir / "model.onnx"
    save_model(model, model_path)

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
    }
    (model_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")

    # Cross-check with onnxruntime: the saved inputs, then other shapes.
    checks = [((BATCH, SEQ), ort_run(model_path, np_inputs), expected)]
    for b, t in CHECK_SHAPES if dynamic else []:
        feeds = make_inputs(name, b, t, seed=SEED + 1)
        with torch.no_grad():
            result = module(*(torch.from_numpy(feeds[n]) for n in input_names))
        want = [result[n].detach().numpy() for n in output_names]
        checks.append(((b, t), ort_run(model_path, feeds), want))

    hist = op_histogram(model)
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    print(f"[{name}] params={params} dynamic={dynamic} local_functions={had_functions} opsets={opsets}")
    for v in model.graph.input:
        print(f"[{name}]   input  {describe_value(v)}")
    for v in model.graph.output:
        print(f"[{name}]   output {describe_value(v)}")
    all_ok = True
    for (b, t), got, want in checks:
        for n, g, e in zip(graph_outputs, got, want):
            err = float(np.max(np.abs(g - e)))
            ok = g.shape == e.shape and bool(np.allclose(g, e, rtol=RTOL, atol=ATOL))
            all_ok &= ok
            print(f"[{name}]   onnxruntime vs torch eager [{b}, {t}] {n}: max|diff|={err:.3e} ok={ok}")
    print(f"[{name}]   nodes={sum(hist.values())} ops={dict(sorted(hist.items()))}")
    if not all_ok:
        raise SystemExit(f"[{name}] onnxruntime output differs from torch eager beyond rtol={RTOL}, atol={ATOL}")
    return {"dynamic": dynamic}


def strip_metadata(model: onnx.ModelProto) -> None:
    del model.metadata_props[:]

    def clean_graph(graph: onnx.GraphProto) -> None:
        del graph.metadata_props[:]
        for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
            del vi.metadata_props[:]
        for init in graph.initializer:
            del init.metadata_props[:]
        for node in graph.node:
            del node.metadata_props[:]
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    clean_graph(attr.g)
                for g in attr.graphs:
                    clean_graph(g)

    clean_graph(model.graph)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", default=",".join(MODELS), help="comma-separated subset of: " + ", ".join(MODELS))
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
    static = [n for n in names if not gen(n, args.out)["dynamic"]]
    if static:
        print(f"note: exported with static shapes [{BATCH}, {SEQ}]: {', '.join(static)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
