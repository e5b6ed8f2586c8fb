"""A small DDP training job with knobs for the effects rankscope must find.

    rankscope run --nproc-per-node 4 examples/train_ddp.py --steps 20
    rankscope run --nproc-per-node 4 examples/train_ddp.py --straggler-rank 2 --straggler-ms 20
    rankscope run --nproc-per-node 4 examples/train_ddp.py --input-delay-ms 15 --input-delay-rank 1

gloo on CPU, NCCL on GPU; an MLP on random data fed by a real ``torch.utils.data.DataLoader`` (so
traces show the ``enumerate(DataLoader)#…__next__`` range). Delays never use ``time.sleep``
(it fails under libfaketime): either ``threading.Event().wait`` or busy compute.

Testing knobs: ``--fail-rank R --fail-step S`` raises on rank R at step S; ``--kill-rank R
--kill-step S`` SIGKILLs rank R; ``--no-optimizer`` updates weights by hand and calls
``rankscope.step()`` (``--report-samples``: ``rankscope.step(samples=BATCH)``); ``--bare-profiler`` runs plain torch.profiler with the same schedule (the
overhead benchmark's baseline); ``--step-times FILE`` writes per-step wall and main-thread CPU
seconds (``{rank}`` in FILE is replaced by the rank); ``--straggler-steps N:K`` /
``--input-delay-steps N:K`` put the straggler's work / the slow batches only in the steps with
``step % N == K``, so that one run holds steps with and without the effect (the what-if test);
``--cpu-work-ms MS`` makes every rank compute MS of its thread's CPU time per step (fixed work:
slower when other processes hold the cores); ``--straggler-from S`` starts the straggler's work at step S (a slow-down in the middle of the
run: ``rankscope run --straggler-rank 2 --straggler-ms 30 --straggler-from 150``, the live
monitor's test).

Memory knobs (real allocations the profiler sees with ``rankscope run --profile-memory``; MB is
MiB, 2**20 bytes, on the model's device): ``--leak-mb R:MB`` makes rank R keep MB of new tensors
every step (allocated in ``record_function("rankscope_example::leak")``, never freed);
``--extra-memory-mb R:MB`` makes rank R hold MB more throughout each step (allocated at the start
of the step in ``record_function("rankscope_example::extra_memory")`` and released after the
backward pass, so it is live at the rank's peak). It is released before the optimizer step, inside
the profiled step: the optimizer step ends the step, and a window's last step would otherwise free
it with memory profiling off, which the CPU allocator's counter never subtracts (a 64 MiB phantom
in every later window when the next block lands at another address; analysis/compute/memory.py).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function
from torch.utils.data import DataLoader, IterableDataset


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=20, help="training iterations")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256, help="MLP width")
    p.add_argument("--layers", type=int, default=4, help="MLP depth")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--straggler-rank", type=int, default=-1, help="rank doing extra work each step")
    p.add_argument("--straggler-ms", type=float, default=0.0, help="extra work per step, in ms")
    p.add_argument(
        "--straggler-from",
        type=int,
        default=0,
        metavar="S",
        help="the straggler works only from step S on (a slow-down mid-run: the live monitor's "
        "test)",
    )
    p.add_argument(
        "--straggler-mode",
        choices=("wait", "busy", "cpu"),
        default="wait",
        help="wait: threading.Event().wait; busy: matmuls until the time is spent; cpu: matmuls "
        "until the thread's CPU time is spent",
    )
    p.add_argument(
        "--input-delay-ms", type=float, default=0.0, help="slow data loader, ms per batch"
    )
    p.add_argument(
        "--cpu-work-ms",
        type=float,
        default=0.0,
        help="every rank computes this much CPU time per step (a fixed amount of work: when "
        "other processes take the cores, it takes longer)",
    )
    p.add_argument(
        "--input-delay-rank", type=int, default=-1, help="rank with the slow loader (-1: all)"
    )
    p.add_argument(
        "--straggler-steps",
        type=step_set,
        default=(1, 0),
        metavar="N:K",
        help="the straggler works only in steps with step %% N == K (default 1:0, every step)",
    )
    p.add_argument(
        "--input-delay-steps",
        type=step_set,
        default=(1, 0),
        metavar="N:K",
        help="the loader is slow only for steps with step %% N == K (default 1:0, every step)",
    )
    p.add_argument("--fail-rank", type=int, default=-1, help="rank that raises at --fail-step")
    p.add_argument("--fail-step", type=int, default=0)
    p.add_argument(
        "--fail-attempt",
        type=int,
        default=-1,
        help="fail only in this torchrun restart (-1: every)",
    )
    p.add_argument(
        "--kill-rank", type=int, default=-1, help="rank that SIGKILLs itself at --kill-step"
    )
    p.add_argument("--kill-step", type=int, default=0)
    p.add_argument("--no-optimizer", action="store_true", help="manual SGD + rankscope.step()")
    p.add_argument(
        "--report-samples",
        action="store_true",
        help="with --no-optimizer: rankscope.step(samples=BATCH) (the throughput KPI)",
    )
    p.add_argument("--bare-profiler", action="store_true", help="plain torch.profiler (baseline)")
    p.add_argument(
        "--bare-out", default="bare-profiler-traces", help="trace folder of --bare-profiler"
    )
    p.add_argument("--wait", type=int, default=1, help="--bare-profiler schedule")
    p.add_argument("--warmup", type=int, default=1, help="--bare-profiler schedule")
    p.add_argument("--active", type=int, default=3, help="--bare-profiler schedule")
    p.add_argument("--repeat", type=int, default=1, help="--bare-profiler schedule")
    p.add_argument(
        "--bare-profile-memory",
        action="store_true",
        help="--bare-profiler records allocations (profile_memory=True)",
    )
    p.add_argument("--step-times", default=None, help="write per-step seconds as JSON ({rank} ok)")
    p.add_argument(
        "--leak-mb",
        type=rank_mb,
        default=None,
        metavar="R:MB",
        help="rank R keeps MB MiB of new tensors every step (a leak)",
    )
    p.add_argument(
        "--extra-memory-mb",
        type=rank_mb,
        default=None,
        metavar="R:MB",
        help="rank R holds MB MiB more throughout each step",
    )
    return p.parse_args(argv)


def rank_mb(text: str) -> tuple[int, float]:
    """``R:MB`` → (rank, MiB); argparse reports a ValueError as a usage error."""
    rank, sep, mb = text.partition(":")
    if not sep or int(rank) < 0 or float(mb) < 0:
        raise ValueError(text)
    return int(rank), float(mb)


def step_set(text: str) -> tuple[int, int]:
    """``N:K`` → (N, K): the steps with ``step % N == K`` (an effect on some steps only, so that
    one run holds its steps with and without it)."""
    n, sep, k = text.partition(":")
    if not sep or int(n) < 1 or not 0 <= int(k) < int(n):
        raise ValueError(text)
    return int(n), int(k)


def on_step(step: int, steps: tuple[int, int]) -> bool:
    """Whether ``step`` is in the ``--*-steps`` set ``steps``."""
    return step % steps[0] == steps[1]


def allocate_mb(mb: float, device: torch.device) -> torch.Tensor:
    """A real ``mb`` MiB tensor on ``device`` (uint8; ``torch.ones`` touches every page)."""
    return torch.ones(int(mb * 2**20), dtype=torch.uint8, device=device)


def spend(ms: float, mode: str) -> None:
    """Spend ``ms`` milliseconds without time.sleep (which fails under libfaketime)."""
    if ms <= 0:
        return
    if mode == "wait":
        threading.Event().wait(ms / 1000)
        return
    clock = time.thread_time if mode == "cpu" else time.perf_counter
    deadline = clock() + ms / 1000
    a = torch.randn(64, 64)
    while clock() < deadline:
        a = torch.tanh(a @ a)


class RandomBatches(IterableDataset):
    """Endless random (input, target) batches; ``delay_ms`` models a slow input pipeline (for
    the batches of the steps in ``delay_steps``: batch i is step i's, one batch per step)."""

    def __init__(
        self, batch: int, width: int, delay_ms: float, seed: int, delay_steps: tuple[int, int]
    ) -> None:
        self.batch, self.width, self.delay_ms, self.seed = batch, width, delay_ms, seed
        self.delay_steps = delay_steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        gen = torch.Generator().manual_seed(self.seed)
        i = 0
        while True:
            spend(self.delay_ms if on_step(i, self.delay_steps) else 0.0, "wait")
            i += 1
            x = torch.randn(self.batch, self.width, generator=gen)
            yield x, x.roll(1, dims=1)


def mlp(width: int, layers: int) -> nn.Module:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.GELU()]
    mods.append(nn.Linear(width, width))
    return nn.Sequential(*mods)


