"""Overhead of ``rankscope run`` against plain torchrun + bare torch.profiler (same schedule).

    python benchmarks/overhead.py                     # 2 ranks, 3 rounds of 300 steps
    python benchmarks/overhead.py --ranks 4 --steps 600 --rounds 5

Each round runs the example three ways, interleaved so that machine load hits all alike:

* ``rankscope``  — ``rankscope run`` (runtime, optimizer hook, window files, meta.json, clock sync);
* ``bare``       — ``torchrun examples/train_ddp.py --bare-profiler`` (torch.profiler, same
  schedule, gzip Chrome trace per window): the baseline the targets refer to;
* ``none``       — plain torchrun, no profiler (context: what profiling itself costs).

The example records the wall time and the main thread's CPU time of every iteration (from the top
of one iteration to the top of the next, including the profiler step); on a shared machine the
CPU time is the trustworthy figure, wall time moves with the neighbours' load. Steps are classified by their place in the
schedule: *outside* (wait steps), *inside* (active steps but the last), *window end* (the last
active step, which also exports the trace). The first cycle is dropped (start-up). Figures are
medians over all ranks and rounds, in ms; overhead = rankscope / bare − 1. Targets: ≤ 2 % inside
windows, ≤ 1 % outside.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ddp.py"
VARIANTS = ("rankscope", "bare", "none")
PHASES = ("outside", "inside", "window end")
#: metric -> key in the example's --step-times file: wall time, and the main thread's CPU time
#: (immune to other processes taking the CPU; the profiler's own work is on that thread).
METRICS = {"wall": "step_s", "cpu": "step_cpu_s"}
#: Variants of the per-step probe: rankscope's hook path as it runs (the step log's record
#: included), the same with the record thrown away (what the step log costs is the difference),
#: and the bare profiler loop.
MICRO_VARIANTS = ("rankscope", "rankscope-no-step-log", "bare")


class _Discarded:
    """Stands in for the probe's record queue in ``rankscope-no-step-log``: appends vanish."""

    def append(self, record: object) -> None:
        pass

    def __len__(self) -> int:
        return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=300, help="iterations per run")
    p.add_argument(
        "--rounds", type=int, default=3, help="interleaved repetitions of the three runs"
    )
    p.add_argument("--wait", type=int, default=20, help="schedule: steps outside windows per cycle")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--active", type=int, default=5)
    p.add_argument("--hidden", type=int, default=256, help="example's MLP width")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--micro-steps", type=int, default=20000, help="iterations of the per-step probe"
    )
    p.add_argument(
        "--profile-memory",
        action="store_true",
        help="record allocations in both profiled runs (rankscope run --profile-memory; the "
        "bare profiler with profile_memory=True): the overhead of memory profiling",
    )
    p.add_argument(
        "--micro-only",
        action="store_true",
        help="run only the per-step probe (rankscope's hook path with and without the step "
        "log's record, and bare), not the three-way runs",
    )
    p.add_argument("--micro-child", choices=MICRO_VARIANTS, help=argparse.SUPPRESS)
    return p.parse_args()


