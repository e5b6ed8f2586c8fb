"""Record the runs in this folder (the gate at 3 and 5 profiled steps; tests/test_compare.py).

    python tests/data/compare_ddp_4rank/make_runs.py            # from the project root

Six ``rankscope run`` of ``examples/train_ddp.py`` on 4 ranks (torch CPU, gloo), one after the
other: ``base3``/``twin3``/``strag3`` with the default schedule (wait 1, warmup 1, active 3:
steps 2-4 profiled) and ``base5``/``twin5``/``strag5`` with ``--active 5`` (steps 2-6);
``strag*`` add ``--straggler-rank 3 --straggler-ms 20`` (rank 3 waits 20 ms every step); and
five more runs of each at 3 steps, ``base3r1``…``base3r5`` and ``strag3r1``…``strag3r5``, one
after the other and interleaved (base, strag, base, …) so both sides see the same machine: the
gate on run means (``--base-runs`` / ``--new-runs``). Only
``run.json``, ``ranks/`` and ``load.txt`` (the 1-minute load average when the run ended) are
kept (the tests merge a copy). Then the gate's verdicts are printed: ``strag*`` must fail
``--fail-above 5%``, ``twin*`` pass. The gate sees step-to-step noise, not a machine that got
busier between two runs: on a shared machine, record again when a twin differs from its base
by far more than its step noise (compare the load averages).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
STRAGGLER = ("--straggler-rank", "3", "--straggler-ms", "20")
RUNS = {
    "base3": (3, ()),
    "twin3": (3, ()),
    "strag3": (3, STRAGGLER),
    "base5": (5, ()),
    "twin5": (5, ()),
    "strag5": (5, STRAGGLER),
    **{
        f"{kind}3r{i}": (3, STRAGGLER if kind == "strag" else ())
        for i in range(1, 6)
        for kind in ("base", "strag")
    },
}


def record(out: Path, name: str, active: int, extra: tuple[str, ...]) -> Path:
    cmd = [
        sys.executable, "-m", "rankscope.orchestrator", "run",
        "--nproc-per-node", "4", "--out", str(out), "--name", name,
        "--wait", "1", "--warmup", "1", "--active", str(active), "--no-analyze",
        str(EXAMPLE), "--steps", str(active + 5), *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"run {name} failed:\n{proc.stderr[-2000:]}")
    (run,) = [p for p in out.iterdir() if p.is_dir() and f"-{name}-" in p.name]
    return run


def main() -> int:
    names = sys.argv[1:] or list(RUNS)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            active, extra = RUNS[name]
            run = record(Path(tmp), name, active, extra)
            dest = HERE / name
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            shutil.copy2(run / "run.json", dest / "run.json")
            shutil.copytree(run / "ranks", dest / "ranks")
            (dest / "load.txt").write_text(f"{os.getloadavg()[0]:.2f}\n")
            print(f"{name}: {run.name}")
    verdicts()
    return 0


def verdicts() -> None:
    """The gate (``--fail-above 5%``) on each pair, on copies (merging writes into the run)."""
    from rankscope.analysis.conclude.compare import GateConfig, compare, gate_checks
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    with tempfile.TemporaryDirectory() as tmp:
        analyses = {}
        for name in RUNS:
            if (HERE / name).is_dir():
                shutil.copytree(HERE / name, Path(tmp) / name)
                store = merge_run_dir(Path(tmp) / name, quiet=True)
                analyses[name] = analyze(store, ClusterSpec(scheduler=SYNCHRONOUS))
        for steps in (3, 5):
            for new in (f"twin{steps}", f"strag{steps}"):
                base = f"base{steps}"
                if base in analyses and new in analyses:
                    c = compare(analyses[base], analyses[new])
                    for ch in gate_checks(c, GateConfig(fail_above=0.05)):
                        verdict = "FAILED" if ch.failed else "passed"
                        print(f"{base} -> {new}: gate {verdict} — {ch.text}")


if __name__ == "__main__":
    sys.exit(main())
