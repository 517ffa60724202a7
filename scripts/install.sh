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
# The browser test of `jfa-prof report` (tests/test_report.py) opens the page in headless
# Chromium; it skips without one. Installed only where asked for (JFA_PROF_BROWSER_TESTS=1, or CI),
# only through apt-get, only when missing; a failed install leaves that one test skipping.
if [ "${JFA_PROF_BROWSER_TESTS:-}" = "1" ] || [ "${CI:-}" = "true" ]; then
  if command -v apt-get >/dev/null 2>&1 && ! command -v chromium >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium; } \
      || echo "could not install chromium: the browser test will be skipped" >&2
  fi
fi