def micro_child(variant: str, steps: int) -> None:
    """Per-step cost of stepping the profiler outside windows, in µs, printed as JSON.

    A 1-parameter SGD makes the optimizer step itself nearly free, so what is left is how the
    profiler is stepped: rankscope's global post-hook (dedupe + ``prof.step()``) versus the bare
    loop calling ``prof.step()`` itself. The schedule waits for ever (no window ever opens).
    """
    import os
    import time

    import torch

    wait = steps * 10
    started: Any = None
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.0)
    if variant.startswith("rankscope"):
        from rankscope.launchers import runtime
        from rankscope.launchers.rundir import ENV_PROFILER, ENV_RUN_DIR
        from rankscope.launchers.spec import ProfilerSettings

        os.environ[ENV_RUN_DIR] = tempfile.mkdtemp(prefix="rankscope-micro-")
        os.environ[ENV_PROFILER] = ProfilerSettings(wait=wait, warmup=0, active=1).to_json()
        started = runtime.start()
        if variant == "rankscope-no-step-log" and started is not None:
            started.probe.records = _Discarded()  # type: ignore[assignment]
        bare = None
    else:
        bare = torch.profiler.profile(
            schedule=torch.profiler.schedule(wait=wait, warmup=0, active=1)
        )
        bare.start()
    for _ in range(steps // 10):  # warm up
        opt.step()
        if bare is not None:
            bare.step()
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        opt.step()
        if bare is not None:
            bare.step()
    elapsed_us = (time.perf_counter_ns() - t0) / 1000
    record_us = read_us = None
    if variant == "rankscope" and started is not None:
        record_us = step_record_us(started, steps)
        read_us = schedstat_read_us(started, steps)
    doc = {"variant": variant, "us_per_step": elapsed_us / steps, "record_us": record_us}
    print(json.dumps({**doc, "schedstat_us": read_us}))


def step_record_us(started: Any, steps: int) -> float:
    """What the step log adds to a step, timed alone (best of 5 × ``steps``, µs): the lines
    ``_advance`` runs for it (the end time, the wait taken from the collective clock, the
    thread's counters taken from the schedstat mark that ``step_cpu`` reads at every step end
    anyway) and the record's append in ``beat``; the probe's thread writes the records
    meanwhile, as in a run."""
    import time

    from rankscope.launchers.collective_wait import CLOCK
    from rankscope.launchers.stepping import _thread_times

    records = started.probe.records
    mark = _thread_times(started._schedstat) or (0, 0, 0)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for i in range(steps):
            end_ns = time.time_ns()
            wait_ns = CLOCK.take()
            cpu_ns, runq_ns = (mark[1], mark[2]) if mark is not None else (-1, -1)
            records.append((i, end_ns, wait_ns, cpu_ns, runq_ns))
        best = min(best, (time.perf_counter_ns() - t0) / 1000 / steps)
    return best


def schedstat_read_us(started: Any, steps: int) -> float | None:
    """The ``pread`` of the training thread's schedstat (``stepping._thread_times``), best of 5
    × ``steps`` (µs): made at every step end before the step log kept its counters (for
    ``step_cpu``), timed for the record; None where Linux has no such file."""
    import time

    from rankscope.launchers.stepping import _thread_times

    fd = started._schedstat
    if fd is None:
        return None
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(steps):
            _thread_times(fd)
        best = min(best, (time.perf_counter_ns() - t0) / 1000 / steps)
    return best


def micro(args: argparse.Namespace) -> dict[str, float]:
    """Best of 5 per-step probe timings (µs) for each variant (min: least disturbed)."""
    best: dict[str, float] = {}
    for _ in range(5):
        for variant in MICRO_VARIANTS:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--micro-child",
                    variant,
                    "--micro-steps",
                    str(args.micro_steps),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            doc = json.loads(out.strip().splitlines()[-1])
            us = doc["us_per_step"]
            best[variant] = min(best.get(variant, us), us)
            for key in ("record", "schedstat"):
                if doc.get(f"{key}_us") is not None:
                    best[key] = min(best.get(key, doc[f"{key}_us"]), doc[f"{key}_us"])
    return best


def command(variant: str, args: argparse.Namespace, work: Path, tag: str) -> list[str]:
    schedule = [
        "--wait",
        str(args.wait),
        "--warmup",
        str(args.warmup),
        "--active",
        str(args.active),
        "--repeat",
        "0",
    ]
    script_args = [
        "--steps", str(args.steps), "--hidden", str(args.hidden), "--batch-size", str(args.batch_size),
        "--step-times", str(work / f"{tag}-{{rank}}.json"),
    ]  # fmt: skip
    torchrun = ["--standalone", "--nproc-per-node", str(args.ranks)]
    if variant == "rankscope":
        return [
            sys.executable, "-m", "rankscope", "run", *torchrun, *schedule, "--out", str(work / "runs"),
            *(["--profile-memory"] if args.profile_memory else []),
            "--no-merge", "--no-analyze", str(EXAMPLE), *script_args,
        ]  # fmt: skip
    extra = (
        [*schedule, "--bare-profiler", "--bare-out", str(work / f"bare-{tag}")]
        if variant == "bare"
        else []
    )
    if variant == "bare" and args.profile_memory:
        extra.append("--bare-profile-memory")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *torchrun,
        str(EXAMPLE),
        *script_args,
        *extra,
    ]


def phase(step: int, args: argparse.Namespace) -> str | None:
    cycle = args.wait + args.warmup + args.active
    if step < cycle:
        return None  # start-up cycle
    pos = step % cycle
    if pos < args.wait:
        return "outside"
    if pos < args.wait + args.warmup:
        return None  # warm-up steps: profiler starting, neither inside nor outside
    return "window end" if pos == cycle - 1 else "inside"


