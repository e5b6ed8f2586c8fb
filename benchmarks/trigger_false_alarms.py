"""False alarms of the live monitor: steady runs must notice no change and trigger no window.

    python benchmarks/trigger_false_alarms.py                 # 10 quiet + 10 with a busy core
    python benchmarks/trigger_false_alarms.py --tries 3 --steps 200

Each try is a real ``rankscope run`` (torchrun, gloo, ``--ranks`` ranks) of
``examples/train_ddp.py`` with no slow rank: every rank waits ``--input-delay-ms`` in its data
loader and computes a small MLP, ``--steps`` steps, no scheduled window in the run
(``--skip-first``), so every step is judged. The second series starts a busy loop pinned to
one core (``python -c 'while True: pass'``) BEFORE each run and ends it after: the run is
slower and noisier throughout, which is no change. A try fails when ``RUN/changes.jsonl`` holds
any line (or ``RUN/trigger.json`` exists). Prints one line per try (its median step time and
what was noticed) and the totals; figures go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tries", type=int, default=10, help="runs per series")
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument(
        "--input-delay-ms",
        type=float,
        default=80.0,
        help="data-loader wait per step (ms): 80 gives the ~90 ms steps of tests/test_live.py",
    )
    return p.parse_args()


def busy_core() -> subprocess.Popen[bytes]:
    """A busy loop pinned to core 0 (started before the run: a steady load, not a change)."""
    code = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def one_try(args: argparse.Namespace, out: Path, busy: bool) -> tuple[float, list[str]]:
    """One run: (median job step time in ms, the sentences of the changes noticed)."""
    loop = busy_core() if busy else None
    try:
        cmd = [
            sys.executable, "-m", "rankscope", "run", "--nproc-per-node", str(args.ranks),
            "--skip-first", str(args.steps * 10), "--no-merge", "--no-analyze", "--no-live",
            "--out", str(out), str(EXAMPLE), "--steps", str(args.steps), "--hidden", "32",
            "--layers", "1", "--batch-size", "8", "--input-delay-ms", str(args.input_delay_ms),
        ]  # fmt: skip
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    finally:
        if loop is not None:
            os.kill(loop.pid, signal.SIGKILL)
            loop.wait()
    if proc.returncode != 0:
        sys.exit(f"run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    import numpy as np
    from rankscope.analysis.compute.step_changes import job_step_ms
    from rankscope.launchers import rundir, step_log

    ends = [
        step_log.read_steps(rundir.rank_dir(run_dir, r) / step_log.STEP_LOG_FILE)["end_ns"]
        for r in range(args.ranks)
    ]
    n = min(len(e) for e in ends)
    median = float(np.median(job_step_ms(np.stack([e[:n] for e in ends]))))
    changes = run_dir / rundir.CHANGES_FILE
    said = (
        [json.loads(line)["sentence"] for line in changes.read_text().splitlines()]
        if (changes.is_file())
        else []
    )
    if (run_dir / rundir.TRIGGER_FILE).exists() and not said:
        said.append("trigger.json without a change")
    return median, said


def main() -> None:
    args = parse_args()
    totals: dict[str, list[int]] = {}
    for label, busy in (("quiet", False), ("busy core", True)):
        fired = []
        medians = []
        for i in range(args.tries):
            with tempfile.TemporaryDirectory(prefix="rankscope-false-alarms-") as tmp:
                median, said = one_try(args, Path(tmp), busy)
            fired.append(1 if said else 0)
            medians.append(median)
            print(
                f"{label} try {i + 1}/{args.tries}: median step {median:.1f} ms; "
                + ("; ".join(said) if said else "nothing noticed"),
                flush=True,
            )
        totals[label] = fired
        print(
            f"{label}: {sum(fired)} of {args.tries} runs noticed a change "
            f"(median step {statistics.median(medians):.1f} ms)",
            flush=True,
        )
    print(
        f"\n{args.ranks} ranks, {args.steps} steps, input delay {args.input_delay_ms} ms: "
        + ", ".join(
            f"{k}: {args.tries - sum(v)} of {args.tries} triggered nothing"
            for k, v in totals.items()
        )
    )


if __name__ == "__main__":
    main()
