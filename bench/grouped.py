#!/usr/bin/env python3
"""Grouped and dilated 3x3 convolutions alone: tilec (two builds) against onnxruntime, at the
shapes of ResNeXt-50 32x4d, RegNet and dilated segmentation backbones and heads.

Run from the repository root inside the benchmark venv (scripts/setup-bench-venv.sh):

    .venv-bench/bin/python bench/grouped.py --tilec target/tilec-after \\
        --baseline target/tilec-before [--rounds 3] [--runs 30] [--only rx_56x128_g32 ...]

Each case is a one-node ONNX model, written to a temporary folder: an NHWC input transposed
to NCHW, a Conv (3x3, bias, padding equal to the dilation), the result transposed back to
NHWC, so that tilec's layout pass keeps the convolution channels-last with no transposes
around it. Per case, alternating rounds of onnxruntime (2 intra-op threads, sequential, all
optimizations; median of `--runs` runs), tilec and the baseline build (`tilec run --bench N
--profile`: the whole model's median and the conv kernel's mean time and family); each
figure is the median of its rounds.

Writes `--out DIR/grouped.json` and `grouped.md` (default bench/results).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from ort_time import ort_median_ms
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent

# name: (H = W, input channels, output channels, groups, stride, dilation)
CASES = {
    "rx_56x128_g32": (56, 128, 128, 32, 1, 1),
    "rx_56x256_g32_s2": (56, 256, 256, 32, 2, 1),
    "rx_28x256_g32": (28, 256, 256, 32, 1, 1),
    "rx_14x512_g32": (14, 512, 512, 32, 1, 1),
    "regnety_14x208_g26": (14, 208, 208, 26, 1, 1),
    "regnetx_28x64_g4": (28, 64, 64, 4, 1, 1),
    "dil2_28x256": (28, 256, 256, 1, 1, 2),
    "dil4_28x512": (28, 512, 512, 1, 1, 4),
    "aspp12_14x960": (14, 960, 256, 1, 1, 12),
    "aspp24_14x960": (14, 960, 256, 1, 1, 24),
}


def model(h: int, ci: int, co: int, g: int, s: int, d: int, seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    scale = 1.5 / np.sqrt(ci // g * 9)
    w = rng.uniform(-scale, scale, (co, ci // g, 3, 3)).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, (co,)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["xc", "w", "b"], ["yc"], group=g, kernel_shape=[3, 3],
                         strides=[s, s], dilations=[d, d], pads=[d] * 4),
        helper.make_node("Transpose", ["yc"], ["y"], perm=[0, 2, 3, 1]),
    ]
    o = (h + 2 * d - 2 * d - 1) // s + 1
    gr = helper.make_graph(
        nodes, "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, h, h, ci])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, o, co])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def tilec_case(tilec: str, path: Path, x: Path, threads: int, runs: int) -> dict:
    cmd = [tilec, "run", str(path), "--input", f"x={x}", "--bench", str(runs), "--threads", str(threads), "--profile"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip()[-400:]}
    r: dict = {}
    if m := re.search(r"bench: \d+ runs, median ([\d.]+) ms", out.stdout):
        r["model_ms"] = float(m.group(1))
    rows = [ln.split() for ln in out.stdout.splitlines() if "_conv" in ln and "[" in ln and ln.startswith("k")]
    if not rows:
        r["error"] = "no conv kernel in the profile"
        return r
    r["family"] = rows[0][1].strip("[]")
    r["kernel_ms"] = float(rows[0][4])
    return r




def med(vals: list) -> float:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tilec", default=str(ROOT / "target/release/tilec"))
    ap.add_argument("--baseline", help="a second tilec binary timed in the same rounds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    a = ap.parse_args()
    names = a.only or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    sides = {"tilec": a.tilec} | ({"baseline": a.baseline} if a.baseline else {})
    res = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "threads": a.threads, "runs": a.runs, "rounds": a.rounds,
        "onnxruntime": ort.__version__, "binaries": sides,
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "cases": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for i, n in enumerate(names):
            h, ci, co, g, s, d = CASES[n]
            p = Path(tmp) / f"{n}.onnx"
            onnx.save(model(h, ci, co, g, s, d, i), p)
            x = np.random.default_rng(100 + i).uniform(-1, 1, (1, h, h, ci)).astype(np.float32)
            xp = Path(tmp) / f"{n}.npy"
            np.save(xp, x)
            row = {"name": n, "shape": [h, ci, co, g, s, d], "ort_rounds_ms": [], "load_averages": []}
            for side in sides:
                row[side] = []
            for _ in range(a.rounds):
                row["load_averages"].append(round(os.getloadavg()[0], 2))
                row["ort_rounds_ms"].append(ort_median_ms(p, {"x": x}, a.threads, a.runs))
                for side, binary in sides.items():
                    row[side].append(tilec_case(binary, p, xp, a.threads, a.runs))
            row["ort_ms"] = med(row["ort_rounds_ms"])
            for side in sides:
                rs = row[side]
                row[f"{side}_model_ms"] = med([r.get("model_ms") for r in rs])
                row[f"{side}_kernel_ms"] = med([r.get("kernel_ms") for r in rs])
                row[f"{side}_family"] = next((r["family"] for r in rs if "family" in r), rs[0].get("error", "?"))
            res["cases"].append(row)
            line = f"{n:20} ort {row['ort_ms']:8.3f} ms"
            for side in sides:
                line += f"  {side} {row[f'{side}_model_ms']:8.3f} ms (kernel {row[f'{side}_kernel_ms']:7.3f}, {row[f'{side}_family']})"
            print(line + f"  load {row['load_averages']}", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grouped.json").write_text(json.dumps(res, indent=1) + "\n")
    base = "baseline" in sides
    lines = [
        f"# Grouped and dilated 3x3 convolutions alone, {res['date'][:10]}",
        "",
        f"{a.threads} threads on both sides; per case {a.rounds} alternating rounds (onnxruntime, tilec"
        + (", baseline" if base else "") + f"), each the median of {a.runs} runs, each figure the median of its rounds; "
        f"load average at the start {res['load_average_at_start']}; onnxruntime {res['onnxruntime']}. "
        "Model: the whole one-conv model's median (`tilec run --bench`); kernel: the conv kernel's mean "
        "time in `--profile`.",
        "",
        "| case | H=W, Cin, Cout, groups, stride, dilation | ort ms | tilec ms | tilec / ort | kernel ms | family |"
        + (" baseline ms | baseline kernel ms | baseline family | tilec / baseline |" if base else "") + " load (per round) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |" + (" ---: | ---: | --- | ---: |" if base else "") + " --- |",
    ]
    for r in res["cases"]:
        t = r["tilec_model_ms"]
        s = (f"| {r['name']} | {', '.join(map(str, r['shape']))} | {r['ort_ms']:.3f} | {t:.3f} | {t / r['ort_ms']:.2f} | "
             f"{r['tilec_kernel_ms']:.3f} | {r['tilec_family']} |")
        if base:
            b = r["baseline_model_ms"]
            s += f" {b:.3f} | {r['baseline_kernel_ms']:.3f} | {r['baseline_family']} | {t / b:.2f} |"
        lines.append(s + f" {r['load_averages']} |")
    (out / "grouped.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'grouped.json'} and grouped.md")


if __name__ == "__main__":
    main()
