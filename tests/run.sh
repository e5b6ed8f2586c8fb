#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what it needs (examples/setup.sh --dev: apt
# packages, and pip into the active virtual environment, else ./.venv), then ruff (lint +
# format), mypy and pytest. Extra arguments go to pytest (e.g. -m "not slurm").
#
#   bash tests/run.sh            everything (what CI runs)
#   bash tests/run.sh --fast     the inner loop: no Slurm, browser, torchrun or other slow tests
set -euo pipefail
cd "$(dirname "$0")/.."

PY=$(bash examples/setup.sh --dev | sed -n 's/^python: //p')
export PATH="$(dirname "$PY"):$PATH"

args=()
for a in "$@"; do
  if [ "$a" = "--fast" ]; then args+=(-m "not slow and not slurm and not browser and not gpu"); else args+=("$a"); fi
done

echo "== ruff" >&2
"$PY" -m ruff check .
"$PY" -m ruff format --check .
# mypy (~90 s of one core, cold) runs beside pytest, whose workers spend much of their time
# waiting on torchrun jobs and slurmctld; its verdict is printed and counted after pytest's.
mypy_log=$(mktemp)
trap 'rm -f "$mypy_log"' EXIT
echo "== mypy (beside pytest; its result follows pytest's)" >&2
bash tests/typecheck.sh >"$mypy_log" 2>&1 &
mypy_pid=$!
echo "== pytest" >&2
# two workers: the Slurm tests (mostly waiting for slurmctld) run beside the others; each module
# is one unit of work, so its shared real runs happen once (tests/conftest.py)
pytest_rc=0
"$PY" -m pytest -n 2 --dist loadscope --no-loadscope-reorder --durations=15 "${args[@]}" || pytest_rc=$?
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
echo "== mypy" >&2
cat "$mypy_log"
if [ "$mypy_rc" -ne 0 ]; then echo "mypy failed (exit $mypy_rc)" >&2; fi
if [ "$pytest_rc" -ne 0 ]; then exit "$pytest_rc"; fi
exit "$mypy_rc"
