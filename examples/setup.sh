#!/usr/bin/env bash
# Install rankscope and everything it needs on this machine (idempotent).
#
#   bash examples/setup.sh          runtime: torch (CPU wheel when there is no GPU), rankscope
#   bash examples/setup.sh --dev    + test tools, faketime, Chromium, Slurm packages
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=0
[ "${1:-}" = "--dev" ] && DEV=1
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

if [ "$DEV" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  for p in faketime chromium chromium-driver; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    echo "== apt-get install ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null
    apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${need[@]}" >/dev/null
  fi
fi

# torch: the CPU wheel (from local disk here, seconds) unless a GPU is present; a plain
# `torch` requirement could pull a multi-GB CUDA build.
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q torch
  else
    python -m pip install -q torch==2.13.0 || python -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  fi
fi
if [ "$DEV" = 1 ]; then
  # mypy follows the package-dir layout through tests/typecheck.sh, so a plain editable
  # install (new modules importable at once) serves both development and the tests.
  python -m pip install -q -e ".[dev]"
else
  python -m pip install -q -e .
fi
