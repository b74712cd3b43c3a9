#!/usr/bin/env python3
"""CPU benchmark: tilec against onnxruntime on whole models, and tilec's SGEMM
against numpy's BLAS.

Run from the repository root inside the benchmark venv (scripts/setup-bench-venv.sh):

    .venv-bench/bin/python bench/cpu.py

Writes bench/results/cpu-YYYY-MM-DD.json and .md. See bench/README.md.

Both sides are timed the same way: warm-up runs, then N timed runs, and the
median is reported. onnxruntime runs with 2 intra-op threads, sequential
execution and all graph optimizations. tilec's model latency comes from
`tilec run MODEL --input NAME=FILE.npy ... --bench N --json`, which prints one
JSON line with `median_ms`; tilec's SGEMM figures come from the `sgemm`
example of tilec-cpu (`--json`: a list of {"n", "gflops"}). Any tilec failure
is recorded as an error in the results instead of stopping the run.

`--baseline PATH` times a second tilec binary (an earlier build) in the same
alternating rounds; `--hog N` keeps N CPU-bound processes running beside every
measurement (how a model fares on a machine it shares).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parent.parent
LIGHT = [
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
]
TRANSFORMERS = ["gpt2", "bert", "llama"]
SGEMM_SIZES = [256, 512, 1024, 2048, 4096]


def model_dirs() -> list[tuple[str, Path]]:
    out = [(name, ROOT / "testdata" / "gen" / "light" / name) for name in LIGHT]
    out += [(name, ROOT / "models" / name) for name in TRANSFORMERS]
    return out


def load_inputs(model_dir: Path) -> dict[str, np.ndarray]:
    """The inputs of test_data_set_0, keyed by graph input name. Unnamed tensors
    (as in the light models) are matched to the graph's real inputs in order."""
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    init = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in init]
    files = sorted(
        (model_dir / "test_data_set_0").glob("input_*.pb"),
        key=lambda p: int(p.stem.split("_")[1]),
    )
    if len(files) != len(names):
        raise ValueError(f"{model_dir}: {len(files)} input files for graph inputs {names}")
    inputs = {}
    for i, f in enumerate(files):
        t = onnx.TensorProto()
        t.ParseFromString(f.read_bytes())
        name = t.name or names[i]
        if name not in names:
            raise ValueError(f"{f}: tensor {name!r} is not a graph input ({names})")
        inputs[name] = numpy_helper.to_array(t)
    return inputs


def median_ms(fn, warmup: int, runs: int) -> tuple[float, float]:
    """Median and fastest of `runs` timed calls after `warmup` untimed ones, in ms."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


@contextmanager
def hogs(n: int):
    """`n` CPU-bound processes (busy loops) for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def runs_for(first_ms: float, runs: int, budget_s: float) -> int:
    """As many runs as fit the time budget, between 3 and `runs`."""
    if first_ms <= 0:
        return runs
    return max(3, min(runs, int(budget_s * 1e3 / first_ms)))


def bench_ort(model_dir: Path, inputs, threads: int, warmup: int, runs: int, budget_s: float) -> dict:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    load_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    sess.run(None, inputs)
    first_ms = (time.perf_counter() - t0) * 1e3
    n = runs_for(first_ms, runs, budget_s)
    med, best = median_ms(lambda: sess.run(None, inputs), max(0, warmup - 1), n)
    return {"ms": med, "best_ms": best, "runs": n, "session_ms": load_ms, "first_run_ms": first_ms}


