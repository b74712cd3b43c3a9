#!/usr/bin/env bash
# Create the benchmark venv (.venv-bench) used by bench/cpu.py: onnxruntime
# (the CPU baseline), onnx (to read the test data) and numpy (its BLAS is the
# SGEMM baseline), all pinned, with everything they pull in pinned too.
#
# Kept apart from .venv (scripts/setup-venv.sh) so that the conformance
# toolchain does not depend on onnxruntime. The download is about 25 MB.
#
# Idempotent: the venv is created only if missing, and packages are installed
# only if some pinned version is not already present.
#
# Environment: PYTHON (default python3) is used to create the venv.
set -euo pipefail

PINS=(
    "onnxruntime==1.31.1"
    "onnx==1.23.2"
    "numpy==2.4.6"
    # Pulled in by the three above.
    "flatbuffers==25.12.19"
    "ml_dtypes==0.6.0"
    "packaging==26.4"
    "protobuf==7.36.2"
    "typing_extensions==4.16.0"
)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO_ROOT/.venv-bench"
VPY="$VENV/bin/python"

if [[ ! -x "$VPY" ]]; then
    echo "setup-bench-venv: creating $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi
# Keep the venv out of git without an entry in the repository's .gitignore.
[[ -f "$VENV/.gitignore" ]] || printf '*\n' >"$VENV/.gitignore"

if "$VPY" - "${PINS[@]}" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version

missing = []
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have != want:
        missing.append(f"{pin} (have {have})")
if missing:
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    print("setup-bench-venv: not as pinned: " + ", ".join(missing[:3]) + more)
sys.exit(1 if missing else 0)
PYEOF
then
    echo "setup-bench-venv: $VENV is up to date"
else
    echo "setup-bench-venv: installing pinned packages"
    "$VPY" -m pip install -q "${PINS[@]}"
fi
