#!/usr/bin/env python3
"""Depthwise convolutions alone: tilec's `cpu.depthwise` kernel against the roofline and
against onnxruntime, at the shapes of MobileNet-V2/-V3, EfficientNet-B0 and ConvNeXt-T.

Run from the repository root inside the benchmark venv (scripts/setup-bench-venv.sh):

    .venv-bench/bin/python bench/dwconv.py [--threads 2] [--runs 50] [--only mnv2_112x32_k3s1 ...]

Each case is a one-node ONNX model, written to a temporary folder: an NHWC input
transposed to NCHW, a depthwise Conv (bias, padding k/2), the result transposed back to
NHWC, so that tilec's layout pass keeps the convolution channels-last with no transposes
around it. tilec's figures come from `tilec run MODEL --profile --roofline SVG --bench N
--threads T`: the depthwise kernel's mean time, GFLOP/s, GB/s and its fraction of the
roofline (the higher of the memory and compute bounds for its bytes and FLOPs, both
ceilings measured by `tilec run`: a 32 MiB copy and tilec's own f32 GEMM). The issue's
criterion is a fraction of at least 50%. onnxruntime (same threads, all optimizations,
sequential) times the whole model, median of the same number of runs; tilec's whole-model
median comes from the same `tilec run`.

Writes `--out DIR/dwconv.json` and `dwconv.md` (default bench/results).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from ort_time import ort_median_ms
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent

# name: (H = W, C, kernel, stride)
CASES = {
    "mnv2_112x32_k3s1": (112, 32, 3, 1),
    "mnv2_112x96_k3s2": (112, 96, 3, 2),
    "mnv2_56x144_k3s1": (56, 144, 3, 1),
    "mnv2_56x144_k3s2": (56, 144, 3, 2),
    "mnv2_28x192_k3s1": (28, 192, 3, 1),
    "mnv2_14x384_k3s1": (14, 384, 3, 1),
    "mnv2_14x576_k3s2": (14, 576, 3, 2),
    "mnv2_7x960_k3s1": (7, 960, 3, 1),
    "mnv3_56x72_k5s2": (56, 72, 5, 2),
    "effb0_28x240_k5s1": (28, 240, 5, 1),
    "effb0_14x672_k5s1": (14, 672, 5, 1),
    "effb0_7x1152_k5s1": (7, 1152, 5, 1),
    "convnext_56x96_k7s1": (56, 96, 7, 1),
    "convnext_28x192_k7s1": (28, 192, 7, 1),
    "convnext_14x384_k7s1": (14, 384, 7, 1),
    "convnext_7x768_k7s1": (7, 768, 7, 1),
}


def model(h: int, c: int, k: int, s: int, seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = rng.uniform(-0.3, 0.3, (c, 1, k, k)).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, (c,)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["xc", "w", "b"], ["yc"], group=c, kernel_shape=[k, k],
                         strides=[s, s], pads=[k // 2] * 4),
        helper.make_node("Transpose", ["yc"], ["y"], perm=[0, 2, 3, 1]),
    ]
    o = (h + 2 * (k // 2) - k) // s + 1
    g = helper.make_graph(
        nodes, "dwconv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, h, h, c])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, o, c])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8  # what every onnxruntime of the pinned range reads
    return m


def tilec_case(tilec: str, path: Path, x: Path, threads: int, runs: int) -> dict:
    svg = path.with_suffix(".svg")
    cmd = [tilec, "run", str(path), "--input", f"x={x}", "--bench", str(runs), "--threads",
           str(threads), "--profile", "--roofline", str(svg)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip()[-400:]}
    text = out.stdout
    r: dict = {}
    if m := re.search(r"bench: \d+ runs, median ([\d.]+) ms", text):
        r["model_median_ms"] = float(m.group(1))
    rows = [ln.split() for ln in text.splitlines() if "[cpu." in ln and ln.startswith("k")]
    dw = [row for row in rows if row[1] == "[cpu.depthwise]"]
    r["families"] = sorted({row[1].strip("[]") for row in rows})
    if not dw:
        r["error"] = "no cpu.depthwise kernel in the profile"
        return r
    row = dw[0]
    name = row[0]
    r.update(kernel_mean_ms=float(row[4]), gbps=float(row[8]), gflops=float(row[9]))
    if m := re.search(r"ceilings: ([\d.]+) GB/s .*?, ([\d.]+) GFLOP/s", text):
        r["ceiling_gbps"], r["ceiling_gflops"] = float(m.group(1)), float(m.group(2))
    if m := re.search(rf"  {re.escape(name)} \[cpu\.depthwise\]: ([\d.]+) FLOP/B, [\d.]+ GFLOP/s, (\d+)% of the roof", text):
        r["flop_per_byte"], r["roof_fraction"] = float(m.group(1)), int(m.group(2)) / 100
    return r




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tilec", default=str(ROOT / "target/release/tilec"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    a = ap.parse_args()
    names = a.only or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    res = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "threads": a.threads,
        "runs": a.runs,
        "onnxruntime": ort.__version__,
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "cases": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for i, n in enumerate(names):
            h, c, k, s = CASES[n]
            p = Path(tmp) / f"{n}.onnx"
            onnx.save(model(h, c, k, s, i), p)
            x = np.random.default_rng(100 + i).uniform(-1, 1, (1, h, h, c)).astype(np.float32)
            xp = Path(tmp) / f"{n}.npy"
            np.save(xp, x)
            row = {"name": n, "hw": h, "c": c, "k": k, "stride": s}
            row["ort_ms"] = ort_median_ms(p, {"x": x}, a.threads, a.runs)
            row["tilec"] = tilec_case(a.tilec, p, xp, a.threads, a.runs)
            row["load_average"] = [round(v, 2) for v in os.getloadavg()]
            res["cases"].append(row)
            t = row["tilec"]
            print(f"{n:22} ort {row['ort_ms']:7.3f} ms  tilec {t.get('model_median_ms', float('nan')):7.3f} ms  "
                  f"kernel {t.get('kernel_mean_ms', float('nan')):7.3f} ms {t.get('gflops', 0):6.1f} GFLOP/s "
                  f"{t.get('gbps', 0):6.1f} GB/s  roof {t.get('roof_fraction', 0) * 100:4.0f}%  {t.get('error', '')}",
                  flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dwconv.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [
        f"# Depthwise convolutions alone, {res['date'][:10]}",
        "",
        f"{a.threads} threads on both sides, median of {a.runs} runs; load average at the start "
        f"{res['load_average_at_start']}; onnxruntime {res['onnxruntime']}. Roof: the larger of "
        "bytes / copy bandwidth and FLOPs / GEMM peak, both measured by `tilec run --roofline`.",
        "",
        "| case | H=W x C, k, s | ort ms | tilec ms | tilec / ort | kernel ms | GFLOP/s | GB/s | FLOP/B | of the roof | ceilings GB/s, GFLOP/s | load |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in res["cases"]:
        t = r["tilec"]
        if "error" in t:
            lines.append(f"| {r['name']} | {r['hw']}x{r['c']}, {r['k']}, {r['stride']} | {r['ort_ms']:.3f} | | | | | | | | | error: {t['error'][:80]} |")
            continue
        lines.append(
            f"| {r['name']} | {r['hw']}x{r['c']}, {r['k']}, {r['stride']} | {r['ort_ms']:.3f} | "
            f"{t['model_median_ms']:.3f} | {t['model_median_ms'] / r['ort_ms']:.2f} | {t['kernel_mean_ms']:.3f} | "
            f"{t['gflops']:.1f} | {t['gbps']:.1f} | {t.get('flop_per_byte', 0):.2f} | "
            f"{t.get('roof_fraction', 0) * 100:.0f}% | {t.get('ceiling_gbps', 0):.0f}, {t.get('ceiling_gflops', 0):.0f} | "
            f"{r['load_average'][0]} |")
    (out / "dwconv.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'dwconv.json'} and dwconv.md")


if __name__ == "__main__":
    main()
