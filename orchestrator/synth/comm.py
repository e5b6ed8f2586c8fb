"""What torch's profiler writes for one NCCL operation of a parallel job, and how long its bytes
take to move.

``record_param_comms`` carries (torch ``saveNcclMeta``): ``Collective name``, message sizes,
``Group size``, ``dtype``, split sizes, ``Global rank start`` / ``stride`` (evenly strided groups
only), ``Process Group Name`` / ``Description`` / ``Ranks``, ``Rank`` and ``Seq``; a send adds
``Dst Rank`` and a recv ``Src Rank`` (global ranks), and for both ``Rank`` is the PEER's group
rank (the macro passes the peer). The NCCL kernel gets what Kineto copies: the name, sizes,
group size, dtype, split sizes, group name / description / ranks and ``Dst`` / ``Src Rank`` —
not ``Rank``, ``Seq`` or the global rank start / stride.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import StrEnum

from rankscope.orchestrator.synth.config import RANKS_TRUNCATE, SynthConfig
from rankscope.orchestrator.synth.layout import Group

#: Bytes per element of the messages (float32: ``dtype`` ``Float``).
ELEMENT_BYTES = 4
#: NCCL's device kernel of point-to-point work (send, recv and all-to-all).
SENDRECV_KERNEL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


class CollOp(StrEnum):
    """An NCCL operation, by the ``Collective name`` torch writes."""

    ALLREDUCE = "allreduce"
    REDUCE_SCATTER = "_reduce_scatter_base"
    ALL_GATHER = "_allgather_base"
    SEND = "send"
    RECV = "recv"


@dataclass(frozen=True)
class OpNames:
    """The names around one operation: c10d dispatcher op and the Work's record_function."""

    c10d: str
    work: str


#: c10d op and ``nccl:*`` record_function of each collective (send/recv: see :func:`p2p_names`).
COLL_NAMES = {
    CollOp.ALLREDUCE: OpNames("c10d::allreduce_", "nccl:all_reduce"),
    CollOp.REDUCE_SCATTER: OpNames("c10d::_reduce_scatter_base_", "nccl:_reduce_scatter_base"),
    CollOp.ALL_GATHER: OpNames("c10d::_allgather_base_", "nccl:_all_gather_base"),
}


def p2p_names(op: CollOp, me: int, peer: int) -> OpNames:
    """Names of a send / recv between group ranks ``me`` and ``peer`` (torch: ``nccl:send 0->1``,
    ``nccl:recv 1<-0``, group-local ranks)."""
    if op is CollOp.SEND:
        return OpNames("c10d::send", f"nccl:send {me}->{peer}")
    return OpNames("c10d::recv_", f"nccl:recv {me}<-{peer}")


def _protocol(nbytes: int) -> str:
    return "LL" if nbytes < (64 << 10) else "LL128" if nbytes < (8 << 20) else "SIMPLE"


def kernel_name(op: CollOp, nbytes: int) -> str:
    """The NCCL 2.x kernel of ``op`` on a float32 message of ``nbytes`` (ring, protocol by size)."""
    proto = _protocol(nbytes)
    if op is CollOp.ALLREDUCE:
        return f"ncclDevKernel_AllReduce_Sum_f32_RING_{proto}(ncclDevKernelArgsStorage<4096ul>)"
    if op is CollOp.REDUCE_SCATTER:
        return f"ncclDevKernel_ReduceScatter_Sum_f32_RING_{proto}(ncclDevKernelArgsStorage<4096ul>)"
    if op is CollOp.ALL_GATHER:
        return f"ncclDevKernel_AllGather_RING_{proto}(ncclDevKernelArgsStorage<4096ul>)"
    return SENDRECV_KERNEL


def ranks_text(ranks: tuple[int, ...]) -> str:
    """``Process Group Ranks`` as torch writes it: a string, truncated after 30 ranks."""
    shown = ", ".join(str(r) for r in ranks[:RANKS_TRUNCATE])
    return f"[{shown}, ...]" if len(ranks) > RANKS_TRUNCATE else f"[{shown}]"


def _stride(group: Group) -> str:
    """``Global rank start`` / ``stride`` when the group's ranks are evenly strided."""
    r = group.ranks
    step = r[1] - r[0] if len(r) > 1 else 1
    if step > 0 and all(b - a == step for a, b in itertools.pairwise(r)):
        return f', "Global rank start": {r[0]}, "Global rank stride": {step}'
    return ""


def comm_args(
    op: CollOp,
    group: Group,
    nbytes: int,
    *,
    rank: int,
    seq: int,
    peer: int = -1,
    peer_args: bool = True,
) -> tuple[str, str]:
    """(``record_param_comms`` args, NCCL kernel args) as JSON text, each with a leading comma.

    ``rank``: this rank's global rank; ``peer``: the other side's global rank (send / recv);
    ``peer_args`` False leaves out ``Rank`` and ``Src`` / ``Dst Rank`` of send / recv (older
    torch).
    """
    n = nbytes // ELEMENT_BYTES
    size = len(group.ranks)
    out_n = n // size if op is CollOp.REDUCE_SCATTER else n * size if op is CollOp.ALL_GATHER else n
    common = (
        f', "Collective name": "{op.value}", "In msg nelems": {n}, "Out msg nelems": {out_n}, '
        f'"Group size": {size}, "dtype": "Float", "In split size": "[]", "Out split size": "[]"'
    )
    pg = (
        f', "Process Group Name": "{group.name}", "Process Group Description": "{group.desc}", '
        f'"Process Group Ranks": "{ranks_text(group.ranks)}"'
    )
    p2p = op in (CollOp.SEND, CollOp.RECV)
    peer_key = "Dst Rank" if op is CollOp.SEND else "Src Rank"
    peer_text = f', "{peer_key}": {peer}' if p2p and peer_args else ""
    if p2p:
        rank_text = f', "Rank": {group.rank_of(peer)}' if peer_args else ""
    else:
        rank_text = f', "Rank": {group.rank_of(rank)}'
    rpc = common + _stride(group) + pg + rank_text + peer_text + f', "Seq": {seq}'
    return rpc, common + pg + peer_text


def transfer_ns(config: SynthConfig, op: CollOp, group: tuple[int, ...], nbytes: int) -> int:
    """Time to move the bytes once every member is there (ns): link latency + ring traffic over
    the bandwidth (NVLink inside one host, the network across hosts), times ``slow_link`` and
    the ``slow_host_link`` factor of a host pair the group spans. Ring traffic per rank:
    all-reduce 2(n-1)/n x bytes, reduce-scatter (n-1)/n x its input, all-gather (n-1) x its
    input (the shard), send/recv the bytes (``nbytes``: the input message)."""
    n = len(group)
    hosts = {r // config.ranks_per_host for r in group}
    gbps = config.nvlink_gbps if len(hosts) == 1 else config.link_gbps
    if op in (CollOp.SEND, CollOp.RECV):
        traffic = float(nbytes)
    elif op is CollOp.ALLREDUCE:
        traffic = nbytes * 2 * (n - 1) / n
    elif op is CollOp.REDUCE_SCATTER:
        traffic = nbytes * (n - 1) / n
    else:
        traffic = float(nbytes * (n - 1))
    factor = config.slow_link
    for a, b, f in config.slow_host_link:
        if a in hosts and b in hosts:
            factor *= f
    return round((config.link_latency_us * 1e-6 + traffic / (gbps * 1e9)) * factor * 1e9)
