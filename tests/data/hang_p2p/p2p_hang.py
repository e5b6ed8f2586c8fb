"""A 3-rank gloo pipeline (stage 0 -> 1 -> 2: blocking send/recv and isend/irecv between the
stages, a gradient all-reduce of all three every step) that hangs, for the point-to-point rule
of the hang diagnosis. Made the files beside it (README.md):

    rankscope run --nproc-per-node 3 --hang-after 10 --no-merge --no-analyze --out OUT \
        tests/data/hang_p2p/p2p_hang.py --hang chain
    rankscope run --nproc-per-node 3 --hang-after 10 --no-merge --no-analyze --out OUT \
        tests/data/hang_p2p/p2p_hang.py --hang collective

``chain``: at step 3 stage 0 (rank 0) spins in an endless loop before its send; rank 1 waits in
recv from rank 0, rank 2 in recv from rank 1. ``collective``: only ranks 1 and 2 exchange (1 ->
2) before each all-reduce; at step 3 rank 1 spins before the all-reduce, ranks 0 and 2 wait in
it (gloo's group sequence counts the point-to-point ops: rank 2's is ahead of rank 0's).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

HANG_STEP = 3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hang", choices=["chain", "collective"], required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(40):
        act = torch.zeros(4)
        if args.hang == "chain":
            if rank == 0:
                if step == HANG_STEP:
                    while True:  # stage 0 stuck before its send
                        pass
                dist.send(torch.ones(4), 1)  # stage 0 sends its activations
            elif rank == 1:
                dist.recv(act, 0)  # stage 1 receives from stage 0
                dist.isend(act, 2).wait()  # and sends on, non-blocking
            else:
                dist.irecv(act, 1).wait() if step < HANG_STEP else dist.recv(act, 1)  # stage 2
        elif rank == 1:
            dist.send(torch.ones(4), 2)
            if step == HANG_STEP:
                while True:  # rank 1 stuck before the all-reduce
                    pass
        elif rank == 2:
            dist.recv(act, 1)
        loss = model(act).square().mean()
        loss.backward()
        for q in model.parameters():
            dist.all_reduce(q.grad)  # the gradient all-reduce
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
