#!/usr/bin/env bash
# mypy over the one `rankscope` namespace. setuptools maps the top-level folders into it
# (package-dir), which mypy cannot follow; a throw-away link tree in .typecheck/ gives mypy the
# installed layout without depending on how the package was installed.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=.typecheck/rankscope
rm -rf .typecheck && mkdir -p "$tree"
for f in package/*.py package/py.typed; do ln -s "$PWD/$f" "$tree/"; done
for d in orchestrator launchers analysis slurm; do cp -rs "$PWD/$d" "$tree/$d"; done
find "$tree" -name __pycache__ -prune -exec rm -rf {} +
MYPYPATH=.typecheck mypy -p rankscope "$@"
