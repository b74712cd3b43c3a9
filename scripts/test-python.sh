#!/usr/bin/env bash
# Builds the Python package (crates/tilec-py, python/tilec) into .venv-py and runs its tests
# (tests/python) with pytest.
#
# .venv-py holds pytest, maturin and the package. PyTorch, transformers and onnxruntime come
# from .venv-export (scripts/setup-export-venv.sh: pinned, about 3.1 GB to download on the
# first run, then reused), which .venv-py sees through a .pth file, so the large venv exists
# once. TILEC_PY_TORCH=0 skips it: the torch and onnxruntime tests are then reported as
# skipped, with the reason.
#
# Idempotent: venvs are created only if missing and packages installed only if not as pinned;
# the package is rebuilt every run (cargo reuses the workspace's build).
#
# Environment: PYTHON (default python3) creates the venvs; PYTEST_ARGS are passed to pytest.
set -euo pipefail

PYTEST_VERSION="9.2.0"
MATURIN_VERSION="1.16.0"
NUMPY_VERSION="2.4.6"
ONNX_VERSION="1.23.2"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="$REPO_ROOT/.venv-py"
VPY="$VENV/bin/python"

if [[ "${TILEC_PY_TORCH:-1}" != 0 ]]; then
    scripts/setup-export-venv.sh
fi

if [[ ! -x "$VPY" ]]; then
    echo "test-python: creating $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi
if ! "$VPY" - "$PYTEST_VERSION" "$MATURIN_VERSION" "$NUMPY_VERSION" "$ONNX_VERSION" >/dev/null 2>&1 <<'PY'
import sys
from importlib.metadata import version
want = dict(zip(["pytest", "maturin", "numpy", "onnx"], sys.argv[1:5]))
sys.exit(0 if all(version(k) == v for k, v in want.items()) else 1)
PY
then
    echo "test-python: installing pytest, maturin, numpy and onnx into $VENV"
    "$VPY" -m pip install -q "pytest==$PYTEST_VERSION" "maturin==$MATURIN_VERSION" \
        "numpy==$NUMPY_VERSION" "onnx==$ONNX_VERSION"
fi

# torch and friends from .venv-export, after .venv-py's own packages on sys.path.
site="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ "${TILEC_PY_TORCH:-1}" != 0 ]]; then
    export_site="$(.venv-export/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$export_site" >"$site/tilec-export-venv.pth"
    # The torch tests must run here, not be skipped: fail now if their packages do not import.
    "$VPY" -c 'import torch, torchvision, transformers, onnxruntime, onnxscript' || {
        echo "test-python: torch, torchvision, transformers or onnxruntime does not import from .venv-export" >&2
        exit 1
    }
else
    rm -f "$site/tilec-export-venv.pth"
fi

# The maturin build backend runs the `maturin` command from PATH.
export PATH="$VENV/bin:$PATH"
echo "test-python: building and installing the package"
start=$(date +%s)
"$VPY" -m pip install -q --no-build-isolation --force-reinstall --no-deps .
echo "test-python: installed in $(( $(date +%s) - start )) s"

# From tests/python, so that `import tilec` is the installed package, not python/tilec.
cd tests/python
# shellcheck disable=SC2086
"$VPY" -m pytest -rs ${PYTEST_ARGS:-}
