#!/usr/bin/env bash
# Create the model-export venv (.venv-export) used by scripts/gen-models.py:
# PyTorch, torchvision, transformers, onnxscript (the dynamo ONNX exporter's backend), onnx
# and onnxruntime (to cross-check the exported models), all pinned.
#
# Kept apart from .venv (scripts/setup-venv.sh) because it is large: the only
# x86_64 Linux torch wheel on PyPI is the CUDA build, whose libraries link
# against the nvidia-* / cuda-* wheels it depends on, so a CPU-only install is
# not possible from PyPI. The download is about 3.1 GB (torch 0.54 GB, CUDA
# libraries and triton about 2.5 GB) and the venv takes about 5.7 GB on disk.
# Nothing here needs a GPU; everything runs on the CPU.
#
# Only needed to regenerate models/; the committed models do not need it.
#
# Idempotent: the venv is created only if missing, and packages are installed
# only if some pinned version is not already present.
#
# Environment: PYTHON (default python3) is used to create the venv.
set -euo pipefail

# Direct requirements.
PINS=(
    "torch==2.15.0"
    "transformers==5.23.0"
    "onnxscript==0.7.2"
    "onnx==1.23.2"
    "numpy==2.4.6"
    "onnxruntime==1.31.1"
    "torchvision==0.29.2"
)
# Everything they pull in, pinned too so the export is reproducible.
PINS+=(
    "annotated-doc==0.0.7"
    "annotated-types==0.8.0"
    "anyio==4.16.0"
    "click==8.5.1"
    "cuda-bindings==13.5.0"
    "cuda-pathfinder==1.9.1"
    "cuda-toolkit==13.2.2"
    "filelock==4.3.1"
    "flatbuffers==25.12.19"
    "fsspec==2026.9.0"
    "h11==0.16.0"
    "hf-xet==1.8.0"
    "httpcore2==2.16.2"
    "httpx2==2.16.2"
    "huggingface_hub==2.4.0"
    "idna==3.20"
    "Jinja2==3.1.6"
    "markdown-it-py==4.3.0"
    "MarkupSafe==3.0.4"
    "mdurl==0.1.2"
    "ml_dtypes==0.6.0"
    "mpmath==1.3.0"
    "networkx==3.6.1"
    "nvidia-cublas==13.4.1.3"
    "nvidia-cuda-cccl==13.3.5.0.6"
    "nvidia-cuda-cupti==13.2.86"
    "nvidia-cuda-nvrtc==13.2.86"
    "nvidia-cuda-runtime==13.2.86"
    "nvidia-cudnn-cu13==9.26.0.51"
    "nvidia-cufft==12.2.0.57"
    "nvidia-cufile==1.17.1.22"
    "nvidia-cusolver==12.2.0.11"
    "nvidia-cusparse==12.7.10.12"
    "nvidia-cusparselt-cu13==0.8.1"
    "nvidia-nccl-cu13==2.30.7"
    "nvidia-nvjitlink==13.5.37"
    "nvidia-nvshmem-cu13==3.7.2"
    "nvidia-nvtx==13.2.86"
    "onnx-ir==1.1.0"
    "packaging==26.4"
    "protobuf==7.36.2"
    "pydantic==2.14.4"
    "pydantic_core==2.50.5"
    "Pygments==2.21.0"
    "pillow==13.0.0"
    "PyYAML==6.0.4"
    "regex==2026.11.19"
    "rich==15.0.0"
    "safetensors==0.8.0"
    "setuptools==84.2.1"
    "shellingham==1.5.4"
    "sympy==1.14.0"
    "tokenizers==0.23.3"
    "tqdm==4.70.1"
    "triton==3.9.0"
    "truststore==0.10.5"
    "typer==0.29.2"
    "typing-inspection==0.4.5"
    "typing_extensions==4.16.0"
)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO_ROOT/.venv-export"
VPY="$VENV/bin/python"

if [[ ! -x "$VPY" ]]; then
    echo "setup-export-venv: creating $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi

if "$VPY" - "${PINS[@]}" <<'EOF'
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
    print("setup-export-venv: not as pinned: " + ", ".join(missing[:3]) + more)
sys.exit(1 if missing else 0)
EOF
then
    echo "setup-export-venv: $VENV is up to date"
else
    echo "setup-export-venv: installing pinned packages (about 3.1 GB to download on first install)"
    "$VPY" -m pip install -q "${PINS[@]}"
fi
