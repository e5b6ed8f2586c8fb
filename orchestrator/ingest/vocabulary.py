"""The Kineto event vocabulary: what an event is (:func:`classify`) and which collective it runs.

Kineto names things several ways for one meaning — communication kernels (NCCL's
``ncclKernel_*`` / ``ncclDevKernel_*`` and other libraries', ``comm_kernels.py``), gloo ops (``gloo:all_reduce``), c10d names and ``record_param_comms`` args
(``Collective name``) — and the store keeps one word for each: an :class:`EventKind` per event,
decided once at merge time, and a normalised op name per communication event. The rules live
here, apart from the decoder, so adding a trace source changes one table, not the reader.
"""

from __future__ import annotations

import re
from typing import Any

from rankscope.analysis.store.schema import EventKind
from rankscope.orchestrator.ingest.comm_kernels import DEFAULT_VOCABULARY, CommVocabulary

#: The op part of an NCCL kernel name (``ncclDevKernel_AllGather_RING_LL`` → ``AllGather``).
NCCL_KERNEL_OP = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
#: Prefix of gloo's CPU-side collectives (``gloo:all_reduce``).
GLOO_PREFIX = "gloo:"
#: Kineto categories of events that run on a GPU stream.
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})
#: Event kinds that run on a GPU stream (their step and host time are their launch's).
GPU_KINDS = (EventKind.KERNEL_COMPUTE, EventKind.KERNEL_COMM, EventKind.MEMCPY, EventKind.MEMSET)
#: Collective op names from NCCL kernel names / gloo ops / c10d names, normalised.
OP_ALIASES = {
    "all_reduce": "allreduce",
    "allreduce": "allreduce",
    "all_gather": "allgather",
    "allgather": "allgather",
    "all_gather_into_tensor": "allgather",
    "_allgather_base": "allgather",
    "reduce_scatter": "reducescatter",
    "reducescatter": "reducescatter",
    "_reduce_scatter_base": "reducescatter",
    "reduce_scatter_tensor": "reducescatter",
    "all_to_all": "alltoall",
    "alltoall": "alltoall",
    "alltoall_base": "alltoall",
    "all_to_allv": "alltoall",
    "sendrecv": "sendrecv",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
}
#: The CPU op that carries an NCCL call's metadata (``saveNcclMeta`` args: group, Seq, peer).
RECORD_PARAM_COMMS = "record_param_comms"
#: The Work record_function of a ``batch_isend_irecv`` (or other coalesced) batch on NCCL: its
#: kernel is launched inside it, after the batch's ``record_param_comms`` ops, none of which
#: holds the launch (docs/analysis.md, "Point-to-point pairs").
NCCL_COALESCED = "nccl:coalesced"
#: Ops whose peer a trace or an annotation may name (a ``SendRecv`` kernel is either direction).
PEER_OPS = frozenset({"send", "recv", "sendrecv"})
#: bytes per element of record_param_comms ``dtype``.
DTYPE_BYTES = {
    "Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8,
    "Byte": 1, "Char": 1, "Short": 2, "Bool": 1,
}  # fmt: skip
#: Bytes per element assumed for a ``dtype`` missing from :data:`DTYPE_BYTES` (1 when absent).
UNKNOWN_DTYPE_BYTES = 4


def classify(cat: str, name: str, comm: CommVocabulary = DEFAULT_VOCABULARY) -> EventKind:
    """The :class:`EventKind` of an event from its Kineto category and name; a kernel is
    communication when ``comm`` (the communication kernels in force, ``comm_kernels.py``) says so."""
    if cat == "kernel":
        return EventKind.KERNEL_COMM if comm.is_comm(name) else EventKind.KERNEL_COMPUTE
    if cat == "gpu_memcpy":
        return EventKind.MEMCPY
    if cat == "gpu_memset":
        return EventKind.MEMSET
    if cat == "cuda_sync":
        return EventKind.SYNC
    if cat in ("cuda_runtime", "cuda_driver"):
        return EventKind.RUNTIME
    if name.startswith("ProfilerStep#"):
        return EventKind.PROFILER_STEP
    if name.startswith(GLOO_PREFIX):
        return EventKind.COMM_CPU
    if name.startswith("c10d::") or name == "record_param_comms" or name.startswith("nccl:"):
        return EventKind.COMM_ENQUEUE
    if cat in ("user_annotation", "gpu_user_annotation"):
        return EventKind.USER_ANNOTATION
    if cat == "python_function":
        return EventKind.PYTHON
    if cat in ("cpu_op", "operator", "cpu_instant_event"):
        return EventKind.CPU_OP
    return EventKind.OTHER


def collective_op(name: str, collective_arg: Any = None) -> str:
    """Normalised op name (allreduce, allgather, alltoall, sendrecv, ...) of a comm event."""
    if isinstance(collective_arg, str) and collective_arg:
        key = collective_arg.lower()
        return OP_ALIASES.get(key, key)
    if name.startswith(GLOO_PREFIX):
        key = name[len(GLOO_PREFIX) :].lower()
        return OP_ALIASES.get(key, key)
    m = NCCL_KERNEL_OP.match(name)
    if m:
        key = m.group(1).lower()
        return OP_ALIASES.get(key, key)
    return name.lower()


def message_bytes(nelems: Any, dtype: Any) -> int:
    """Bytes of a collective's message from ``In msg nelems`` and ``dtype`` (-1 when unknown)."""
    if not isinstance(nelems, int):
        return -1
    return nelems * DTYPE_BYTES.get(str(dtype), 1 if dtype is None else UNKNOWN_DTYPE_BYTES)


def _global_rank(value: Any) -> int:
    """A rank arg (int, or digits as text) as an int; -1 when absent or not a rank."""
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return -1


def p2p_peer(op: str, dst_rank: Any, src_rank: Any) -> tuple[str, int]:
    """(op, peer) of a comm event from its ``Dst Rank`` / ``Src Rank`` args; peer -1 when unknown.

    PyTorch writes ``Dst Rank`` on a send and ``Src Rank`` on a recv: the peer's GLOBAL rank
    (``ProcessGroupRanks[Rank]``; ``Rank`` itself is the peer's rank in the group, unused here).
    Kineto copies both onto the NCCL kernel even where it copies no ``Collective name``, so a
    ``SendRecv`` kernel (op ``sendrecv``) with exactly one of them takes that direction. Other
    ops (collectives) keep their op and get no peer.
    """
    dst, src = _global_rank(dst_rank), _global_rank(src_rank)
    if op == "send":
        return op, dst
    if op == "recv":
        return op, src
    if op == "sendrecv" and (dst >= 0) != (src >= 0):
        return ("send", dst) if dst >= 0 else ("recv", src)
    return op, -1
