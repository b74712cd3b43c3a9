"""How tilec's CPU layer benchmarks time both sides. onnxruntime: a session with `threads`
intra-op threads, sequential, every graph optimization, on the CPU provider; a few untimed
runs, then the median of `runs` timed ones in milliseconds. tilec: `tilec run --bench` on the
same model and input file, its JSON line's median."""
from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def ort_median_ms(path: Path, feeds: dict[str, np.ndarray], threads: int, runs: int, warmup: int = 3) -> float:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(warmup):
        s.run(None, feeds)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        s.run(None, feeds)
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def tilec_median_ms(binary: Path, path: Path, xfile: Path, runs: int) -> float:
    """`binary run path --input x=xfile --bench runs`: the median in milliseconds (NaN when the
    run fails or prints no JSON line)."""
    out = subprocess.run([str(binary), "run", str(path), "--input", f"x={xfile}", "--bench", str(runs), "--json"],
                         capture_output=True, text=True, timeout=600)
    try:
        return float(json.loads(out.stdout.strip().splitlines()[-1])["median_ms"])
    except (ValueError, KeyError, IndexError):
        return float("nan")
