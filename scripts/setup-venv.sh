#!/usr/bin/env bash
# Create the repo's Python venv (.venv) with the pinned ONNX toolchain and
# generate the ONNX conformance test data into testdata/gen.
#
# Idempotent: the venv is created only if missing, packages are installed only
# if the pinned versions are not already present, and test data is regenerated
# only when testdata/gen/.complete is missing or does not match the current
# gen-testdata.py (its sha256) and pins.
#
# Environment: PYTHON (default python3) is used to create the venv.
set -euo pipefail

ONNX_VERSION="1.23.2"
NUMPY_VERSION="2.4.6"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO_ROOT/.venv"
VPY="$VENV/bin/python"
GEN_SCRIPT="$REPO_ROOT/scripts/gen-testdata.py"
GEN_OUT="$REPO_ROOT/testdata/gen"
STAMP="$GEN_OUT/.complete"

if [[ ! -x "$VPY" ]]; then
    echo "setup-venv: creating $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi

if ! "$VPY" - "$ONNX_VERSION" "$NUMPY_VERSION" >/dev/null 2>&1 <<'EOF'
import sys
import numpy
import onnx
sys.exit(0 if (onnx.__version__, numpy.__version__) == tuple(sys.argv[1:3]) else 1)
EOF
then
    echo "setup-venv: installing onnx==$ONNX_VERSION numpy==$NUMPY_VERSION"
    "$VPY" -m pip install -q "onnx==$ONNX_VERSION" "numpy==$NUMPY_VERSION"
fi

script_sha="$("$VPY" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$GEN_SCRIPT")"
stamp_text="$script_sha  scripts/gen-testdata.py onnx==$ONNX_VERSION numpy==$NUMPY_VERSION"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$stamp_text" ]]; then
    echo "setup-venv: testdata/gen is up to date"
else
    echo "setup-venv: generating test data into $GEN_OUT"
    rm -f "$STAMP"
    "$VPY" "$GEN_SCRIPT" --out "$GEN_OUT"
    printf '%s\n' "$stamp_text" >"$STAMP.tmp"
    mv "$STAMP.tmp" "$STAMP"
fi
