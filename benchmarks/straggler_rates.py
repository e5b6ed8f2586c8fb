"""How often rankscope names a straggler that is not there, and misses one that is: real runs.

    python benchmarks/straggler_rates.py                       # 30 runs per condition, 4 ranks
    python benchmarks/straggler_rates.py --runs 10 --keep /tmp/rates   # keep the run folders
    python benchmarks/straggler_rates.py --only-analyze /tmp/rates     # re-analyse kept runs

Four conditions, each ``--runs`` real ``rankscope run`` of ``examples/train_ddp.py`` (torchrun,
gloo, ``--nproc-per-node 4``, the default schedule: 3 recorded steps):

* **balanced** — no injection; every straggler named is a false one;
* **straggler** — one rank (rank ``i mod 4`` in run ``i``) does ``--straggler-ms`` of extra
  compute per step; the verdict is right when exactly that rank is named, as the top straggler;

each with **0** and **1 busy loops** (``python -c 'while 1: pass'``) started before the run and
killed after it, competing with the 4 ranks for this machine's cores: the CPU contention of a
shared node, which moves "last" around between ranks.

All runs of all conditions are recorded first (interleaved: condition after condition, so a slow
period of the machine hits every condition alike), then analysed in this process. Printed: one
row per condition (runs, false stragglers, injected found / exactly found, the causes named), and
the runs that went wrong. docs/analysis.md records the output. A benchmark, never a test: its
trials take ~15 s each.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
RANKS = 4
#: (name, injected, busy loops)
CONDITIONS = (
    ("balanced-0", False, 0),
    ("straggler-0", True, 0),
    ("balanced-1", False, 1),
    ("straggler-1", True, 1),
)
#: What a busy loop runs: one core's worth of pure Python, as a noisy neighbour would.
BUSY_LOOP = "while 1: pass"


def record(out: Path, name: str, straggler: int, ms: float, busy: int, steps: int) -> Path | None:
    """One run (no analysis), with ``busy`` busy loops beside it; None when the run failed."""
    cmd = [
        sys.executable, "-m", "rankscope.orchestrator", "run",
        "--nproc-per-node", str(RANKS), "--out", str(out), "--name", name, "--no-analyze",
        str(EXAMPLE), "--steps", str(steps),
    ]  # fmt: skip
    if straggler >= 0:
        cmd += ["--straggler-rank", str(straggler), "--straggler-ms", str(ms)]
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    runs = [p for p in out.iterdir() if p.is_dir() and f"-{name}-" in p.name]
    if proc.returncode != 0 or len(runs) != 1:
        print(f"  run {name} failed (exit {proc.returncode}): {proc.stderr[-500:]}", flush=True)
        return None
    (runs[0] / "bench.json").write_text(json.dumps({"straggler": straggler, "busy": busy}))
    return runs[0]


def verdict(run: Path) -> tuple[list[int], list[str]]:
    """The ranks named as stragglers (top first) and their causes."""
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    s = analyze(run, ClusterSpec(scheduler=SYNCHRONOUS)).stragglers
    named = s[s["is_straggler"]]
    return [int(r) for r in named["rank"]], [str(c) for c in named["cause"]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30, help="runs per condition")
    p.add_argument("--straggler-ms", type=float, default=20.0, help="injected extra compute")
    p.add_argument("--steps", type=int, default=8, help="training steps per run")
    p.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    p.add_argument("--only-analyze", type=Path, default=None, help="analyse kept runs only")
    p.add_argument(
        "--first", type=int, default=0, help="number of the first round (to add runs to --keep)"
    )
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = args.only_analyze or args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        if args.only_analyze is None:
            t0 = time.monotonic()
            for i in range(args.first, args.first + args.runs):
                for name, injected, busy in CONDITIONS:
                    rank = i % RANKS if injected else -1
                    record(out, f"{name}-{i:03d}", rank, args.straggler_ms, busy, args.steps)
                print(
                    f"recorded round {i + 1}/{args.runs} ({time.monotonic() - t0:.0f} s)",
                    flush=True,
                )
        rows: dict[str, collections.Counter[str]] = {
            c[0]: collections.Counter() for c in CONDITIONS
        }
        causes: dict[str, collections.Counter[str]] = {
            c[0]: collections.Counter() for c in CONDITIONS
        }
        wrong: list[str] = []
        for run in sorted(p for p in out.iterdir() if (p / "bench.json").is_file()):
            facts = json.loads((run / "bench.json").read_text())
            cond = f"{'straggler' if facts['straggler'] >= 0 else 'balanced'}-{facts['busy']}"
            named, why = verdict(run)
            row = rows[cond]
            row["runs"] += 1
            causes[cond].update(why)
            if facts["straggler"] < 0:
                row["false"] += len(named)
                row["runs with a false straggler"] += bool(named)
                if named:
                    wrong.append(f"{run.name}: named {named} ({', '.join(why)})")
            else:
                truth = int(facts["straggler"])
                row["found"] += truth in named
                row["exactly"] += named == [truth]
                row["false"] += len([r for r in named if r != truth])
                if named != [truth]:
                    wrong.append(f"{run.name}: truth [{truth}], named {named} ({', '.join(why)})")
    print()
    print(
        "| condition | runs | false stragglers named | injected found | exactly it | causes named |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for name, injected, _ in CONDITIONS:
        r = rows[name]
        found = f"{r['found']} of {r['runs']}" if injected else "—"
        exact = f"{r['exactly']} of {r['runs']}" if injected else "—"
        why = ", ".join(f"{c} {n}" for c, n in causes[name].most_common()) or "—"
        print(f"| {name} busy loop(s) | {r['runs']} | {r['false']} | {found} | {exact} | {why} |")
    if wrong:
        print("\nruns whose verdict was not the truth:")
        for line in wrong:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
