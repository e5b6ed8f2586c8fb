"""What gloo's Flight Recorder records of point-to-point ops (PyTorch 2.13, CPU): a 3-rank job
that does each kind once — blocking send/recv, isend/irecv, batch_isend_irecv (a ring) — with a
collective between, then writes its rank's ``_dump_fr_trace_json()`` (as the hang probe reads
it). Made ``fr-p2p-ops-rank1.json`` beside it (README.md):

    TORCH_FR_BUFFER_SIZE=2000 torchrun --nproc-per-node 3 tests/data/hang_p2p/fr_p2p_ops.py OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.zeros(4)
    if rank == 0:
        dist.send(torch.ones(4), 1)
    elif rank == 1:
        dist.recv(t, 0)
    dist.all_reduce(t)
    if rank == 1:
        dist.isend(torch.ones(8), 2).wait()
    elif rank == 2:
        dist.irecv(torch.zeros(8), 1).wait()
    ring = [
        dist.P2POp(dist.isend, torch.ones(3), (rank + 1) % world),
        dist.P2POp(dist.irecv, torch.zeros(3), (rank - 1) % world),
    ]
    for work in dist.batch_isend_irecv(ring):
        work.wait()
    dist.barrier()
    text = c10d._dump_fr_trace_json(includeCollectives=True)
    out = Path(sys.argv[1]) / f"fr-p2p-ops-rank{rank}.json"
    out.write_text(text if isinstance(text, str) else bytes(text).decode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
