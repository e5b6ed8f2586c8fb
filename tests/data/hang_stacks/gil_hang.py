"""A 2-rank gloo job whose rank 1 gets stuck in C code that holds the GIL (a regular expression
that backtracks for hours: ``re`` never releases the GIL), so its hang probe's thread cannot
answer: only faulthandler (from C, on SIGUSR2) and py-spy (reading the process's memory) can say
where it is. Rank 0 waits in the step's all-reduce. Made the files beside it (see README.md):

    rankscope run --nproc-per-node 2 --hang-after 10 --out OUT tests/data/hang_stacks/gil_hang.py
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
from torch import nn

#: Catastrophic backtracking: (a+)+ against 40 a's and no match: 2**40 tries, in C, GIL held.
STUCK = re.compile(r"(a+)+$")


def stuck_in_c() -> None:
    STUCK.match("a" * 40 + "b")  # the rank stuck in C code holding the GIL


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(40):
        loss = model(torch.randn(4, 8)).square().mean()
        loss.backward()
        if rank == 1 and step == 3:
            stuck_in_c()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(grads)  # the gradient all-reduce
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
