"""Peer annotations for point-to-point ops, so the merge can pair each send with its recv.

gloo's send / recv ops carry no args, and NCCL traces of PyTorch before ``Dst Rank`` /
``Src Rank`` name the group of a send, not its peer, so from those traces alone the merge cannot
tell which recv on rank 2 belongs to which send on rank 1. The rank runtime therefore wraps
``torch.distributed.isend`` / ``irecv`` — which ``send``, ``recv`` and ``batch_isend_irecv`` call —
in a ``record_function`` named :data:`~rankscope.launchers.rundir.P2P_ANNOTATION_FORMAT` with the
peer's global rank. Only while the profiler records: outside windows the wrapper costs one C call
(~0.1 µs) on top of the op.

Recent NCCL traces do name the peer (``Dst Rank`` on a send's ``record_param_comms`` and kernel,
``Src Rank`` on a recv's, global ranks): the merge then uses the trace's and keeps this
annotation as the fallback; where both name a peer and differ, the trace's wins and the
disagreement is counted (``orchestrator/ingest/comm_links.py``, docs/analysis.md "Point-to-point pairs").

A recv from any source (``src=None``) is not annotated: its peer is known only once it completes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

#: Wrapped functions of ``torch.distributed`` and the direction each one is.
WRAPPED = {"isend": "send", "irecv": "recv"}
#: Keyword and position (after the tensor) of the global peer, and of the group-relative peer.
PEER_KEYS = {"send": ("dst", "group_dst"), "recv": ("src", "group_src")}


def install() -> bool:
    """Wrap ``isend`` / ``irecv`` in ``torch.distributed`` (idempotent); False without it."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    from torch.distributed import distributed_c10d as c10d

    originals: dict[Any, Any] = {}
    for name, op in WRAPPED.items():
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_rankscope_wrapped", False):
            continue
        wrapper = _wrap(original, op)
        originals[original] = wrapper
        # both names: send/recv/_check_op look the function up in distributed_c10d's globals,
        # users call it through torch.distributed
        setattr(c10d, name, wrapper)
        setattr(dist, name, wrapper)
    check = getattr(c10d, "_check_op", None)
    if originals and check is not None and not getattr(check, "_rankscope_wrapped", False):
        # P2POp(op=...) accepts only isend / irecv by identity: a reference to the unwrapped
        # function taken before the runtime started must still be accepted
        @functools.wraps(check)
        def check_op(op: Any) -> Any:
            return check(originals.get(op, op))

        check_op._rankscope_wrapped = True  # type: ignore[attr-defined]
        c10d._check_op = check_op
    return True


def peer_of(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Global rank of the peer of an ``isend`` / ``irecv`` call, None when unknown."""
    key, group_key = PEER_KEYS[op]
    peer = kwargs.get(key, args[1] if len(args) > 1 else None)
    if peer is not None:
        return int(peer)
    group_peer = kwargs.get(group_key, args[4] if len(args) > 4 else None)
    if group_peer is None:
        return None
    group = kwargs.get("group", args[2] if len(args) > 2 else None)
    if group is None:
        return int(group_peer)  # the default group: group ranks are global ranks
    import torch.distributed as dist

    return int(dist.get_global_rank(group, int(group_peer)))


def _wrap(original: Callable[..., Any], op: str) -> Callable[..., Any]:
    import torch
    from rankscope.launchers.rundir import P2P_ANNOTATION_FORMAT

    profiler_enabled = torch._C._autograd._profiler_enabled
    record_function = torch.profiler.record_function

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not profiler_enabled():
            return original(*args, **kwargs)
        try:
            peer = peer_of(op, args, kwargs)
        except Exception:  # odd arguments: the op itself will say what is wrong
            peer = None
        if peer is None:
            return original(*args, **kwargs)
        with record_function(P2P_ANNOTATION_FORMAT.format(op=op, peer=peer)):
            return original(*args, **kwargs)

    wrapper._rankscope_wrapped = True  # type: ignore[attr-defined]
    return wrapper
