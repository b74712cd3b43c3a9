#!/usr/bin/env bash
# Alternating rounds: the host side of a CUDA compile (prepare_cuda, best of 5 per round) for
# the build before and after, at both shapes, with onnxruntime's session creation (CPU, all
# graph optimizations) on the same model in the same round. Usage:
#   rounds.sh MODEL.onnx BEFORE_BIN AFTER_BIN ROUNDS > log
set -u
model=$1; before=$2; after=$3; rounds=${4:-3}
py=${PY:-.venv-bench/bin/python}
for r in $(seq 1 "$rounds"); do
  for shape in "8 512" "1 128"; do
    set -- $shape
    for which in before after; do
      bin=$before; [ "$which" = after ] && bin=$after
      echo "round $r b${1}s${2} $which load $(cut -d' ' -f1-3 /proc/loadavg)"
      "$bin" "$model" --dim batch=$1 --dim seq=$2 --reps 5 | grep -E "^best|^import"
    done
  done
  echo "round $r onnxruntime load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$py" - "$model" <<'PY'
import sys, time
import onnxruntime as ort
best = None
for _ in range(3):
    t = time.perf_counter()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
    ms = (time.perf_counter() - t) * 1e3
    best = ms if best is None else min(best, ms)
print(f"onnxruntime session (load + optimize) best of 3: {best:.1f} ms")
PY
done
