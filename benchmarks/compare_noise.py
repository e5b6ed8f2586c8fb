"""False alarms of ``rankscope compare`` on real runs: N pairs of the example, same settings.

    python benchmarks/compare_noise.py                          # 20 pairs, 4 ranks, 3 and 5 steps
    python benchmarks/compare_noise.py --pairs 10 --steps 3 --keep runs/noise
    python benchmarks/compare_noise.py --reuse runs/noise       # compare kept runs again
    python benchmarks/compare_noise.py --runs-per-side 5        # 20 tries of 5 runs vs 5

Each pair is two ``rankscope run`` of ``examples/train_ddp.py`` with identical settings, one
after the other; every difference between them is noise — step-to-step noise inside a run, and
whatever changed on the machine between the two runs. The comparison is the one ``rankscope
compare BASE NEW --fail-above 5%`` makes (default CompareConfig). Printed per pair, then counted
over the pairs, per number of profiled steps:

* **gate** — a pair where ``--fail-above 5%`` would exit 1 (the CI false alarm; target 0), with
  the rule that decided (Welch's t of "more than 5 % worse" on the per-step job means, or the
  threshold alone when a run has fewer than 3 steps) and its one-sided p-value; with the default
  gate (step noise only) and, with ``--run-noise PCT``, with that run-to-run noise allowed for
  (``rankscope compare --run-noise``; measure it on *another* set of runs, so the set that is
  counted here is not the one it was fitted on);
* **job** — a pair with any job-level KPI called a regression or improvement in the table;
* **any row** — a pair with any KPI row (job or rank) called one.

Also printed per step count: the set's **run-to-run noise**
(``rankscope.analysis.compute.statistics.run_noise``: the spread of the runs' mean step times beyond
what their step noise explains, relative to the mean) — the figure to give ``--run-noise`` on
this machine.

With ``--runs-per-side K`` each try is K runs against K (``rankscope compare --base-runs
--new-runs``): the gate tests run means, the run-to-run noise measured from the runs.

The load average (1 min) is printed before each run: the test sees step-to-step noise, not a
machine that got busier between BASE and NEW (docs/compare.md, "What the test does not see"), so
the false-alarm count means something only on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"


def record(out: Path, name: str, ranks: int, steps: int) -> Path:
    """One run of the example (``steps`` profiled steps after 2 unprofiled ones), merged."""
    cmd = [
        sys.executable, "-m", "rankscope.orchestrator", "run",
        "--nproc-per-node", str(ranks), "--out", str(out), "--name", name,
        "--wait", "1", "--warmup", "1", "--active", str(steps), "--repeat", "1",
        "--no-analyze", str(EXAMPLE), "--steps", str(steps + 5),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"run {name} failed:\n{proc.stderr[-2000:]}")
    (run,) = [p for p in out.iterdir() if p.is_dir() and f"-{name}-" in p.name]
    (run / "load.txt").write_text(f"{os.getloadavg()[0]:.2f}\n")
    return run


def kept(out: Path, steps: int, pairs: int) -> list[Path]:
    """The runs ``--keep`` left in ``out`` for ``steps`` (in pair order)."""
    runs = []
    for i in range(2 * pairs):
        hit = sorted(out.glob(f"*-noise{steps}s{i:03d}-*"))
        if not hit:
            break
        runs.append(hit[-1])
    return runs


def report_runs(runs: list[Path], steps: int, k: int) -> int:
    """Each try: K runs against the next K, the gate on run means (``--base-runs`` /
    ``--new-runs``); print and count the tries that fail."""
    from rankscope.analysis.conclude.compare import GateConfig, compare, gate_checks
    from rankscope.analysis.conclude.kpis import kpis
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    spec = ClusterSpec(scheduler=SYNCHRONOUS)
    tries = len(runs) // (2 * k)
    failed_tries = 0
    print(f"\n{steps} profiled steps per run, {tries} tries of {k} vs {k} same-settings runs\n")
    print("| try | step time Δ (mean of run means) | run-to-run noise seen | gate p | gate |")
    print("|---|---:|---:|---:|---|")
    for i in range(tries):
        group = [analyze(r, spec) for r in runs[2 * k * i : 2 * k * (i + 1)]]
        base, new = group[:k], group[k:]
        c = compare(base[0], new[0])
        more_b = [kpis(a) for a in base[1:]]
        more_n = [kpis(a) for a in new[1:]]
        checks = gate_checks(c, GateConfig(fail_above=0.05), more_b, more_n)
        failed = any(ch.failed for ch in checks)
        failed_tries += failed
        st = next(ch for ch in checks if ch.kpi == "step_time")
        print(
            f"| {i + 1} | {100 * st.rel_change:+.1f}% | {100 * st.run_noise:.1f}% | "
            f"{st.p_adjusted:.2g} | {'FAIL' if failed else 'pass'} |"
        )
    print(
        f"\n{steps} steps: false alarms over {tries} tries of {k} vs {k} same-settings runs: "
        f"gate on run means {failed_tries}"
    )
    return failed_tries


def report(runs: list[Path], steps: int, noise: float) -> dict[str, int]:
    """Compare each pair as ``rankscope compare --fail-above 5%`` does (and with ``--run-noise``
    ``noise`` when given); print and count."""
    import numpy as np
    from rankscope.analysis.conclude.compare import GateConfig, compare, gate_checks, run_noise
    from rankscope.analysis.conclude.kpis import JOB_RANK
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze

    spec = ClusterSpec(scheduler=SYNCHRONOUS)
    pairs = len(runs) // 2
    counts = {"gate": 0, "gate with run noise": 0, "job": 0, "any row": 0}
    analyses = [analyze(r, spec) for r in runs]
    configs = [GateConfig(fail_above=0.05)]
    if noise > 0:
        configs.append(GateConfig(fail_above=0.05, run_noise=noise))
    print(f"\n{steps} profiled steps per run, {pairs} same-settings pairs\n")
    print(
        "| pair | load | step time Δ (mean) | gate p (step noise only) | gate p (+ run noise) | "
        "job rows called | rank rows called | gate | gate with run noise |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    series: list[np.ndarray] = []
    for i in range(pairs):
        a, b = runs[2 * i], runs[2 * i + 1]
        load = "/".join(
            (r / "load.txt").read_text().strip() for r in (a, b) if (r / "load.txt").exists()
        )
        c = compare(analyses[2 * i], analyses[2 * i + 1])
        for k in (c.base, c.new):
            s = k.samples[(k.samples["kpi"] == "step_time") & (k.samples["rank"] == JOB_RANK)]
            series.append(s.sort_values("step")["value"].to_numpy(np.float64))
        k = c.kpis
        called = k["change"].isin(["regression", "improvement"])
        job = int((called & (k["rank"] < 0)).sum())
        rank = int((called & (k["rank"] >= 0)).sum())
        cells, verdicts = [], []
        for n, config in enumerate(configs):
            checks = gate_checks(c, config)
            failed = any(ch.failed for ch in checks)
            counts["gate with run noise" if n else "gate"] += failed
            st = next((ch for ch in checks if ch.kpi == "step_time"), None)
            p = st.p_adjusted if st else math.nan
            cells.append(f"{p:.2g}" if p == p else "-")
            verdicts.append("FAIL" if failed else "pass")
            delta = f"{100 * st.rel_change:+.1f}%" if st else "-"
        if noise <= 0:
            cells.append("-")
            verdicts.append("-")
        counts["job"] += job > 0
        counts["any row"] += (job + rank) > 0
        print(
            f"| {i + 1} | {load} | {delta} | {cells[0]} | {cells[1]} | {job} | {rank} | "
            f"{verdicts[0]} | {verdicts[1]} |"
        )
    with_noise = (
        f", gate with {100 * noise:g}% run-to-run noise {counts['gate with run noise']}"
        if noise > 0
        else ""
    )
    print(
        f"\n{steps} steps: false alarms over {pairs} same-settings pairs: gate (step noise only) "
        f"{counts['gate']}{with_noise}, job-level {counts['job']}, any row {counts['any row']}"
    )
    print(
        f"{steps} steps: run-to-run noise of these {len(series)} runs (beyond their step noise): "
        f"{100 * run_noise(series):.1f}% of the mean step time"
    )
    return counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument(
        "--steps", type=int, nargs="+", default=[3, 5], help="profiled steps per run (3 5)"
    )
    p.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    p.add_argument("--reuse", type=Path, default=None, help="compare the runs --keep left here")
    p.add_argument("--record-only", action="store_true", help="record (with --keep), no compare")
    p.add_argument(
        "--run-noise",
        default="0",
        metavar="PCT",
        help="also gate with this run-to-run noise allowed for (measured on another set)",
    )
    p.add_argument(
        "--runs-per-side",
        type=int,
        default=1,
        metavar="K",
        help="K runs against K per try (the gate on run means); 1: pairs",
    )
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = args.reuse or args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        runs: dict[int, list[Path]] = {}
        for steps in args.steps:
            if args.reuse:
                runs[steps] = kept(out, steps, args.pairs * args.runs_per_side)
                continue
            # all runs first: analysing never competes with a run for the CPU
            runs[steps] = [
                record(out, f"noise{steps}s{i:03d}", args.ranks, steps)
                for i in range(2 * args.pairs * args.runs_per_side)
            ]
        if args.record_only:
            return 0
        from rankscope.analysis.conclude.compare import parse_fraction

        for steps, rs in runs.items():
            if args.runs_per_side > 1:
                report_runs(rs, steps, args.runs_per_side)
            else:
                report(rs, steps, parse_fraction(args.run_noise))
    return 0


if __name__ == "__main__":
    sys.exit(main())
