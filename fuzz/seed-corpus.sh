#!/usr/bin/env bash
# Seeds fuzz/corpus/import with the conformance models (run scripts/setup-venv.sh first):
# the ONNX light models and every node-test model.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GEN="$ROOT/testdata/gen"
OUT="$ROOT/fuzz/corpus/import"
if [[ ! -d "$GEN/node" ]]; then
    echo "seed-corpus: $GEN is missing; run scripts/setup-venv.sh first" >&2
    exit 1
fi
mkdir -p "$OUT"
n=0
for kind in light node; do
    for m in "$GEN/$kind"/*/model.onnx; do
        cp "$m" "$OUT/${kind}_$(basename "$(dirname "$m")").onnx"
        n=$((n + 1))
    done
done
echo "seed-corpus: $n models in $OUT"
