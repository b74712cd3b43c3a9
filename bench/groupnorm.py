#!/usr/bin/env python3
"""Group and instance normalization layers on the CPU: tilec against onnxruntime, and an
earlier tilec build, in alternating rounds.

    .venv-bench/bin/python bench/groupnorm.py --baseline target/tilec-before \\
        --out bench/results/zoo-2026-12-02f/groupnorm

The layers are built with onnx.helper (random weights, seeded) in the two forms a group norm
reaches an ONNX file in:

- `decomposed`: what PyTorch's exporter writes for `nn.GroupNorm` — Reshape to
  `[N, G, -1]`, InstanceNormalization with unit scale and zero bias, Reshape back, then the
  per-channel affine as Mul and Add (when the groups are the channels, the reshapes vanish);
- `native`: one GroupNormalization node (opset 21, per-channel scale and bias).

Each is followed by its activation (SiLU as Sigmoid and Mul, or GELU as the erf formula) and,
for wav2vec2, preceded by its first convolution. Each side is timed as bench/cpu.py times it
(onnxruntime: 2 intra-op threads, sequential, all optimizations; tilec: `tilec run --bench N
--json`, its median); per layer the rounds alternate and each side's figure is the median of
its rounds, with the load average read at that layer.
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
from onnx import TensorProto, helper, numpy_helper
from ort_time import ort_median_ms, tilec_median_ms

ROOT = Path(__file__).resolve().parent.parent

# name, form, channels, groups, spatial sizes, activation, first conv (kernel, stride) or None
LAYERS = [
    ("w2v_conv_gn_gelu", "decomposed", 256, 256, [16000], "gelu", (10, 5)),
    ("unet_gn32_silu_64x64x128", "decomposed", 128, 32, [64, 64], "silu", None),
    ("unet_gn32_silu_32x32x256", "decomposed", 256, 32, [32, 32], "silu", None),
    ("unet_gn32_silu_16x16x512", "decomposed", 512, 32, [16, 16], "silu", None),
    ("unet_gn32_silu_8x8x512", "decomposed", 512, 32, [8, 8], "silu", None),
    ("native_gn32_silu_32x32x256", "native", 256, 32, [32, 32], "silu", None),
    ("native_gn6_silu_ragged_24x24x96", "native", 96, 6, [24, 24], "silu", None),
]


def build(layer, path: Path, rng) -> np.ndarray:
    name, form, c, g, size, act, conv = layer
    inits, nodes = [], []

    def const(n, a):
        inits.append(numpy_helper.from_array(np.asarray(a), n))
        return n

    if conv:
        k, s = conv
        x = rng.standard_normal([1, 1] + size).astype(np.float32)
        w = (rng.standard_normal([c, 1, k]) / np.sqrt(k)).astype(np.float32)
        nodes.append(helper.make_node("Conv", ["x", const("cw", w)], ["h"], kernel_shape=[k], strides=[s]))
        out_size = [(size[0] - k) // s + 1]
    else:
        x = rng.standard_normal([1, c] + size).astype(np.float32)
        nodes.append(helper.make_node("Identity", ["x"], ["h"]))
        out_size = size
    gamma = (1.0 + 0.2 * rng.standard_normal(c)).astype(np.float32)
    beta = (0.2 * rng.standard_normal(c)).astype(np.float32)
    if form == "decomposed":
        bshape = [c] + [1] * len(out_size)
        src = "h"
        if g != c:
            nodes.append(helper.make_node("Reshape", ["h", const("gshape", np.array([1, g, -1], np.int64))], ["hg"]))
            src = "hg"
        nodes.append(helper.make_node("InstanceNormalization",
                                      [src, const("ones", np.ones(g, np.float32)), const("zeros", np.zeros(g, np.float32))],
                                      ["in"], epsilon=1e-5))
        src = "in"
        if g != c:
            nodes.append(helper.make_node("Reshape", ["in", const("cshape", np.array([1, c] + out_size, np.int64))], ["inr"]))
            src = "inr"
        nodes.append(helper.make_node("Mul", [src, const("gamma", gamma.reshape(bshape))], ["sc"]))
        nodes.append(helper.make_node("Add", ["sc", const("beta", beta.reshape(bshape))], ["n"]))
    else:
        nodes.append(helper.make_node("GroupNormalization", ["h", const("gamma", gamma), const("beta", beta)], ["n"],
                                      num_groups=g, epsilon=1e-5))
    if act == "silu":
        nodes += [helper.make_node("Sigmoid", ["n"], ["sg"]), helper.make_node("Mul", ["n", "sg"], ["y"])]
    else:
        nodes += [
            helper.make_node("Mul", ["n", const("rs2", np.float32(0.7071067811865476))], ["g0"]),
            helper.make_node("Erf", ["g0"], ["g1"]),
            helper.make_node("Add", ["g1", const("one", np.float32(1.0))], ["g2"]),
            helper.make_node("Mul", ["n", "g2"], ["g3"]),
            helper.make_node("Mul", ["g3", const("half", np.float32(0.5))], ["y"]),
        ]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    opset = 21 if form == "native" else 17
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.save(model, path)
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tilec", type=Path, default=ROOT / "target" / "release" / "tilec")
    ap.add_argument("--baseline", type=Path, help="an earlier tilec binary timed in the same rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--only", nargs="*", help="layer names")
    ap.add_argument("--keep", type=Path, help="also write the layers' models and inputs here")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    sides = [("tilec", args.tilec)] + ([("baseline", args.baseline)] if args.baseline else [])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        for layer in LAYERS:
            if args.only and layer[0] not in args.only:
                continue
            path = where / f"{layer[0]}.onnx"
            x = build(layer, path, rng)
            xfile = where / f"{layer[0]}.npy"
            np.save(xfile, x)
            got = {"ort": []} | {n: [] for n, _ in sides}
            for _ in range(args.rounds):
                got["ort"].append(ort_median_ms(path, {"x": x}, 2, args.runs))
                for n, b in sides:
                    got[n].append(tilec_median_ms(b, path, xfile, args.runs))
            row = {"layer": layer[0], "load": round(os.getloadavg()[0], 2)}
            row |= {f"{k}_ms": round(statistics.median(v), 4) for k, v in got.items()}
            row |= {f"{k}_rounds": [round(t, 4) for t in v] for k, v in got.items()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "layers.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| layer | tilec ms | baseline ms | onnxruntime ms | tilec / ort | tilec / baseline | load |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        base = r.get("baseline_ms", float("nan"))
        lines.append(f"| {r['layer']} | {r['tilec_ms']:.3f} | {base:.3f} | {r['ort_ms']:.3f} | "
                     f"{r['tilec_ms'] / r['ort_ms']:.2f} | {r['tilec_ms'] / base:.2f} | {r['load']} |")
    (args.out / "layers.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
