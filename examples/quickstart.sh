#!/usr/bin/env bash
# Fresh machine to first profile: install everything (examples/setup.sh: into the active virtual
# environment, else ./.venv), then profile the example DDP job on 4 CPU ranks (or 4 GPUs) with
# rank 2 made slow on purpose.
#
#   bash examples/quickstart.sh            extra arguments go to `rankscope run` before the script
#
# The run folder (per-rank traces, meta.json, run.json, the merged store and the report) is
# printed at the end, under ./rankscope-runs/.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=$(bash examples/setup.sh | sed -n 's/^python: //p')

"$PY" -m rankscope run --nproc-per-node 4 --name quickstart "$@" \
  examples/train_ddp.py --steps 20 --straggler-rank 2 --straggler-ms 20
