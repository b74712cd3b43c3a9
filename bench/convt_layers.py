#!/usr/bin/env python3
"""Single transposed and 1-D convolution layers (each followed by its activation): tilec
against onnxruntime, and an earlier tilec build, in alternating rounds.

    .venv-bench/bin/python bench/convt_layers.py --baseline target/tilec-before \\
        --out bench/results/convt-2026-12-02

The layers are built with onnx.helper (random weights, seeded): the transposed convolutions
of UNet, DCGAN and FCN decoders and of a 1-D upsampler, and the 1-D convolutions of wav2vec2's
feature encoder and Whisper's front end. Each side is timed as bench/cpu.py times it
(onnxruntime: 2 intra-op threads, sequential, all optimizations; tilec: `tilec run --bench N
--json`, its median); per layer the rounds alternate (onnxruntime, tilec, baseline) and each
side's figure is the median of its rounds, with the load average read at that layer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from ort_time import ort_median_ms, tilec_median_ms
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent

# name, op, in channels, out channels, input spatial sizes, kernel, stride, pads (begin, end
# per axis as ONNX lists them), output padding, activation
LAYERS = [
    ("unet_ct2_k2s2", "ConvTranspose", 128, 64, [32, 32], 2, 2, 0, 0, "Relu"),
    ("dcgan_ct2_k4s2p1", "ConvTranspose", 256, 128, [8, 8], 4, 2, 1, 0, "Relu"),
    ("dcgan_first_ct2_k4s1", "ConvTranspose", 100, 512, [1, 1], 4, 1, 0, 0, "Relu"),
    ("dcgan_last_ct2_k4s2p1", "ConvTranspose", 64, 3, [32, 32], 4, 2, 1, 0, "Tanh"),
    ("fcn_ct2_k3s2p1op1", "ConvTranspose", 128, 64, [32, 32], 3, 2, 1, 1, "Relu"),
    ("ct1_k4s2p1", "ConvTranspose", 128, 64, [512], 4, 2, 1, 0, "Relu"),
    ("ct1_k16s8p4", "ConvTranspose", 256, 128, [200], 16, 8, 4, 0, "Relu"),
    ("w2v_c1_k10s5", "Conv", 1, 256, [16000], 10, 5, 0, 0, "Relu"),
    ("w2v_c1_k3s2", "Conv", 256, 256, [3199], 3, 2, 0, 0, "Relu"),
    ("whisper_c1_k3s1", "Conv", 80, 384, [1000], 3, 1, 1, 0, "Relu"),
    ("whisper_c1_k3s2", "Conv", 384, 384, [1000], 3, 2, 1, 0, "Relu"),
]


def build(layer, path: Path, rng) -> np.ndarray:
    name, op, cin, cout, size, k, s, p, op_pad, act = layer
    nd = len(size)
    wshape = [cin, cout] if op == "ConvTranspose" else [cout, cin]
    wshape += [k] * nd
    w = (rng.standard_normal(wshape) / np.sqrt(cin * k**nd)).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    attrs = dict(kernel_shape=[k] * nd, strides=[s] * nd, pads=[p] * (2 * nd))
    if op_pad:
        attrs["output_padding"] = [op_pad] * nd
    nodes = [helper.make_node(op, ["x", "w", "b"], ["c"], **attrs), helper.make_node(act, ["c"], ["y"])]
    x = rng.standard_normal([1, cin] + size).astype(np.float32)
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tilec", type=Path, default=ROOT / "target" / "release" / "tilec")
    ap.add_argument("--baseline", type=Path, help="an earlier tilec binary timed in the same rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    sides = [("tilec", args.tilec)] + ([("baseline", args.baseline)] if args.baseline else [])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layer in LAYERS:
            path = Path(tmp) / f"{layer[0]}.onnx"
            x = build(layer, path, rng)
            xfile = Path(tmp) / f"{layer[0]}.npy"
            np.save(xfile, x)
            got = {"ort": []} | {n: [] for n, _ in sides}
            for _ in range(args.rounds):
                got["ort"].append(ort_median_ms(path, {"x": x}, 2, args.runs))
                for n, b in sides:
                    # The baseline's direct nests take seconds a run: fewer runs.
                    got[n].append(tilec_median_ms(b, path, xfile, args.runs if n == "tilec" else 3))
            row = {"layer": layer[0], "load": round(os.getloadavg()[0], 2)}
            row |= {f"{k}_ms": round(statistics.median(v), 4) for k, v in got.items()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "layers.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| layer | tilec ms | baseline ms | onnxruntime ms | tilec / ort | load |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        base = r.get("baseline_ms", float("nan"))
        lines.append(f"| {r['layer']} | {r['tilec_ms']:.3f} | {base:.3f} | {r['ort_ms']:.3f} | "
                     f"{r['tilec_ms'] / r['ort_ms']:.2f} | {r['load']} |")
    (args.out / "layers.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
