#!/usr/bin/env python3
"""Matrix products of few rows with constant weights: tilec's `cpu.gemv` against the build
before it (`cpu.blis_gemm`) and onnxruntime, in alternating rounds.

Run from the repository root inside the benchmark venv (scripts/setup-bench-venv.sh):

    .venv-bench/bin/python bench/gemv.py --baseline target/tilec-before [--rounds 3] [--runs 200]
    .venv-bench/bin/python bench/gemv.py --rows   # cpu.gemv against cpu.blis_gemm at 1-8 rows

Each case is a small ONNX model written to a temporary folder: one `Gemm` (weights [N, K],
transB=1, bias, as PyTorch's Linear exports; an activation where the model has one) or one
`MatMul` with [K, N] weights, and `cold_chain`, eight of MobileNet-V3's first classifier
layers in a row (960 -> 1280 -> 960 ..., 39 MB of weights, more than the 32 MiB L3), so that
each layer's weights come from memory as in the whole model. tilec's figures come from
`tilec run MODEL --profile --bench N --threads T`: the matrix-product kernels' mean time and
GB/s (their bytes, the weights nearly all, over their time) and the model's median;
onnxruntime (same threads, all optimizations, sequential) times the whole model, median of
the same number of runs. Every round runs onnxruntime, the baseline and the build under test
one after the other, and the load average is recorded with each.

With --rows, the build under test runs `cpu.gemv` and `cpu.blis_gemm` (forced with
`--family matmul=...`) on the 960 -> 1280 layer at 1, 2, 3, 4, 6 and 8 rows, hot and in the
cold chain: the measurement behind `cpu.gemv`'s default row limit.

Writes `--out DIR/gemv.json` (or `gemv-rows.json`) and a markdown table beside it.
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
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent

# name: (rows, [(K, N, activation)], transB)
CASES = {
    "mnv3_fc1_960x1280_hswish": (1, [(960, 1280, "HardSwish")], True),
    "mnv3_fc2_1280x1000": (1, [(1280, 1000, None)], True),
    "resnet_fc_2048x1000": (1, [(2048, 1000, None)], True),
    "cold_chain_8x(960x1280)": (1, [(960, 1280, "HardSwish"), (1280, 960, "HardSwish")] * 4, True),
    "decode_4096x4096_kn": (1, [(4096, 4096, None)], False),
    "rows4_2048x2048_relu": (4, [(2048, 2048, "Relu")], True),
}


def model(rows: int, layers: list, trans_b: bool, seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for i, (k, n, act) in enumerate(layers):
        w = (rng.uniform(-1, 1, (n, k) if trans_b else (k, n)) / np.sqrt(k)).astype(np.float32)
        b = rng.uniform(-0.5, 0.5, (n,)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        y = f"h{i}"
        if trans_b:
            nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y], transB=1))
        else:
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]))
            nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [y]))
        if act:
            nodes.append(helper.make_node(act, [y], [f"a{i}"]))
            y = f"a{i}"
        x = y
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    g = helper.make_graph(
        nodes, "gemv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, layers[0][0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, layers[-1][1]])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def tilec_case(tilec: str, path: Path, x: Path, threads: int, runs: int, extra: list[str]) -> dict:
    cmd = [tilec, "run", str(path), "--input", f"x={x}", "--bench", str(runs), "--threads",
           str(threads), "--profile", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip()[-400:]}
    text = out.stdout
    r: dict = {}
    if m := re.search(r"bench: \d+ runs, median ([\d.]+) ms, min ([\d.]+) ms", text):
        r["model_median_ms"], r["model_min_ms"] = float(m.group(1)), float(m.group(2))
    rows = [ln.split() for ln in text.splitlines() if "[cpu." in ln and ln.startswith("k")]
    mm = [row for row in rows if row[1] in ("[cpu.gemv]", "[cpu.blis_gemm]")]
    r["families"] = sorted({row[1].strip("[]") for row in mm})
    if not mm:
        r["error"] = "no matrix-product kernel in the profile"
        return r
    calls = int(mm[0][2])
    total_ms = sum(float(row[3]) for row in mm)
    mb = sum(float(row[6]) for row in mm)
    r.update(kernels=len(mm), kernel_ms=total_ms / calls, kernel_mb=mb / calls, gbps=mb / total_ms)
    return r


def ort_case(path: Path, x: np.ndarray, threads: int, runs: int) -> tuple[float, float]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(3):
        s.run(None, {"x": x})
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        s.run(None, {"x": x})
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts), min(ts)


def load() -> float:
    return round(os.getloadavg()[0], 2)


def fmt(t: dict) -> str:
    if "error" in t:
        return f"error: {t['error'][:120]}"
    return f"{t['model_median_ms']:7.3f} ms (min {t['model_min_ms']:.3f}; kernels {t['kernel_ms']:7.3f} ms, {t['gbps']:6.1f} GB/s, {'/'.join(t['families'])})"


def compare(a, tmp: Path) -> dict:
    res = {"mode": "compare", "cases": []}
    names = a.only or list(CASES)
    inputs = {}
    for i, n in enumerate(names):
        rows, layers, tb = CASES[n]
        p = tmp / f"{i}.onnx"
        onnx.save(model(rows, layers, tb, i), p)
        x = np.random.default_rng(100 + i).uniform(-1, 1, (rows, layers[0][0])).astype(np.float32)
        np.save(tmp / f"{i}.npy", x)
        inputs[n] = (p, x, tmp / f"{i}.npy")
        res["cases"].append({"name": n, "rows": rows, "layers": layers, "trans_b": tb,
                             "weights_mb": sum(k * nn * 4 for k, nn, _ in layers) / 1e6, "rounds": []})
    for rnd in range(a.rounds):
        for c in res["cases"]:
            p, x, xp = inputs[c["name"]]
            r = {"round": rnd}
            (r["ort_ms"], r["ort_min_ms"]), r["ort_load"] = ort_case(p, x, a.threads, a.runs), load()
            r["before"] = tilec_case(a.baseline, p, xp, a.threads, a.runs, [])
            r["before"]["load"] = load()
            r["after"] = tilec_case(a.tilec, p, xp, a.threads, a.runs, [])
            r["after"]["load"] = load()
            c["rounds"].append(r)
            print(f"round {rnd} {c['name']:28} ort {r['ort_ms']:7.3f} ms | before {fmt(r['before'])} | "
                  f"after {fmt(r['after'])} | load {r['after']['load']}", flush=True)
    return res


def rows_study(a, tmp: Path) -> dict:
    res = {"mode": "rows", "cases": []}
    for rows in (1, 2, 3, 4, 6, 8):
        for label, layers in (("hot", [(960, 1280, None)]), ("cold", [(960, 1280, None), (1280, 960, None)] * 4)):
            p = tmp / f"r{rows}{label}.onnx"
            onnx.save(model(rows, layers, True, rows), p)
            xp = tmp / f"r{rows}{label}.npy"
            np.save(xp, np.random.default_rng(rows).uniform(-1, 1, (rows, 960)).astype(np.float32))
            c = {"rows": rows, "weights": label, "rounds": []}
            for rnd in range(a.rounds):
                r = {"round": rnd}
                for fam in ("cpu.blis_gemm", "cpu.gemv"):
                    r[fam] = tilec_case(a.tilec, p, xp, a.threads, a.runs, ["--family", f"matmul={fam}"])
                    r[fam]["load"] = load()
                c["rounds"].append(r)
                print(f"rows {rows} {label:4} round {rnd}: blis {fmt(r['cpu.blis_gemm'])} | gemv {fmt(r['cpu.gemv'])} | "
                      f"load {r['cpu.gemv']['load']}", flush=True)
            res["cases"].append(c)
    return res


def med(xs: list) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def markdown(res: dict) -> list[str]:
    lines = []
    if res["mode"] == "compare":
        lines += [
            "| case | rows | weights MB | ort ms | before ms | after ms | after / ort | before / ort | "
            "min ort, before, after ms | weights GB/s at the median (min), before | after | "
            "before kernels ms, GB/s (profiled) | after kernels ms, GB/s (profiled) | loads |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- | --- |",
        ]
        for c in res["cases"]:
            rs = c["rounds"]
            o = med([r["ort_ms"] for r in rs])
            b = med([r["before"].get("model_median_ms") for r in rs])
            f = med([r["after"].get("model_median_ms") for r in rs])
            bk = med([r["before"].get("kernel_ms") for r in rs])
            fk = med([r["after"].get("kernel_ms") for r in rs])
            bg = med([r["before"].get("gbps") for r in rs])
            fg = med([r["after"].get("gbps") for r in rs])
            mins = [min(r["ort_min_ms"] for r in rs), min(r["before"].get("model_min_ms", float("nan")) for r in rs),
                    min(r["after"].get("model_min_ms", float("nan")) for r in rs)]
            loads = ", ".join(str(r["after"]["load"]) for r in rs)
            lines.append(f"| {c['name']} | {c['rows']} | {c['weights_mb']:.1f} | {o:.3f} | {b:.3f} | {f:.3f} | "
                         f"{f / o:.2f} | {b / o:.2f} | {', '.join(f'{x:.3f}' for x in mins)} | "
                         f"{c['weights_mb'] / b:.0f} ({c['weights_mb'] / mins[1]:.0f}) | {c['weights_mb'] / f:.0f} ({c['weights_mb'] / mins[2]:.0f}) | "
                         f"{bk:.3f}, {bg:.0f} | {fk:.3f}, {fg:.0f} | {loads} |")
    else:
        lines += [
            "| rows | weights | blis_gemm model ms (min) | kernels ms | GB/s | gemv model ms (min) | kernels ms | GB/s | gemv / blis (model medians) | loads |",
            "| ---: | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | --- |",
        ]
        for c in res["cases"]:
            rs = c["rounds"]
            bk = med([r["cpu.blis_gemm"].get("kernel_ms") for r in rs])
            gk = med([r["cpu.gemv"].get("kernel_ms") for r in rs])
            bg = med([r["cpu.blis_gemm"].get("gbps") for r in rs])
            gg = med([r["cpu.gemv"].get("gbps") for r in rs])
            bm = med([r["cpu.blis_gemm"].get("model_median_ms") for r in rs])
            gm = med([r["cpu.gemv"].get("model_median_ms") for r in rs])
            bn = min(r["cpu.blis_gemm"].get("model_min_ms", float("nan")) for r in rs)
            gn = min(r["cpu.gemv"].get("model_min_ms", float("nan")) for r in rs)
            loads = ", ".join(str(r["cpu.gemv"]["load"]) for r in rs)
            lines.append(f"| {c['rows']} | {c['weights']} | {bm:.3f} ({bn:.3f}) | {bk:.3f} | {bg:.0f} | {gm:.3f} ({gn:.3f}) | {gk:.3f} | {gg:.0f} | {gm / bm:.2f} | {loads} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tilec", default=str(ROOT / "target/release/tilec"))
    ap.add_argument("--baseline", default=str(ROOT / "target/tilec-before"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", action="store_true")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    ap.add_argument("--render", metavar="JSON", help="only rewrite the markdown table of an earlier run")
    a = ap.parse_args()
    if a.render:
        res = json.loads(Path(a.render).read_text())
        write_md(Path(a.render).with_suffix(".md"), res)
        return
    unknown = [n for n in a.only or [] if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    head = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "threads": a.threads,
        "runs": a.runs,
        "rounds": a.rounds,
        "onnxruntime": ort.__version__,
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory() as tmp:
        res = rows_study(a, Path(tmp)) if a.rows else compare(a, Path(tmp))
    res = {**head, **res}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "gemv-rows" if a.rows else "gemv"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1) + "\n")
    write_md(out / f"{stem}.md", res)
    print(f"wrote {out / stem}.json and .md")


def write_md(path: Path, res: dict) -> None:
    lines = [f"# {path.stem}, {res['date'][:10]}", "",
             f"{res['threads']} threads, medians over {res['rounds']} rounds of {res['runs']} runs each; load average at "
             f"the start {res['load_average_at_start']}; onnxruntime {res['onnxruntime']}.", ""] + markdown(res)
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
