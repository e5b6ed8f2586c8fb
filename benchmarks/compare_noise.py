"""False alarms of ``rankscope compare`` on real runs: N pairs of the example, same settings.

    python benchmarks/compare_noise.py                  # 5 pairs, 3 ranks, 10 profiled steps
    python benchmarks/compare_noise.py --pairs 10 --ranks 2 --keep runs/

Each pair is two ``rankscope run`` of ``examples/train_ddp.py`` with identical settings, one
after the other; every difference between them is noise. The comparison is the one ``rankscope
compare`` makes (default CompareConfig). Printed per pair, then counted over the pairs:

* **gate** — a pair where ``--fail-above 5%`` would exit 1 (the CI false alarm; target 0);
* **job** — a pair with any job-level KPI called a regression or improvement;
* **any row** — a pair with any KPI row (job or rank) called one.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"


def record(out: Path, name: str, ranks: int, steps: int) -> Path:
    """One run of the example (10 profiled steps after 2 unprofiled ones), merged."""
    cmd = [
        sys.executable, "-m", "rankscope.orchestrator", "run",
        "--nproc-per-node", str(ranks), "--out", str(out), "--name", name,
        "--wait", "1", "--warmup", "1", "--active", str(steps), "--repeat", "1",
        "--no-analyze", str(EXAMPLE), "--steps", str(steps + 4),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"run {name} failed:\n{proc.stderr[-2000:]}")
    (run,) = [p for p in out.iterdir() if p.is_dir() and f"-{name}-" in p.name]
    return run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="profiled steps per run")
    p.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    args = p.parse_args()

    from rankscope.analysis.compare import GateConfig, compare, gate
    from rankscope.analysis.pipeline import SYNCHRONOUS, ClusterSpec, analyze

    spec = ClusterSpec(scheduler=SYNCHRONOUS)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        runs = [
            record(out, f"noise{i}", args.ranks, args.steps) for i in range(2 * args.pairs)
        ]  # all runs first: analysing never competes with a run for the CPU
        counts = {"gate": 0, "job": 0, "any row": 0}
        print("| pair | step time Δ | p (Holm) | job rows called | rank rows called | gate |")
        print("|---|---:|---:|---:|---:|---|")
        for i in range(args.pairs):
            c = compare(analyze(runs[2 * i], spec), analyze(runs[2 * i + 1], spec))
            k = c.kpis
            called = k["change"].isin(["regression", "improvement"])
            job = int((called & (k["rank"] < 0)).sum())
            rank = int((called & (k["rank"] >= 0)).sum())
            failed = bool(gate(c, GateConfig(fail_above=0.05)))
            st = k[(k["kpi"] == "step_time") & (k["rank"] < 0)].iloc[0]
            counts["gate"] += failed
            counts["job"] += job > 0
            counts["any row"] += (job + rank) > 0
            print(
                f"| {i + 1} | {100 * st['rel_change']:+.1f}% | {st['p_adjusted']:.2g} | {job} | "
                f"{rank} | {'FAIL' if failed else 'pass'} |"
            )
        print()
        print(
            f"false alarms over {args.pairs} same-settings pairs: gate {counts['gate']}, "
            f"job-level {counts['job']}, any row {counts['any row']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
