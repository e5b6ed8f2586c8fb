"""What the step logs cost the merge (issue 30): the same N-rank run merged with and without a
``steps.bin`` of S steps per rank (prints figures; a figure-printing script, never a timed test).

    python benchmarks/step_logs_merge.py                      # 1024 ranks x 10,000 steps
    python benchmarks/step_logs_merge.py --ranks 64 --log-steps 100000 --rounds 3

The job is ``rankscope synth``'s (2 steps, 1 layer: a small trace per rank, so that what the
step logs add is not hidden under the parsing), laid out as a run directory
(``ranks/NNNNN/window-000.json.gz`` + ``meta.json``, ``run.json``) twice: without step logs (A)
and with one of ``--log-steps`` records per rank (B; the windows are hard links, the same
files). Both are merged in-process with the merge's default scheduler, A B A B …; the best and
median wall seconds of each, and B − A per rank and per record.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from rankscope.launchers import rundir, step_log
from rankscope.orchestrator.ingest.merge import merge_run_dir


def build(work: Path, ranks: int, log_steps: int) -> tuple[Path, Path]:
    """The synth job as two run directories (A: no step logs, B: with them)."""
    job = work / "synth"
    if not (job / "rank-0.json.gz").exists():
        cmd = [sys.executable, "-m", "rankscope", "synth", str(job), "--ranks", str(ranks),
               "--steps", "2", "--layers", "1", "--buckets", "1", "--overwrite"]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    runs = []
    for name, with_logs in (("a", False), ("b", True)):
        run = work / name
        shutil.rmtree(run, ignore_errors=True)
        rundir.write_json_atomic(
            run / rundir.RUN_JSON, {"run_id": name, "world_size": ranks, "state": "completed"}
        )
        for r in range(ranks):
            folder = rundir.rank_dir(run, r)
            folder.mkdir(parents=True)
            os.link(job / f"rank-{r}.json.gz", rundir.window_path(run, r, 0))
            meta = {"rank": r, "world_size": ranks, "host": f"node{r // 8}",
                    "windows": [{"index": 0, "file": rundir.WINDOW_FORMAT.format(window=0)}]}  # fmt: skip
            rundir.write_json_atomic(folder / rundir.META_JSON, meta)
            if with_logs:
                end = 1_700_000_000_000_000_000 + np.arange(1, log_steps + 1) * 100_000_000 + r
                records = np.zeros(log_steps, dtype=np.dtype(step_log.STEP_FIELDS))
                records["steps"] = np.arange(1, log_steps + 1)
                records["end_ns"] = end
                for name in ("wait_ns", "cpu_ns", "runq_ns"):
                    records[name] = step_log.UNKNOWN
                (folder / step_log.STEP_LOG_FILE).write_bytes(step_log.to_bytes(records))
        runs.append(run)
    return runs[0], runs[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--log-steps", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/rs-step-logs"))
    args = parser.parse_args()
    a, b = build(args.work, args.ranks, args.log_steps)
    times: dict[str, list[float]] = {"a": [], "b": []}
    for _ in range(args.rounds):
        for name, run in (("a", a), ("b", b)):
            t0 = time.perf_counter()
            merge_run_dir(run, quiet=True)
            times[name].append(time.perf_counter() - t0)
    size = sum(p.stat().st_size for p in b.glob("ranks/*/steps.bin"))
    for name, label in (("a", "without step logs"), ("b", "with step logs")):
        t = times[name]
        print(f"{label:>18}: best {min(t):.2f} s, median {statistics.median(t):.2f} s ({t})")
    extra = min(times["b"]) - min(times["a"])
    records = args.ranks * args.log_steps
    print(
        f"{args.ranks} ranks x {args.log_steps:,} steps ({size / 2**20:.0f} MiB of steps.bin): "
        f"+{extra:.2f} s best-to-best, {extra / args.ranks * 1e3:.2f} ms per rank, "
        f"{extra / records * 1e9:.0f} ns per record; store "
        f"{(a / rundir.STORE_NAME).stat().st_size / 2**20:.1f} → "
        f"{(b / rundir.STORE_NAME).stat().st_size / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