def bare_profiler(args: argparse.Namespace, rank: int) -> torch.profiler.profile:
    """Plain torch.profiler with the same schedule, writing gzip Chrome traces."""
    out = Path(args.bare_out)
    out.mkdir(parents=True, exist_ok=True)
    windows = [0]

    def ready(prof: torch.profiler.profile) -> None:
        tmp = out / f"rank{rank}-{windows[0]}.json"
        prof.export_chrome_trace(str(tmp))
        (out / f"rank{rank}-{windows[0]}.json.gz").write_bytes(gzip.compress(tmp.read_bytes(), 3))
        tmp.unlink()
        windows[0] += 1

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(
            wait=args.wait, warmup=args.warmup, active=args.active, repeat=args.repeat
        ),
        on_trace_ready=ready,
        profile_memory=args.bare_profile_memory,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    torch.manual_seed(0)

    model = DistributedDataParallel(
        mlp(args.hidden, args.layers).to(device), device_ids=[local_rank] if cuda else None
    )
    optimizer = None if args.no_optimizer else torch.optim.SGD(model.parameters(), lr=args.lr)
    delay = args.input_delay_ms if args.input_delay_rank in (-1, rank) else 0.0
    loader = DataLoader(
        RandomBatches(args.batch_size, args.hidden, delay, rank, args.input_delay_steps),
        batch_size=None,
    )
    prof = bare_profiler(args, rank) if args.bare_profiler else None
    if prof is not None:
        prof.start()
    if args.no_optimizer:
        import rankscope

    leak_mb = args.leak_mb[1] if args.leak_mb and args.leak_mb[0] == rank else 0.0
    extra_mb = (
        args.extra_memory_mb[1] if args.extra_memory_mb and args.extra_memory_mb[0] == rank else 0.0
    )
    leaked: list[torch.Tensor] = []  # --leak-mb: kept for the whole run
    times: list[float] = []
    cpu_times: list[float] = []  # main-thread CPU s per step: robust to a loaded machine
    t0 = time.perf_counter()
    c0 = time.thread_time()
    for step, (x, y) in enumerate(loader):
        if step >= args.steps:
            break
        if step == args.fail_step and rank == args.fail_rank and args.fail_attempt in (-1, attempt):
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        if step == args.kill_step and rank == args.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        extra = None
        if extra_mb > 0:
            with record_function("rankscope_example::extra_memory"):
                extra = allocate_mb(extra_mb, device)
        if leak_mb > 0:
            with record_function("rankscope_example::leak"):
                leaked.append(allocate_mb(leak_mb, device))
        if (
            rank == args.straggler_rank
            and args.straggler_ms > 0
            and on_step(step, args.straggler_steps)
            and step >= args.straggler_from
        ):
            with record_function("straggler_work"):
                spend(args.straggler_ms, args.straggler_mode)
        if args.cpu_work_ms > 0:
            with record_function("rankscope_example::cpu_work"):
                spend(args.cpu_work_ms, "cpu")
        loss = nn.functional.mse_loss(model(x), y)
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            del extra  # --extra-memory-mb: held through forward and backward
            optimizer.step()
        else:
            model.zero_grad(set_to_none=True)
            loss.backward()
            del extra
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-args.lr)
            rankscope.step(samples=x.shape[0] if args.report_samples else None)
        if prof is not None:
            prof.step()
        if cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        c1 = time.thread_time()
        times.append(t1 - t0)
        cpu_times.append(c1 - c0)
        t0, c0 = t1, c1
    if prof is not None:
        prof.stop()
    if rank == 0:
        print(f"train_ddp: {len(times)} steps, last loss {loss.item():.4f}", flush=True)
    if args.step_times:
        path = Path(args.step_times.format(rank=rank))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rank": rank, "step_s": times, "step_cpu_s": cpu_times}))
    dist.barrier()  # no rank tears gloo down while a peer still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
