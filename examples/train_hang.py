"""A small data-parallel job that hangs (or dies) the ways real jobs do, for ``rankscope run``'s
hang diagnosis:

    rankscope run --nproc-per-node 2 --hang-after 20 examples/train_hang.py --hang loop --rank 1
    rankscope run --nproc-per-node 2 --hang-after 20 examples/train_hang.py --hang poll --rank 1
    rankscope run --nproc-per-node 2 --hang-after 20 examples/train_hang.py --hang loader --rank 1
    rankscope run --nproc-per-node 2 --hang-after 20 examples/train_hang.py --hang desync --rank 1
    rankscope run --nproc-per-node 2 --hang-after 20 examples/train_hang.py --hang p2p --rank 0
    rankscope run --nproc-per-node 2 examples/train_hang.py --hang kill --rank 1
    rankscope run --nproc-per-node 2 --hang-after 20 examples/train_hang.py --grow 0.2:3 --steps 12
    rankscope run --nproc-per-node 2 examples/train_hang.py --hang loader --rank 1 --pg-timeout 10

``--hang loop``: rank R spins forever after step ``--after`` (an endless loop in user code);
``poll``: rank R polls forever for a file that never comes (an endless loop that mostly sleeps:
waiting for a marker another process should write — the same hang without the spinning core);
``loader``: rank R's DataLoader worker never yields batch ``--after`` (a data-loader deadlock);
``desync``: at step ``--after`` rank R calls all_gather where the others call all_reduce;
``p2p``: every step is a pipeline's too — each rank receives its input from the rank before it
and sends its output to the rank after it (``dist.recv``/``dist.send``) — and at step ``--after``
rank R skips its send (another branch) and goes on to the all-reduce, while the rank after it
waits in ``recv``; ``kill``: rank R is killed with SIGKILL in the middle of step ``--after``. ``--grow A:B`` makes
the steps take from A to B seconds (a slow job, not a hung one; the time is spent waiting, as for
slow input, so the example costs the machine little). ``--pg-timeout S``
passes ``timeout=S seconds`` to ``init_process_group``: the ranks that wait for a hung rank then
fail with gloo's collective timeout after S seconds (a hang all the same). gloo on CPU.
Delays never use ``time.sleep`` (``threading.Event().wait``: libfaketime-safe).

The update is plain SGD written out, and each step ends with ``rankscope.step()``: no
``torch.optim`` optimizer, because the first one built imports ``torch._dynamo`` (its
``add_param_group`` is wrapped by ``torch._compile._disable_dynamo``): ~3 s of CPU per process
on a 2-core machine, more than this job's own work, paid by every rank of each of the test
suite's hung jobs. (torch's own profiler imports it too when a window starts —
``prepare_trace`` asks ``hasattr(torch, "_inductor")`` —; rankscope's runtime does not:
``launchers/profiler.py``.) A job with an optimizer is stepped by its optimizer's hook instead
(examples/train_ddp.py); the hang diagnosis is the same.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import rankscope
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=40, help="training iterations")
    p.add_argument(
        "--hang",
        choices=["none", "loop", "poll", "loader", "desync", "kill", "p2p"],
        default="none",
    )
    p.add_argument("--rank", type=int, default=1, help="the rank that hangs or dies")
    p.add_argument("--after", type=int, default=4, help="the step at which it does")
    p.add_argument("--grow", default="", metavar="A:B", help="steps take from A to B seconds")
    p.add_argument("--step-s", type=float, default=0.05, help="seconds of work per step")
    p.add_argument(
        "--pg-timeout",
        type=float,
        default=None,
        help="collective timeout in seconds (gloo's 30 min)",
    )
    return p.parse_args()


class Batches(IterableDataset):
    """Random batches; on the hanging rank, the worker stops yielding at batch ``stop``."""

    def __init__(self, stop: int | None) -> None:
        self.stop = stop

    def __iter__(self) -> Iterator[torch.Tensor]:
        i = 0
        while True:
            if self.stop is not None and i == self.stop:
                threading.Event().wait()  # a worker that never yields again (a deadlock)
            yield torch.randn(16, 32)
            i += 1


#: Seconds the dying rank spends in its last step before SIGKILL (--hang kill).
KILL_AFTER_S = 2.0
#: The file ``--hang poll`` waits for: nobody writes it.
NEVER_WRITTEN = Path("/nonexistent/rankscope-example/ready")


def busy(seconds: float) -> None:
    """Compute for ``seconds`` (no sleep)."""
    end = time.perf_counter() + seconds
    x = torch.randn(192, 192) / 192
    while time.perf_counter() < end:
        x = torch.tanh(x @ x)  # few, large ops: a small trace


def sgd_update(model: nn.Module, grads: torch.Tensor, world: int, lr: float = 0.01) -> None:
    """The optimizer step, written out: parameters -= lr × the mean of the ranks' gradients
    (``grads``: their all-reduced sum, flattened in ``model.parameters()`` order)."""
    with torch.no_grad():
        offset = 0
        for param in model.parameters():
            n = param.numel()
            param -= lr * grads[offset : offset + n].view_as(param) / world
            offset += n
            param.grad = None


def pipeline_stage(x: torch.Tensor, rank: int, world: int, skip_send: bool) -> torch.Tensor:
    """A pipeline's forward hand-over: receive the previous rank's activations, send ours on
    (``skip_send``: the branch that forgets to)."""
    if rank > 0:
        x = torch.empty_like(x)
        dist.recv(x, rank - 1)  # the stage's receive from the rank before it
    if rank < world - 1 and not skip_send:
        dist.send(x, rank + 1)  # the stage's send to the rank after it
    return x


def main() -> None:
    args = parse_args()
    timeout = None if args.pg_timeout is None else timedelta(seconds=args.pg_timeout)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = nn.Linear(32, 32)
    me = rank == args.rank
    stop = args.after if me and args.hang == "loader" else None
    loader = DataLoader(Batches(stop), batch_size=None, num_workers=1)
    grow = [float(v) for v in args.grow.split(":")] if args.grow else None
    for step, batch in enumerate(loader):
        if step >= args.steps:
            break
        if args.hang == "p2p":
            batch = pipeline_stage(batch, rank, world, skip_send=me and step == args.after)
        loss = model(batch).square().mean()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        if me and step == args.after and args.hang == "loop":
            while True:  # the endless loop
                pass
        if me and step == args.after and args.hang == "poll":
            while not NEVER_WRITTEN.exists():  # the endless poll
                threading.Event().wait(0.01)
        if me and step == args.after and args.hang == "kill":
            # dies in the middle of a long piece of its step (waiting for its input), while the
            # others already wait in the step's all-reduce (they did their 0.05 s long before)
            threading.Event().wait(KILL_AFTER_S)
            os.kill(os.getpid(), signal.SIGKILL)
        if me and step == args.after and args.hang == "desync":
            out = [torch.empty_like(grads) for _ in range(world)]
            dist.all_gather(out, grads)  # the desync: the others call all_reduce here
        else:
            dist.all_reduce(grads)  # the gradient all-reduce
        sgd_update(model, grads, world)
        rankscope.step()  # the step ends here (where an optimizer's step would)
        if grow:
            threading.Event().wait(grow[0] + (grow[1] - grow[0]) * step / max(args.steps - 1, 1))
        else:
            busy(args.step_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
