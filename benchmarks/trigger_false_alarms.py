"""False alarms of the live monitor: steady runs must trigger no window.

    python benchmarks/trigger_false_alarms.py                 # 10 quiet + 10 with a busy core
    python benchmarks/trigger_false_alarms.py --tries 3 --steps 200 --keep /tmp/alarms

Each try is a real ``rankscope run`` (torchrun, gloo, ``--ranks`` ranks) of
``examples/train_ddp.py`` with no slow rank: every rank waits ``--input-delay-ms`` in its data
loader and computes a small MLP, ``--steps`` steps, no scheduled window in the run
(``--skip-first``), so every step is judged. The second series starts a busy loop pinned to
one core (``python -c 'while True: pass'``) BEFORE each run and ends it after: the run is
slower and noisier throughout, which is no change of the job.

Per try it counts what the monitor did, by kind: the windows it triggered (``trigger.json``,
``changes.jsonl`` ``trigger``: what a steady run must never do), the changes it noticed of the
job or one rank (``job`` / ``rank``) and the ones it put down to the host's CPU contention
(``host``: said, never profiled). It also replays the step logs offline: the first step at which
the rise rule alone (without the host's attribution, the rule before it) fires, and what the
ranks' run-queue delays and the stolen time (``/proc/stat``, sampled every 50 ms by this
script) say of that rise: the job's step time and the host's delay per step (ms, medians of
the baseline and of the window). ``--keep DIR`` keeps every try's step logs, changes and
steal samples. Figures go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"
#: Seconds between two samples of /proc/stat's steal.
STEAL_EVERY_S = 0.05


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
    p.add_argument("--keep", type=Path, default=None, help="keep each try's logs under DIR")
    p.add_argument("--series", choices=("both", "quiet", "busy"), default="both")
    return p.parse_args()


def busy_core() -> subprocess.Popen[bytes]:
    """A busy loop pinned to core 0 (started before the run: a steady load, not a change)."""
    code = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


class StealSampler(threading.Thread):
    """(time_ns, stolen ns per CPU so far) every STEAL_EVERY_S, like the monitor's StealClock."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        from rankscope.orchestrator.live import StealClock

        self.clock = StealClock()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(STEAL_EVERY_S):
            self.clock.sample()


def replay(run_dir: Path, ranks: int, clock: Any) -> dict[str, Any]:
    """The rise rule alone on the kept step logs, step by step: where it first fires, and the
    job's and the host's ms per step before and after there."""
    import numpy as np
    from rankscope.analysis.compute import step_changes as sc
    from rankscope.launchers import rundir, step_log

    logs = [
        step_log.read_steps(rundir.rank_dir(run_dir, r) / step_log.STEP_LOG_FILE)
        for r in range(ranks)
    ]
    n = min(len(x) for x in logs)
    end = np.stack([x["end_ns"][:n] for x in logs])
    job = sc.job_step_ms(end)
    delay = sc.host_delay_ms(np.stack([x["runq_ns"][:n] for x in logs]))
    steal = clock.fraction(end[0])
    out: dict[str, Any] = {"median_ms": float(np.median(job)), "fired": None}
    if delay is not None:
        out["host_median_ms"] = float(np.median(sc.job_host_ms(delay)))
    rule = sc.ChangeRule()
    for k in range(rule.baseline_min + rule.window, len(job) + 1):
        change = sc.detect_job_change(job[:k], rule)
        if change is None:
            continue
        out["fired"] = {"step": k + 1, "before_ms": change.before_ms, "after_ms": change.after_ms}
        if delay is not None:
            host = sc.job_change_host(
                job[:k],
                sc.job_host_ms(delay)[:k],
                change,
                rule,
                None if steal is None else steal[:k],
            )
            out["fired"]["host_ms"] = [host.before_ms, host.after_ms]
            out["fired"]["stolen_ms"] = host.stolen_ms
            out["fired"]["host_explains"] = host.explained
        break
    return out


def one_try(args: argparse.Namespace, out: Path, busy: bool, keep: Path | None) -> dict[str, Any]:
    """One run: what the monitor did (changes by kind, windows) and the offline replay."""
    sampler = StealSampler()
    sampler.start()
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
        sampler.stop.set()
        sampler.join(timeout=5)
    if proc.returncode != 0:
        sys.exit(f"run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    from rankscope.launchers import rundir, step_log

    changes_file = run_dir / rundir.CHANGES_FILE
    changes = (
        [json.loads(line) for line in changes_file.read_text().splitlines()]
        if changes_file.is_file()
        else []
    )
    result = replay(run_dir, args.ranks, sampler.clock)
    result["changes"] = changes
    result["windows"] = len({c["trigger"] for c in changes if c.get("trigger") is not None})
    if (run_dir / rundir.TRIGGER_FILE).exists() and not result["windows"]:
        result["windows"] = 1
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for r in range(args.ranks):
            src = rundir.rank_dir(run_dir, r) / step_log.STEP_LOG_FILE
            shutil.copy(src, keep / f"rank{r}-{step_log.STEP_LOG_FILE}")
        if changes_file.is_file():
            shutil.copy(changes_file, keep / rundir.CHANGES_FILE)
        steal = {"t_ns": list(sampler.clock.t_ns), "steal_ns": list(sampler.clock.steal_ns)}
        (keep / "steal.json").write_text(json.dumps(steal))
        (keep / "result.json").write_text(json.dumps(result, indent=1))
    return result


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main() -> None:
    args = parse_args()
    series = [("quiet", False), ("busy core", True)]
    if args.series != "both":
        series = [s for s in series if s[1] == (args.series == "busy")]
    summary = []
    for label, busy in series:
        windows = fired_old = 0
        kinds: dict[str, int] = {}
        medians = []
        for i in range(args.tries):
            keep = args.keep / f"{label.replace(' ', '-')}-{i + 1}" if args.keep else None
            started = time.strftime("%H:%M:%S", time.gmtime())
            with tempfile.TemporaryDirectory(prefix="rankscope-false-alarms-") as tmp:
                r = one_try(args, Path(tmp), busy, keep)
            windows += r["windows"]
            for c in r["changes"]:
                kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
            fired_old += r["fired"] is not None
            medians.append(r["median_ms"])
            said = "; ".join(f"[{c['kind']}] {c['sentence']}" for c in r["changes"]) or "nothing"
            old = r["fired"]
            old_text = "rule alone: nothing"
            if old is not None:
                old_text = (
                    f"rule alone: step {old['step']} {old['before_ms']:.1f} → "
                    f"{old['after_ms']:.1f} ms"
                )
                if "host_ms" in old:
                    old_text += (
                        f", host delay {old['host_ms'][0]:.1f} → {old['host_ms'][1]:.1f} ms/step"
                        f" (of the rise, stolen {old['stolen_ms']:.1f} ms/step)"
                        f" (explains: {old['host_explains']})"
                    )
            print(
                f"{label} try {i + 1}/{args.tries} ({started} UTC, load {load()}): median step "
                f"{r['median_ms']:.1f} ms, host delay {r.get('host_median_ms', float('nan')):.1f}"
                f" ms/step; windows {r['windows']}; noticed: {said}; {old_text}",
                flush=True,
            )
        line = (
            f"{label}: {args.tries} runs, {windows} triggered window(s), notices by kind "
            f"{json.dumps(kinds, sort_keys=True)}, rule alone fired in {fired_old}; median step "
            f"{statistics.median(medians):.1f} ms"
        )
        summary.append(line)
        print(line, flush=True)
    print(f"\n{args.ranks} ranks, {args.steps} steps, input delay {args.input_delay_ms} ms:")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