def tail(text: str, limit: int = 400) -> str:
    """A command's output as one line: its first line (usually the error) and the last few."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) > 5:
        lines = lines[:2] + ["..."] + lines[-3:]
    out = " / ".join(lines)
    return out if len(out) <= limit else out[: limit - 3] + "..."


def bench_tilec(tilec: Path, model_dir: Path, inputs, runs: int, timeout_s: float, threads: int | None = None) -> dict:
    if not tilec.exists():
        return {"error": f"{tilec} not found (build it: cargo build --release -p tilec)"}
    with tempfile.TemporaryDirectory(prefix="tilec-bench-") as tmp:
        cmd = [str(tilec), "run", str(model_dir / "model.onnx")]
        for i, (name, arr) in enumerate(inputs.items()):
            path = Path(tmp) / f"input_{i}.npy"
            np.save(path, arr)
            cmd += ["--input", f"{name}={path}"]
        cmd += ["--bench", str(runs), "--json"]
        if threads:
            cmd += ["--threads", str(threads)]
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f} s"}
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {tail(p.stderr or p.stdout)}"}
    for line in reversed(p.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec.get("median_ms"), (int, float)):
                out = {"ms": float(rec["median_ms"]), "runs": runs}
                out.update({k: v for k, v in rec.items() if k != "median_ms"})
                return out
    return {"error": f"no JSON line with median_ms in the output: {tail(p.stdout)!r}"}


def bench_numpy_sgemm(n: int, budget_s: float) -> dict:
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    t0 = time.perf_counter()
    np.matmul(a, b, out=c)  # warm-up
    first = time.perf_counter() - t0
    runs = max(3, min(50, int(budget_s / max(first, 1e-6))))
    med_ms, best_ms = median_ms(lambda: np.matmul(a, b, out=c), 1, runs)
    # Sanity check against a float64 product on a few entries.
    idx = rng.integers(0, n, size=(8, 2))
    want = np.array([a[i].astype(np.float64) @ b[:, j].astype(np.float64) for i, j in idx])
    got = c[idx[:, 0], idx[:, 1]]
    if not np.allclose(got, want, rtol=1e-3, atol=1e-3 * np.sqrt(n)):
        raise RuntimeError(f"numpy sgemm n={n} gave wrong results")
    return {
        "gflops": 2.0 * n**3 / (med_ms * 1e-3) / 1e9,
        "best_gflops": 2.0 * n**3 / (best_ms * 1e-3) / 1e9,
        "ms": med_ms,
        "runs": runs,
    }


def bench_tilec_sgemm(timeout_s: float) -> dict:
    # The example alternates rounds of tilec and numpy (this interpreter), so both see the same
    # machine state; its numpy figures are kept beside the separate numpy measurement.
    cmd = ["cargo", "run", "--release", "-q", "-p", "tilec-cpu", "--example", "sgemm", "--",
           "--json", "--rounds", "5", "--numpy", sys.executable]
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return {"error": "cargo not found"}
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {tail(p.stderr or p.stdout)}"}
    return parse_sgemm_output(p.stdout)


def parse_sgemm_output(stdout: str) -> dict:
    """{"by_n": {n: gflops}} from the sgemm example's `--json` output: an object
    {"threads", "results": [{"n", "tilec_gflops"}]} (or a bare list of {n, gflops})."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if not line.startswith(("{", "[")):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        recs = doc.get("results", []) if isinstance(doc, dict) else doc
        try:
            by_n = {int(r["n"]): float(r.get("tilec_gflops", r.get("gflops"))) for r in recs}
            np_n = {int(r["n"]): float(r["numpy_gflops"]) for r in recs if r.get("numpy_gflops") is not None}
            return {"by_n": by_n, "numpy_by_n": np_n}
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return {"error": f"no JSON list of {{n, gflops}} in the output: {tail(stdout)!r}"}


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    flags = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    blas = None
    try:
        cfg = np.show_config(mode="dicts")
        info = cfg.get("Build Dependencies", {}).get("blas", {})
        blas = f"{info.get('name', '?')} {info.get('version', '')}".strip()
    except Exception:  # noqa: BLE001 - only descriptive
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "simd": [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags],
        "os": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "numpy_blas": blas,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "blas_threads_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ},
    }


def fmt(x, spec=".2f") -> str:
    return "—" if x is None else format(x, spec)


def markdown(res: dict) -> str:
    m = res["machine"]
    out = [
        f"# CPU benchmark, {res['date']}",
        "",
        f"{m['cpu']}, {m['cores']} cores ({', '.join(m['simd'])}); onnxruntime {m['onnxruntime']} "
        f"(intra-op threads {res['settings']['ort_threads']}, sequential, all optimizations), "
        f"numpy {m['numpy']} ({m['numpy_blas']}). Load average at the start: "
        f"{', '.join(str(x) for x in m['load_average_at_start'])}. Median of up to {res['settings']['runs']} runs "
        f"after {res['settings']['warmup']} warm-up runs; per model {res['settings'].get('rounds', 1)} alternating "
        "rounds (onnxruntime, tilec), each side the median of its rounds. Ratio = tilec / reference "
        "(latency: < 1 is faster than onnxruntime; GFLOP/s: > 1 is faster than numpy).",
        "",
        "## Models",
        "",
    ]
    base = res["settings"].get("baseline")
    if res["settings"].get("hogs"):
        out += [f"Beside {res['settings']['hogs']} CPU-bound process(es) (busy loops) during every measurement.", ""]
    if base:
        out += [f"Baseline: `{base}`, timed in the same rounds (onnxruntime, tilec, baseline).", ""]
        out += [
            "| model | tilec ms | baseline ms | onnxruntime ms | tilec / ort | baseline / ort | tilec / baseline | note |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
    else:
        out += [
            "| model | tilec ms | onnxruntime ms | tilec / ort | onnxruntime fastest ms | note |",
            "| --- | ---: | ---: | ---: | ---: | --- |",
        ]
    for r in res["models"]:
        # The first line of each error (the full text is in the JSON).
        note = "; ".join(
            f"{side}: {r[side + '_error'].split(' / ')[0][:120]}".replace("|", "\\|")
            for side in ("tilec", "ort", "baseline")
            if r.get(side + "_error")
        )
        if base:
            out.append(
                f"| {r['name']} | {fmt(r['tilec_ms'])} | {fmt(r.get('baseline_ms'))} | {fmt(r['ort_ms'])} "
                f"| {fmt(r['ratio'])} | {fmt(r.get('baseline_ratio'))} | {fmt(r.get('tilec_over_baseline'))} | {note} |"
            )
        else:
            out.append(
                f"| {r['name']} | {fmt(r['tilec_ms'])} | {fmt(r['ort_ms'])} | {fmt(r['ratio'], '.2f')} "
                f"| {fmt(r.get('ort_best_ms'))} | {note} |"
            )
    if res.get("sgemm"):
        out += [
            "",
            "## SGEMM (n × n × n, f32)",
            "",
            "numpy GFLOP/s: measured in rounds alternating with tilec's (median); numpy alone: its own",
            "separate measurement in the same run.",
            "",
            "| n | tilec GFLOP/s | numpy GFLOP/s | tilec / numpy | numpy alone GFLOP/s |",
            "| ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in res["sgemm"]:
            out.append(
                f"| {r['n']} | {fmt(r['tilec_gflops'], '.1f')} | {fmt(r['numpy_gflops'], '.1f')} "
                f"| {fmt(r['ratio'])} | {fmt(r.get('numpy_separate_gflops', r.get('numpy_gflops')), '.1f')} |"
            )
        if res.get("tilec_sgemm_error"):
            out += ["", f"tilec SGEMM: {res['tilec_sgemm_error']}".replace("\n", " ")]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="timed runs per model (at most; default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up runs per model (default 3)")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timed runs per model and side (default 20)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per model (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (default 2)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="benchmark only these models")
    ap.add_argument("--model", nargs="+", default=[], metavar="NAME=DIR",
                    help="extra model directories (model.onnx + test_data_set_0), e.g. from scripts/export-cnn-models.py")
    ap.add_argument("--zoo", type=Path, nargs="?", const=ROOT / "target" / "zoo", metavar="DIR",
                    help="every model folder in DIR (default target/zoo, from scripts/gen-zoo-models.py), "
                         "instead of the light models and transformers")
    ap.add_argument("--sizes", type=int, nargs="+", default=SGEMM_SIZES, help="SGEMM sizes")
    ap.add_argument("--no-tilec", action="store_true", help="skip tilec (reference figures only)")
    ap.add_argument("--no-ort", action="store_true", help="skip onnxruntime")
    ap.add_argument("--no-sgemm", action="store_true", help="skip the SGEMM comparison")
    ap.add_argument("--tilec", type=Path, default=ROOT / "target" / "release" / "tilec", help="tilec binary")
    ap.add_argument("--tilec-threads", type=int, metavar="N", help="tilec's threads (default: tilec's own, all cores)")
    ap.add_argument("--baseline", type=Path, help="a second tilec binary timed in the same rounds")
    ap.add_argument("--hog", type=int, default=0, metavar="N", help="CPU-bound processes running beside the measurements")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per tilec command")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="output directory")
    args = ap.parse_args()

    ort.set_default_logger_severity(3)  # errors only: no warnings about unused initializers
    date = dt.date.today().isoformat()
    res = {
        "date": date,
        "machine": machine(),
        "settings": {"runs": args.runs, "warmup": args.warmup, "budget_s": args.budget, "ort_threads": args.threads,
                     "tilec_threads": args.tilec_threads, "rounds": args.rounds,
                     "hogs": args.hog, "baseline": str(args.baseline) if args.baseline else None},
        "models": [],
        "sgemm": [],
    }
    dirs = model_dirs()
    if args.zoo:
        if not args.zoo.is_dir():
            ap.error(f"--zoo: {args.zoo} is not a folder (make it with scripts/gen-zoo-models.py)")
        dirs = [(d.name, d.resolve()) for d in sorted(args.zoo.iterdir()) if (d / "model.onnx").is_file()]
    for spec in args.model:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            ap.error(f"--model expects NAME=DIR, got {spec!r}")
        dirs.append((name, Path(path).resolve()))
    if args.only:
        unknown = set(args.only) - {n for n, _ in dirs}
        if unknown:
            ap.error(f"unknown model(s) {sorted(unknown)}; known: {[n for n, _ in dirs]}")
        dirs = [(n, d) for n, d in dirs if n in args.only]

    neighbours = ExitStack()
    neighbours.enter_context(hogs(args.hog))
    for name, d in dirs:
        rec = {"name": name, "path": str(d.relative_to(ROOT)) if d.is_relative_to(ROOT) else str(d), "tilec_ms": None, "ort_ms": None, "ratio": None}
        try:
            inputs = load_inputs(d)
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            rec["ort_error"] = rec["tilec_error"] = f"inputs: {e}"
            res["models"].append(rec)
            print(f"{name:14s} inputs: {e}", file=sys.stderr)
            continue
        runs = args.runs
        # Alternating rounds (onnxruntime, then tilec, again): the machine's speed drifts over
        # minutes, and each side's figure is the median of its rounds' medians.
        ort_rounds, tilec_rounds, base_rounds = [], [], []
        for _ in range(max(1, args.rounds)):
            if not args.no_ort and "ort_error" not in rec:
                try:
                    o = bench_ort(d, inputs, args.threads, args.warmup, args.runs, args.budget)
                    ort_rounds.append(o["ms"])
                    rec["ort_best_ms"] = min(rec.get("ort_best_ms", o["best_ms"]), o["best_ms"])
                    rec["ort_runs"], rec["ort_session_ms"] = o["runs"], o["session_ms"]
                    runs = o["runs"]
                except Exception as e:  # noqa: BLE001
                    rec["ort_error"] = str(e).strip().splitlines()[0][:500] if str(e).strip() else repr(e)
            if not args.no_tilec and "tilec_error" not in rec:
                t = bench_tilec(args.tilec, d, inputs, runs, args.timeout, args.tilec_threads)
                if "error" in t:
                    rec["tilec_error"] = t["error"]
                else:
                    tilec_rounds.append(t.pop("ms"))
                    rec["tilec_runs"] = t.pop("runs")
                    rec["tilec"] = t  # compile_ms and anything else the CLI reports
            if args.baseline and "baseline_error" not in rec:
                t = bench_tilec(args.baseline, d, inputs, runs, args.timeout, args.tilec_threads)
                if "error" in t:
                    rec["baseline_error"] = t["error"]
                else:
                    base_rounds.append(t["ms"])
        if base_rounds:
            rec["baseline_ms"], rec["baseline_rounds_ms"] = statistics.median(base_rounds), base_rounds
        if ort_rounds:
            rec["ort_ms"], rec["ort_rounds_ms"] = statistics.median(ort_rounds), ort_rounds
        if tilec_rounds:
            rec["tilec_ms"], rec["tilec_rounds_ms"] = statistics.median(tilec_rounds), tilec_rounds
        if rec["tilec_ms"] is not None and rec["ort_ms"]:
            rec["ratio"] = rec["tilec_ms"] / rec["ort_ms"]
        if rec.get("baseline_ms") and rec["ort_ms"]:
            rec["baseline_ratio"] = rec["baseline_ms"] / rec["ort_ms"]
        if rec.get("baseline_ms") and rec["tilec_ms"] is not None:
            rec["tilec_over_baseline"] = rec["tilec_ms"] / rec["baseline_ms"]
        res["models"].append(rec)
        print(
            f"{name:14s} ort {fmt(rec['ort_ms']):>9s} ms   tilec {fmt(rec['tilec_ms']):>9s} ms"
            + (f"   baseline {fmt(rec.get('baseline_ms')):>9s} ms" if args.baseline else "")
            + (f"   ({rec['tilec_error'].splitlines()[0][:80]})" if rec.get("tilec_error") else ""),
            file=sys.stderr,
            flush=True,
        )

    if not args.no_sgemm:
        tilec_sgemm = {"error": "skipped (--no-tilec)"} if args.no_tilec else bench_tilec_sgemm(args.timeout)
        if "error" in tilec_sgemm:
            res["tilec_sgemm_error"] = tilec_sgemm["error"]
        by_n = tilec_sgemm.get("by_n", {})
        for n in args.sizes:
            r = {"n": n, "numpy_gflops": None, "tilec_gflops": by_n.get(n), "ratio": None}
            inter = tilec_sgemm.get("numpy_by_n", {}).get(n)
            try:
                npr = bench_numpy_sgemm(n, args.budget / 4)
                r["numpy_gflops"], r["numpy_best_gflops"] = npr["gflops"], npr["best_gflops"]
                r["numpy_ms"], r["numpy_runs"] = npr["ms"], npr["runs"]
            except Exception as e:  # noqa: BLE001
                r["numpy_error"] = str(e)
            if inter is not None:
                # Alternating rounds: the ratio is taken against these, measured beside tilec.
                r["numpy_separate_gflops"] = r["numpy_gflops"]
                r["numpy_gflops"] = inter
                r["numpy_interleaved"] = True
            if r["tilec_gflops"] is not None and r["numpy_gflops"]:
                r["ratio"] = r["tilec_gflops"] / r["numpy_gflops"]
            res["sgemm"].append(r)
            print(
                f"sgemm {n:5d}   numpy {fmt(r['numpy_gflops'], '.1f'):>7s} GFLOP/s   "
                f"tilec {fmt(r['tilec_gflops'], '.1f'):>7s} GFLOP/s",
                file=sys.stderr,
                flush=True,
            )

    neighbours.close()
    args.out.mkdir(parents=True, exist_ok=True)
    jpath = args.out / f"cpu-{date}.json"
    mpath = args.out / f"cpu-{date}.md"
    jpath.write_text(json.dumps(res, indent=2) + "\n")
    mpath.write_text(markdown(res))
    print(f"wrote {jpath.relative_to(ROOT) if jpath.is_relative_to(ROOT) else jpath} and {mpath.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
