"""onnxruntime's time for a model, the way tilec's CPU benchmarks time their peer: a session
with `threads` intra-op threads, sequential, every graph optimization, on the CPU provider;
a few untimed runs, then the median of `runs` timed ones in milliseconds."""
from __future__ import annotations

import statistics
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
