#!/usr/bin/env python3
"""Attention alone: tilec against onnxruntime (and an earlier tilec build) on one-layer
attention models at long sequences.

Run from the repository root inside the benchmark venv (scripts/setup-bench-venv.sh):

    .venv-bench/bin/python bench/attention.py [--baseline target/tilec-before] [--rounds 3]
        [--only op_s2048_h8 ...] [--tilec-args "--family attention=cpu.attention_flash"]
        [--baseline target/release/tilec --baseline-args "--family attention=cpu.attention_gemm"]

Each case is an ONNX model written to a temporary folder, Q, K and V `[1, heads, seq, 64]`
inputs (uniform in [-1, 1)) and one output:
- `op_*`: the ONNX `Attention` operator (opset 23), `is_causal` 0 or 1;
- `mm_*`: the pattern exporters write for non-causal attention, `MatMul(Q, Transpose(K))`,
  `Mul` by the scale, `Softmax`, `MatMul` by V (which onnxruntime runs as written and tilec
  recognizes as one attention).

Both sides run with the same threads. onnxruntime: CPU provider, all optimizations,
sequential execution, median of N runs after warm-up. tilec: `tilec run MODEL --input ...
--bench N --json` (its median). The sides alternate in rounds (onnxruntime, tilec,
baseline, ...); each figure is the median of its rounds' medians, and the load average
(`os.getloadavg`) is recorded with every round.

Writes `--out DIR/attention.json` and `attention.md` (default bench/results).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from ort_time import ort_median_ms
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
DH = 64

# name: (form, seq, heads, causal)
CASES = {
    "op_s2048_h8": ("op", 2048, 8, False),
    "op_s2048_h8_causal": ("op", 2048, 8, True),
    "mm_s2048_h8": ("mm", 2048, 8, False),
    "op_s8192_h8": ("op", 8192, 8, False),
    "op_s8192_h8_causal": ("op", 8192, 8, True),
    "mm_s8192_h8": ("mm", 8192, 8, False),
    "op_s512_h6": ("op", 512, 6, False),
    "op_s17_h12": ("op", 17, 12, False),
    # Short sequences, where the two-product form may win (compare with --tilec-args and
    # --baseline-args forcing the families).
    "op_s64_h12": ("op", 64, 12, False),
    "op_s128_h8": ("op", 128, 8, False),
    "op_s256_h8": ("op", 256, 8, False),
    "op_s384_h8": ("op", 384, 8, False),
    "op_s1024_h8": ("op", 1024, 8, False),
}
DEFAULT = ["op_s2048_h8", "op_s2048_h8_causal", "mm_s2048_h8", "op_s8192_h8", "op_s8192_h8_causal",
           "mm_s8192_h8", "op_s512_h6", "op_s17_h12"]


def model(form: str, s: int, h: int, causal: bool) -> onnx.ModelProto:
    shape = [1, h, s, DH]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]
    inits = []
    if form == "op":
        nodes = [helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=int(causal))]
        opset = 23
    else:
        assert not causal
        inits = [helper.make_tensor("scale", TensorProto.FLOAT, [], [1.0 / DH**0.5])]
        nodes = [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["q", "kt"], ["s"]),
            helper.make_node("Mul", ["s", "scale"], ["ss"]),
            helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "v"], ["y"]),
        ]
        opset = 17
    g = helper.make_graph(nodes, "attention", ins, out, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def tilec_ms(tilec: str, path: Path, inputs: dict[str, Path], threads: int, runs: int, extra: list[str]) -> float:
    cmd = [tilec, "run", str(path), "--bench", str(runs), "--threads", str(threads), "--json", *extra]
    for n, p in inputs.items():
        cmd += ["--input", f"{n}={p}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError((out.stderr or out.stdout).strip()[-400:])
    return float(json.loads(out.stdout.strip().splitlines()[-1])["median_ms"])




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tilec", default=str(ROOT / "target/release/tilec"))
    ap.add_argument("--baseline", default=None, help="an earlier tilec build timed in the same rounds")
    ap.add_argument("--tilec-args", default="", help="extra arguments of `tilec run`")
    ap.add_argument("--baseline-args", default=None, help="extra arguments of the baseline's `tilec run` (default: --tilec-args)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    a = ap.parse_args()
    names = a.only or DEFAULT
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    extra = {"tilec": shlex.split(a.tilec_args)}
    extra["baseline"] = shlex.split(a.tilec_args if a.baseline_args is None else a.baseline_args)
    sides = [("ort", None), ("tilec", a.tilec)] + ([("baseline", a.baseline)] if a.baseline else [])
    res = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "threads": a.threads,
        "runs": a.runs,
        "rounds": a.rounds,
        "tilec_args": a.tilec_args,
        "baseline_args": a.baseline_args,
        "onnxruntime": ort.__version__,
        "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?"),
        "cases": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for i, n in enumerate(names):
            form, s, h, causal = CASES[n]
            p = Path(tmp) / f"{n}.onnx"
            onnx.save(model(form, s, h, causal), p)
            rng = np.random.default_rng(100 + i)
            feeds = {x: rng.uniform(-1, 1, (1, h, s, DH)).astype(np.float32) for x in "qkv"}
            files = {}
            for x, v in feeds.items():
                files[x] = Path(tmp) / f"{n}_{x}.npy"
                np.save(files[x], v)
            row = {"name": n, "form": form, "seq": s, "heads": h, "head_dim": DH, "causal": causal, "rounds": []}
            for _ in range(a.rounds):
                rd = {}
                for side, exe in sides:
                    try:
                        if side == "ort":
                            rd[side] = ort_median_ms(p, feeds, a.threads, a.runs, warmup=2)
                        else:
                            rd[side] = tilec_ms(exe, p, files, a.threads, a.runs, extra[side])
                    except Exception as e:  # noqa: BLE001 - recorded, not fatal
                        rd[side] = None
                        row.setdefault("errors", []).append(f"{side}: {e}")
                rd["load_average"] = [round(v, 2) for v in os.getloadavg()]
                row["rounds"].append(rd)
            for side, _ in sides:
                v = [r[side] for r in row["rounds"] if r.get(side) is not None]
                row[f"{side}_ms"] = statistics.median(v) if v else None
            res["cases"].append(row)
            fmt = lambda x: f"{x:9.3f}" if x is not None else "      n/a"  # noqa: E731
            print(f"{n:20} " + "  ".join(f"{side} {fmt(row[f'{side}_ms'])}" for side, _ in sides)
                  + f"  load {[r['load_average'][0] for r in row['rounds']]}  {row.get('errors', '')}", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention.json").write_text(json.dumps(res, indent=1) + "\n")
    head = "| case | seq | heads | causal | onnxruntime ms | tilec ms | tilec / ort |"
    rule = "| --- | ---: | ---: | --- | ---: | ---: | ---: |"
    if a.baseline:
        head += " baseline ms | baseline / ort |"
        rule += " ---: | ---: |"
    lines = [
        f"# Attention alone, {res['date'][:10]}",
        "",
        f"{a.threads} threads on both sides, {a.rounds} alternating rounds of {a.runs} runs (median of the "
        f"rounds' medians); onnxruntime {res['onnxruntime']}; {res['cpu']}; tilec arguments "
        f"`{a.tilec_args}`, baseline's `{extra['baseline'] and ' '.join(extra['baseline'])}`. "
        "Load average (1 min) per round in the last column.",
        "",
        head + " load |",
        rule + " --- |",
    ]
    for r in res["cases"]:
        o, t = r["ort_ms"], r["tilec_ms"]
        ratio = lambda x: f"{x / o:.2f}" if x and o else ""  # noqa: E731
        cell = lambda x: f"{x:.3f}" if x is not None else "n/a"  # noqa: E731
        line = f"| {r['name']} | {r['seq']} | {r['heads']} | {r['causal']} | {cell(o)} | {cell(t)} | {ratio(t)} |"
        if a.baseline:
            line += f" {cell(r['baseline_ms'])} | {ratio(r['baseline_ms'])} |"
        line += f" {', '.join(str(x['load_average'][0]) for x in r['rounds'])} |"
        lines.append(line)
    (out / "attention.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'attention.json'} and attention.md")


if __name__ == "__main__":
    main()
