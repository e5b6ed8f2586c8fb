"""Kineto JSON of one rank of a parallel job: the same layout as the DDP writer (:mod:`.render`),
events written in program order with their own ids and args.

``distributedInfo.pg_config`` lists the groups the rank is a member of (torch lists the groups
its ``_world`` holds: those the rank joined), ``pg_count`` their number; gloo groups carry
``backend_config`` ``cpu:gloo``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from rankscope.orchestrator.synth.config import NCCL_VERSION
from rankscope.orchestrator.synth.parallel import STREAMS
from rankscope.orchestrator.synth.render import (
    AUTOGRAD_TID_OFFSET,
    _device_properties,
    _json_str,
    metadata_events,
)
from rankscope.orchestrator.synth.truth import _host_name, clock_params, host_clock

if TYPE_CHECKING:
    from rankscope.orchestrator.synth.parallel import ParallelJob

#: One X event in Kineto's layout (the streaming reader cuts at these block boundaries).
EVENT = (
    '\n  {{\n    "ph": "X", "cat": "{cat}", "name": {name}, "pid": {pid}, "tid": {tid},\n'
    '    "ts": {ts}, "dur": {dur},\n    "args": {{\n      {body}\n    }}\n  }},'
)


def _stamp(ns: int) -> str:
    """ns -> Kineto's µs text with 3 decimals."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def _pg_config(job: ParallelJob, rank: int) -> tuple[int, str]:
    groups = job.layout.member_of(rank)
    items = []
    for g in groups:
        backend = "cpu:gloo" if g.backend == "gloo" else "cuda:nccl"
        ranks = ", ".join(str(r) for r in g.ranks)
        items.append(
            f'{{"pg_name": "{g.name}", "pg_desc": "{g.desc}", "backend_config": "{backend}", '
            f'"pg_size": {len(g.ranks)}, "ranks": [{ranks}]}}'
        )
    return len(groups), ", ".join(items)


def render_parallel_rank(job: ParallelJob, rank: int, base_ns: int) -> tuple[bytes, int]:
    """The Kineto JSON text of ``rank`` (stamps on its host clock) and its event count."""
    c = job.config
    offset, ppm = clock_params(c)
    events = job.events[rank]
    starts = np.fromiter((e.start for e in events), np.int64, len(events))
    ends = np.fromiter((e.end for e in events), np.int64, len(events))
    rs = (host_clock(c, starts, offset[rank], ppm[rank]) - base_ns).tolist()
    re_ = (host_clock(c, ends, offset[rank], ppm[rank]) - base_ns).tolist()
    pid = int(job.pids[rank])
    device = rank % c.ranks_per_host
    tids = {"main": pid, "autograd": pid + AUTOGRAD_TID_OFFSET, **STREAMS}
    pieces = []
    count = 0
    used: set[str] = set()
    for e, a, b in zip(events, rs, re_, strict=True):
        gpu = e.kind == "gpu"
        tid = tids[e.lane]
        if gpu:
            used.add(e.lane)
            body = f'"External id": {e.ext}' + e.args.replace(
                '"stream":', f'"correlation": {e.corr}, "stream":', 1
            )
        elif e.kind == "runtime":
            body = f'"External id": {e.ext}, "correlation": {e.corr}' + e.args
        else:
            body = f'"External id": {e.ext}' + e.args
        ts = _stamp(a)
        pieces.append(
            EVENT.format(
                cat=e.cat,
                name=_json_str(e.name),
                pid=device if gpu else pid,
                tid=tid,
                ts=ts,
                dur=_stamp(b - a),
                body=body,
            )
        )
        count += 1
        if e.kind == "runtime" and e.flow:
            pieces.append(
                f'\n  {{\n    "ph": "s", "id": {e.corr}, "pid": {pid}, "tid": {tid}, "ts": {ts},\n'
                '    "cat": "ac2g", "name": "ac2g"\n  },'
            )
            count += 1
        elif gpu:
            pieces.append(
                f'\n  {{\n    "ph": "f", "id": {e.corr}, "pid": {device}, "tid": {tid}, "ts": {ts},\n'
                '    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  },'
            )
            count += 1
    first = min(rs)
    last = max(re_)
    first_ts = _stamp(first)
    streams = [STREAMS[lane] for lane in sorted(used | {"compute"}, key=lambda x: STREAMS[x])]
    meta = metadata_events(pid, device, first_ts, streams)
    span = last - first
    trace_span = (
        f'\n  {{\n    "ph": "X", "cat": "Trace", "ts": {first_ts}, "dur": {_stamp(span)},\n'
        '    "pid": "Spans", "tid": "PyTorch Profiler",\n'
        f'    "name": "PyTorch Profiler (0)",\n    "args": {{\n      "Op count": 0\n    }}\n  }},'
        f'\n  {{\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
        f'    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": {first_ts}\n  }},'
    )
    pg_count, pg_config = _pg_config(job, rank)
    host = _host_name(rank // c.ranks_per_host)
    head = (
        '\n{\n  "schemaVersion": 1,\n  "deviceProperties": ['
        + _device_properties(c.ranks_per_host)
        + "\n  ],"
        + f'\n  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {c.ranks}, '
        f'"pg_count": {pg_count}, "pg_config": [{pg_config}], "nccl_version": "{NCCL_VERSION}"}},'
        '\n  "cuda_runtime_version": 12040,\n  "cuda_driver_version": 12040,'
        f'\n  "host_name": "{host}",'
        '\n  "traceEvents": ['
    )
    tail = (
        f'\n  {{\n    "name": "Record Window End", "ph": "i", "s": "g",\n    "pid": "", "tid": "", "ts": {_stamp(last)}\n  }}\n  ],'
        f'\n  "traceName": "/tmp/traces/{host}_{pid}.pt.trace.json",'
        f'\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {base_ns}\n}}'
    )
    text = head + meta + trace_span + "".join(pieces) + tail
    return text.encode(), count + 3
