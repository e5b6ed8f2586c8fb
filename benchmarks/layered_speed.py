"""Issue 24's speed target, as a user feels it: 64 ranks x 40 steps merged and analysed (prints
figures; not a test).

    python benchmarks/layered_speed.py            # rankscope, forked workers vs in-process
    python benchmarks/layered_speed.py --hta      # and HTA 0.5.0 on the same traces

Two jobs, generated once by ``rankscope synth`` into a temporary folder: the layered one of the
target (TP 2 x PP 4 x DP 8, 64 ranks on 8 hosts, 40 steps: ~1.47 M events, ~575 per rank and
step) and a data-parallel one of the same size (64 ranks, DDP, steps chosen for as many events).
Each is timed as whole processes, the way a user runs them: ``rankscope merge`` then
``rankscope analyze trace.h5``, and ``rankscope analyze FOLDER`` (one process that merges, then
analyses); each with ``--scheduler auto`` (what users get: forked worker processes on Linux
when they pay) and ``--scheduler synchronous`` (this process alone), best of ``--repeat`` runs.
With ``--hta``: HTA 0.5.0 (its own venv, ``benchmarks/merge_vs_hta.py --setup-hta``) loading the
same traces and computing its temporal breakdown, one whole process. The target: ≤ 15 s for the
layered job's merge + analysis on this 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import whole_process_s

HTA_PYTHON = Path("/tmp/hta-venv/bin/python")
HTA_SCRIPT = """
import sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
"""
#: The target's job: `rankscope synth` arguments.
LAYERED = ["--ranks", "64", "--ranks-per-host", "8", "--steps", "40", "--seed", "1",
           "--tp", "2", "--pp", "4", "--dp", "8"]  # fmt: skip
#: A data-parallel job of about as many events (~1.4 M).
DDP = ["--ranks", "64", "--ranks-per-host", "8", "--steps", "75", "--seed", "1"]
TARGET_S = 15.0


def best(cmd: list[str], repeat: int, before: tuple[Path, ...] = ()) -> float:
    """The fastest of ``repeat`` runs of ``cmd``, removing ``before`` ahead of each."""
    out = []
    for _ in range(repeat):
        for p in before:
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        out.append(whole_process_s(cmd))
    return min(out)


def job_row(root: Path, name: str, synth: list[str], repeat: int, hta: bool) -> None:
    rs = [sys.executable, "-m", "rankscope"]
    folder = root / name
    made = subprocess.run([*rs, "synth", *synth, str(folder)], capture_output=True, text=True)
    if made.returncode != 0:
        raise SystemExit(made.stderr[-2000:])
    said = made.stdout.splitlines()[0]  # "wrote 64 rank traces (40 steps, 1,472,064 events, …"
    events = said.split("steps, ")[1].split(" events")[0] if "steps, " in said else "?"
    traces = sorted(folder.glob("rank-*.json.gz"))
    store = folder / "trace.h5"
    cells = []
    for where in ("auto", "synchronous"):
        sched = ["--scheduler", where]
        merge = best([*rs, "merge", str(folder), "-q", "-o", str(store), *sched], repeat, (store,))
        ana = best([*rs, "analyze", str(store), "--json", str(root / "s.json"), *sched], repeat)
        one = best(
            [*rs, "analyze", str(folder), "--json", str(root / "s.json"), *sched],
            repeat,
            (store, folder / "report"),
        )
        cells.append((merge, ana, one))
    hta_s = "—"
    if hta:
        if HTA_PYTHON.exists():
            only = root / f"{name}-traces"
            only.mkdir()
            for f in traces:
                os.link(f, only / f.name)
            hta_s = f"{whole_process_s([str(HTA_PYTHON), '-c', HTA_SCRIPT, str(only)]):.1f}"
        else:
            hta_s = f"no {HTA_PYTHON}"
    (m, a, o), (sm, sa, so) = cells
    print(
        f"| {name} ({events} events) | {m:.1f} + {a:.1f} = {m + a:.1f} | {o:.1f} | "
        f"{sm:.1f} + {sa:.1f} = {sm + sa:.1f} | {so:.1f} | {hta_s} |",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2, help="runs of each command (best kept)")
    ap.add_argument("--hta", action="store_true", help="also HTA 0.5.0 on the same traces")
    args = ap.parse_args()
    print(
        f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores; seconds, whole "
        f"processes, best of {args.repeat}; target ≤ {TARGET_S:.0f} s (layered, merge + analyze)"
    )
    head = (
        "| job | merge + analyze (auto: forked) | analyze FOLDER (auto) | merge + analyze "
        "(synchronous) | analyze FOLDER (synchronous) | HTA load + temporal breakdown |"
    )
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    root = Path(tempfile.mkdtemp(prefix="rankscope-speed-"))
    try:
        job_row(root, "layered TP2xPP4xDP8", LAYERED, args.repeat, args.hta)
        job_row(root, "data parallel", DDP, args.repeat, args.hta)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