def main() -> None:
    args = parse_args()
    if args.micro_child:
        micro_child(args.micro_child, args.micro_steps)
        return
    probe = micro(args)
    log_us = probe["rankscope"] - probe["rankscope-no-step-log"]
    print(
        f"per-step probe outside windows (1-parameter SGD, best of 5 x {args.micro_steps} "
        f"steps): bare {probe['bare']:.2f} µs, rankscope hook path {probe['rankscope']:.2f} µs "
        f"(without the step log's record {probe['rankscope-no-step-log']:.2f} µs: the step log "
        f"costs {log_us:.2f} µs per step; its lines timed alone: {probe['record']:.2f} µs; "
        f"the schedstat read they take their counters from, made at every step end anyway: "
        f"{probe.get('schedstat', float('nan')):.2f} µs)",
        flush=True,
    )
    if args.micro_only:
        return
    # times[metric][variant][phase] -> ms; per_round[metric][variant] -> median ms outside, per round
    times = {m: {v: {p: [] for p in PHASES} for v in VARIANTS} for m in METRICS}
    per_round: dict[str, dict[str, list[float]]] = {m: {v: [] for v in VARIANTS} for m in METRICS}
    with tempfile.TemporaryDirectory(prefix="rankscope-overhead-") as tmp:
        work = Path(tmp)
        for rnd in range(args.rounds):
            order = (
                VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]
            )  # ABC CBA: load drifts hit all alike
            for variant in order:
                tag = f"{variant}-{rnd}"
                for _ in range(2):  # one retry: gloo teardown here rarely aborts a finished job
                    cmd = command(variant, args, work, tag)
                    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                    if proc.returncode == 0:
                        break
                    print(
                        f"{variant} run failed, retrying:\n{proc.stderr[-1500:]}", file=sys.stderr
                    )
                if proc.returncode != 0:
                    sys.exit(f"{variant} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
                outside: dict[str, list[float]] = {m: [] for m in METRICS}
                for rank in range(args.ranks):
                    record = json.loads((work / f"{tag}-{rank}.json").read_text())
                    for metric, key in METRICS.items():
                        for i, seconds in enumerate(record[key]):
                            ph = phase(i, args)
                            if ph is not None:
                                times[metric][variant][ph].append(seconds * 1000)
                            if ph == "outside":
                                outside[metric].append(seconds * 1000)
                for metric in METRICS:
                    per_round[metric][variant].append(statistics.median(outside[metric]))
                print(f"round {rnd + 1}/{args.rounds}: {variant} done", file=sys.stderr, flush=True)

    print(
        f"\n{args.ranks} ranks (gloo, CPU), {args.steps} steps x {args.rounds} rounds, schedule "
        f"wait={args.wait} warmup={args.warmup} active={args.active} repeat=0; MLP {args.hidden} wide, "
        f"batch {args.batch_size}; medians in ms per step\n"
    )
    print("| metric | phase | steps | none | bare profiler | rankscope | rankscope vs bare |")
    print("|---|---|---|---|---|---|---|")
    for metric in METRICS:
        med = {v: {p: statistics.median(times[metric][v][p]) for p in PHASES} for v in VARIANTS}
        for p in PHASES:
            overhead = (med["rankscope"][p] / med["bare"][p] - 1) * 100
            print(
                f"| {metric} | {p} | {len(times[metric]['rankscope'][p])} | {med['none'][p]:.3f} | "
                f"{med['bare'][p]:.3f} | {med['rankscope'][p]:.3f} | {overhead:+.1f} % |"
            )
    extra = probe["rankscope"] - probe["bare"]
    print(
        f"\nper-step probe outside windows (1-parameter SGD, best of 5 x {args.micro_steps} steps): "
        f"bare optimizer.step() + prof.step() {probe['bare']:.2f} µs, rankscope hook path "
        f"{probe['rankscope']:.2f} µs: rankscope adds {extra:.2f} µs per step = "
        f"{extra / 1000 / statistics.median(times['wall']['bare']['outside']) * 100:.3f} % of this "
        f"example's median step"
    )
    print("\nmedian ms per step outside windows, round by round (the machine's noise):")
    for metric in METRICS:
        for v in VARIANTS:
            print(f"  {metric:>10} {v:>9}: " + " ".join(f"{x:.3f}" for x in per_round[metric][v]))


if __name__ == "__main__":
    main()
