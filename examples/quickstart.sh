#!/usr/bin/env bash
# Fresh machine to first profile: install everything (examples/setup.sh), then profile the
# example DDP job on 4 CPU ranks (or 4 GPUs) with rank 2 made slow on purpose.
#
#   bash examples/quickstart.sh            extra arguments go to `rankscope run` before the script
#
# The run folder (per-rank traces, meta.json, run.json, and the merged store and report once
# those steps are installed) is printed at the end, under ./rankscope-runs/.
set -euo pipefail
cd "$(dirname "$0")/.."

bash examples/setup.sh

python -m rankscope run --nproc-per-node 4 --name quickstart "$@" \
  examples/train_ddp.py --steps 20 --straggler-rank 2 --straggler-ms 20
