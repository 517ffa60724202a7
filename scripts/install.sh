#!/usr/bin/env bash
# Installs jfa-prof into the current Python environment.
# fbtriton (TLX) and upstream `triton` both own the `triton/` package, so upstream triton must
# never be installed beside it. A CUDA build of torch from PyPI pulls upstream triton in; on a
# machine without an NVIDIA GPU we therefore install the CPU build of torch first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v nvidia-smi >/dev/null 2>&1 && ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[dev]"
# If a torch install dragged upstream triton in, put fbtriton's files back on top of it.
if "$PY" -m pip show triton >/dev/null 2>&1; then
  echo "upstream triton found beside fbtriton: removing it and reinstalling fbtriton" >&2
  "$PY" -m pip uninstall -q -y triton
  "$PY" -m pip install -q --force-reinstall --no-deps "fbtriton==3.7.4"
fi
