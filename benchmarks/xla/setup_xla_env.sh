#!/usr/bin/env bash
# Build a separate virtual environment for the XLA checks (benchmarks/xla/xla_checks.py).
#
#   bash benchmarks/xla/setup_xla_env.sh            # builds ./.venv-xla
#   VENV=/some/where bash benchmarks/xla/setup_xla_env.sh
#
# torch_xla 2.9.0 needs torch 2.9.0 exactly; the project's own venv (.venv) runs a newer torch,
# so the XLA stack lives in its own venv and .venv is never touched.  torch 2.9.0 from PyPI is the
# CUDA build (several GB with its nvidia-* wheels): check free disk first.  composer_bridge goes in
# with --no-deps (editable, so the checks see the working tree), then Lightning and torchmetrics
# under a pin that keeps torch at 2.9.0.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-xla}
PYTHON=${PYTHON:-python3}

need_gb=10
free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1024 / 1024)}')
echo "free disk here: ${free_gb} GB (need about ${need_gb} GB)"
if [ "$free_gb" -lt "$need_gb" ]; then
    echo "not enough disk for torch 2.9.0 + torch_xla 2.9.0: free ${free_gb} GB, need ${need_gb} GB" >&2
    exit 1
fi

"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --upgrade pip
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
echo "torch==2.9.0" > "$pins"
"$VENV/bin/python" -m pip install -c "$pins" "torch==2.9.0" "torch_xla==2.9.0"
"$VENV/bin/python" -m pip install -c "$pins" "lightning>=2.5,<2.7" "torchmetrics>=1.0" numpy
"$VENV/bin/python" -m pip install --no-deps -e .
"$VENV/bin/python" - <<'PY'
import os
os.environ.setdefault("PJRT_DEVICE", "CPU")
import lightning
import torch
import torch_xla
import torch_xla.core.xla_model as xm

import composer_bridge

print("torch", torch.__version__, "torch_xla", torch_xla.__version__, "lightning", lightning.__version__)
print("xla device:", torch_xla.device(), "composer_bridge from", os.path.dirname(composer_bridge.__file__))
PY
echo "XLA venv ready: PJRT_DEVICE=CPU $VENV/bin/python benchmarks/xla/xla_checks.py"
