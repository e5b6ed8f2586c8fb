#!/usr/bin/env bash
# Install rankscope and everything it needs into a Python virtual environment (idempotent).
#
#   bash examples/setup.sh          runtime: torch (CPU wheel when there is no GPU), rankscope
#   bash examples/setup.sh --dev    + test tools, faketime, Chromium, Node.js (a browser formatter test)
#
# Where: the active virtual environment ($VIRTUAL_ENV) when there is one, else ./.venv (created
# here). Never the interpreter's own site-packages: a package that happens to be installed there
# must not hide a dependency that pyproject.toml forgot. Prints the interpreter it installed for
# as its last line (`python: PATH`); examples/quickstart.sh and tests/run.sh use it.
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=0
[ "${1:-}" = "--dev" ] && DEV=1
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  PY="$VIRTUAL_ENV/bin/python"
else
  if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv (activate it with: . .venv/bin/activate)" >&2
    python3 -m venv .venv
  fi
  PY="$PWD/.venv/bin/python"
fi

# pip, without its "Location 'file://…' is ignored" lines for index folders that a machine's pip
# configuration names but does not have (noise on every install; real warnings still show)
pip_install() {
  "$PY" -m pip install -q "$@" 2> >(grep -v "^WARNING: Location 'file://.*' is ignored" >&2)
}

if [ "$DEV" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  for p in faketime chromium chromium-driver nodejs; do
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
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "== pip install torch" >&2
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    pip_install torch
  else
    pip_install torch==2.13.0 || pip_install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  fi
fi
echo "== pip install -e ." >&2
if [ "$DEV" = 1 ]; then
  # mypy follows the package-dir layout through tests/typecheck.sh, so a plain editable
  # install (new modules importable at once) serves both development and the tests.
  pip_install -e ".[dev]"
else
  pip_install -e .
fi
echo "python: $PY"
