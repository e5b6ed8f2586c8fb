#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what it needs (apt + pip), then
# ruff (lint + format), mypy and pytest. Extra arguments go to pytest (e.g. -m "not slurm").
#
#   bash tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."

bash examples/setup.sh --dev

echo "== ruff" >&2
ruff check .
ruff format --check .
echo "== mypy" >&2
bash tests/typecheck.sh
echo "== pytest" >&2
python -m pytest "$@"
