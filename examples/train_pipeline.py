"""A toy pipeline-parallel job: one stage per rank, activations and gradients sent point to point.

    rankscope run --nproc-per-node 4 examples/train_pipeline.py --steps 10
    rankscope run --nproc-per-node 4 examples/train_pipeline.py --slow-stage 1 --slow-ms 20

Each rank holds one linear stage. Per step and micro-batch the forward pass receives the
activation from the previous rank (``dist.recv``) and sends its output to the next
(``dist.send``); the backward pass goes the other way with ``dist.batch_isend_irecv`` (so both
the blocking and the batched P2P paths show up in traces). Gradients are then all-reduced over
all ranks and the optimizer steps (rankscope advances its profiler there).

``--slow-stage R --slow-ms M``: rank R does M ms of extra work per micro-batch in its forward
pass (``threading.Event().wait``, never ``time.sleep``, which fails under libfaketime), so every
later stage waits for it in ``recv``. gloo on CPU, NCCL on GPU.

``--slow-steps N:K``: the slow stage's extra work only in the steps with ``step % N == K`` (one
run then holds steps with and without it: the what-if test); ``--step-times FILE`` writes each
step's wall seconds as JSON (``{rank}`` in FILE is replaced by the rank), as in train_ddp.py.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=10, help="training iterations")
    p.add_argument("--micro-batches", type=int, default=2, help="micro-batches per step")
    p.add_argument("--batch-size", type=int, default=16, help="rows per micro-batch")
    p.add_argument("--hidden", type=int, default=128, help="stage width")
    p.add_argument("--slow-stage", type=int, default=-1, help="rank doing extra forward work")
    p.add_argument("--slow-ms", type=float, default=0.0, help="extra work per micro-batch, ms")
    p.add_argument(
        "--slow-steps",
        type=step_set,
        default=(1, 0),
        metavar="N:K",
        help="the slow stage is slow only in steps with step %% N == K (default 1:0, every step)",
    )
    p.add_argument("--step-times", default=None, help="write per-step seconds as JSON ({rank} ok)")
    return p.parse_args(argv)


def step_set(text: str) -> tuple[int, int]:
    """``N:K`` → (N, K): the steps with ``step % N == K`` (as train_ddp.py's ``--*-steps``)."""
    n, sep, k = text.partition(":")
    if not sep or int(n) < 1 or not 0 <= int(k) < int(n):
        raise ValueError(text)
    return int(n), int(k)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(rank)
    stage = nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.Tanh()).to(device)
    opt = torch.optim.SGD(stage.parameters(), lr=1e-3)
    shape = (args.batch_size, args.hidden)
    pause = threading.Event()
    times: list[float] = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        slow = (
            rank == args.slow_stage
            and args.slow_ms > 0
            and step % args.slow_steps[0] == args.slow_steps[1]
        )
        opt.zero_grad()
        saved = []
        for _mb in range(args.micro_batches):
            x = torch.empty(shape, device=device)
            if rank == 0:
                x.normal_()
            else:
                dist.recv(x, src=rank - 1)
            x.requires_grad_(True)
            with record_function("stage_forward"):
                if slow:
                    pause.wait(args.slow_ms / 1e3)
                y = stage(x)
            if rank < world - 1:
                dist.send(y.detach(), dst=rank + 1)
            saved.append((x, y))
        for x, y in reversed(saved):
            grad = torch.ones_like(y) if rank == world - 1 else torch.empty_like(y)
            if rank < world - 1:
                (work,) = dist.batch_isend_irecv([dist.P2POp(dist.irecv, grad, rank + 1)])
                work.wait()
            y.backward(grad)
            if rank > 0:
                assert x.grad is not None
                (work,) = dist.batch_isend_irecv([dist.P2POp(dist.isend, x.grad, rank - 1)])
                work.wait()
        for p in stage.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    if args.step_times:
        path = Path(args.step_times.format(rank=rank))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rank": rank, "step_s": times}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
