"""Where worker processes start to pay: in-process vs a LocalCluster, merge and analyse.

    python benchmarks/scheduler_crossover.py                  # 8 ranks, 3 sizes
    python benchmarks/scheduler_crossover.py --events 250000 1000000

``rankscope merge`` and ``rankscope analyze`` choose in-process work below a size where a
LocalCluster cannot pay for its start-up (``analysis/engine/scheduler.py``: processes when
``T·(1−1/w) > CLUSTER_START_S`` with ``T = events / IN_PROCESS_EVENTS_PER_S`` and ``w`` workers).
This script measures both sides on synthetic 8-rank jobs (``rankscope synth``) of growing size,
whole processes (``--scheduler synchronous`` vs ``--scheduler local``), and prints what the rule
chose for each size, so the constants can be checked on any machine. Figures, not a test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Events one rank-step of the default synthetic job holds (docs/synth.md: 32 ranks × 10 steps
#: = 115,616 events).
EVENTS_PER_RANK_STEP = 361


def rankscope(*args: str) -> float:
    exe = Path(sys.executable).with_name("rankscope")
    argv = [str(exe), *args] if exe.exists() else [sys.executable, "-m", "rankscope", *args]
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"rankscope {args[0]} failed: {proc.stderr[-600:]}")
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, nargs="+", default=[250_000, 1_000_000, 4_000_000])
    args = ap.parse_args(argv)
    from rankscope.analysis.engine.scheduler import ClusterSpec, choose

    load = os.getloadavg()
    print(f"{os.cpu_count()} cores, load average {load[0]:.1f} (1 min)")
    print(
        "| events | merge in-process | merge LocalCluster | analyze in-process | analyze LocalCluster | rule chooses |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="rankscope-crossover-") as tmp:
        for n in args.events:
            steps = max(1, n // (EVENTS_PER_RANK_STEP * args.ranks))
            job = Path(tmp) / f"job-{n}"
            rankscope("synth", str(job), "--ranks", str(args.ranks), "--steps", str(steps))
            row = []
            for what in ("merge", "analyze"):
                for sched in ("synchronous", "local"):
                    store = job / f"{sched}.h5"
                    if what == "merge":
                        row.append(
                            rankscope(
                                "merge", str(job), "-o", str(store), "-q", "--scheduler", sched
                            )
                        )
                    else:
                        row.append(
                            rankscope("analyze", str(job / "synchronous.h5"), "--scheduler", sched)
                        )
            choice = choose(ClusterSpec(main_is_guarded=True), args.ranks, n)
            print(
                f"| {n:,} | {row[0]:.1f} s | {row[1]:.1f} s | {row[2]:.1f} s | {row[3]:.1f} s | {choice.scheduler} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
