"""The Kineto JSON text of a data-parallel synthetic job's ranks (``write.generate`` writes it).

Torch 2.x Kineto layout, one event per block, ``ts``/``dur`` in µs with 3 decimals relative to
``baseTimeNanoseconds`` (docs/synth.md, "The traces"); the tensor × pipeline × data
parallel jobs' ranks are rendered by ``parallel_render.py`` with this module's shared pieces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from rankscope.orchestrator.synth.config import (
    COMPUTE_STREAM,
    NCCL_STREAM,
    NCCL_VERSION,
    TRIMONTH_S,
    SynthConfig,
)
from rankscope.orchestrator.synth.truth import _host_name, clock_params, host_clock

if TYPE_CHECKING:
    from rankscope.orchestrator.synth.ddp import Job


def _json_str(text: str) -> str:
    import json

    return json.dumps(text)


def _device_properties(devices: int) -> str:
    entries = []
    for d in range(devices):
        entries.append(
            f'\n    {{\n      "id": {d}, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045280768,\n'
            '      "computeMajor": 9, "computeMinor": 0,\n'
            '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
            '      "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,\n'
            '      "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233472,\n'
            '      "numSms": 132, "sharedMemPerBlockOptin": 232448\n    }'
        )
    return ",".join(entries)


def _formats(job: Job, rank: int) -> list[str]:
    """Per template, the %-format text of its event (and flow) for ``rank``."""
    c = job.config
    pid = int(job.pids[rank])
    device = rank % c.ranks_per_host
    tids = {"main": pid, "autograd": pid + 61, "compute": COMPUTE_STREAM, "nccl": NCCL_STREAM}
    out = []
    for t in job.templates:
        name = _json_str(t.name).replace("%", "%%")
        if t.name == "ProfilerStep#":
            name = '"ProfilerStep#%(n)d"'
        lane_pid = device if t.kind == "gpu" else pid
        tid = tids[t.lane]
        ids = ""
        if t.kind == "cpu":
            ids = '"External id": %(x)d'
        elif t.kind == "runtime":
            ids = '"External id": %(x)d, "correlation": %(c)d' if t.ext else '"correlation": %(c)d'
        else:
            ids = '"External id": %(x)d' if t.ext else ""
        args = t.args.replace('"device": 0,', f'"device": {device},').replace("%", "%%")
        if t.kind == "gpu":
            args = args.replace('"stream":', '"correlation": %(c)d, "stream":', 1)
        if t.coll >= 0:
            args += f', "Rank": {rank}, "Seq": %(q)d'
        body = (ids + args) if ids else args.lstrip(", ")
        text = (
            f'\n  {{\n    "ph": "X", "cat": "{t.cat}", "name": {name}, "pid": {lane_pid}, "tid": {tid},\n'
            '    "ts": %(tq)d.%(tm)03d, "dur": %(dq)d.%(dm)03d,\n'
            f'    "args": {{\n      {body}\n    }}\n  }},'
        )
        if t.kind == "runtime" and t.flow:
            text += (
                f'\n  {{\n    "ph": "s", "id": %(c)d, "pid": {pid}, "tid": {tid}, "ts": %(tq)d.%(tm)03d,\n'
                '    "cat": "ac2g", "name": "ac2g"\n  },'
            )
        elif t.kind == "gpu":
            text += (
                f'\n  {{\n    "ph": "f", "id": %(c)d, "pid": {device}, "tid": {tid}, "ts": %(tq)d.%(tm)03d,\n'
                '    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  },'
            )
        out.append(text)
    return out


#: The autograd thread's id: the main thread's + this (as Kineto numbers them in the traces
#: this generator imitates).
AUTOGRAD_TID_OFFSET = 61


def metadata_events(pid: int, device: int, ts: str, streams: list[int]) -> str:
    """The ``ph: "M"`` events naming a rank's process, its GPU, its two threads (main,
    autograd) and its GPU ``streams``, as Kineto writes them (shared by both generators)."""
    parts = []

    def meta(name: str, p: int | str, tid: int | str, key: str, value: str) -> None:
        parts.append(
            f'\n  {{\n    "name": "{name}", "ph": "M", "ts": {ts}, "pid": {p}, "tid": {tid},\n'
            f'    "args": {{\n      "{key}": {value}\n    }}\n  }},'
        )

    meta("process_name", pid, 0, "name", '"python3"')
    meta("process_labels", pid, 0, "labels", '"CPU"')
    meta("process_sort_index", pid, 0, "sort_index", str(pid))
    meta("process_name", device, 0, "name", '"python3"')
    meta("process_labels", device, 0, "labels", f'"GPU {device}"')
    meta("process_sort_index", device, 0, "sort_index", str(0x1000000 + device))
    for tid, label in ((pid, "python3"), (pid + AUTOGRAD_TID_OFFSET, "pt_autograd_0")):
        meta("thread_name", pid, tid, "name", f'"thread {tid} ({label})"')
        meta("thread_sort_index", pid, tid, "sort_index", str(tid))
    for stream in streams:
        meta("thread_name", device, stream, "name", f'"stream {stream} "')
        meta("thread_sort_index", device, stream, "sort_index", str(stream))
    return "".join(parts)


def _metadata(job: Job, rank: int, ts: str) -> str:
    pid = int(job.pids[rank])
    return metadata_events(pid, rank % job.config.ranks_per_host, ts, [COMPUTE_STREAM, NCCL_STREAM])


def render_rank(job: Job, rank: int, base_ns: int) -> tuple[bytes, int]:
    """The Kineto JSON text of ``rank`` (timestamps on its host clock) and its event count."""
    c = job.config
    offset, ppm = clock_params(c)
    start = job.start[:, :, rank]
    end = job.end[:, :, rank]
    # the host clock, relative to Kineto's base time
    rs = host_clock(c, start, offset[rank], ppm[rank]) - base_ns
    re_ = host_clock(c, end, offset[rank], ppm[rank]) - base_ns
    d = re_ - rs
    tq, tm = np.divmod(rs, 1000)
    dq, dm = np.divmod(d, 1000)
    fmts = _formats(job, rank)
    corr_stride = max((t.corr for t in job.templates), default=0) + 8
    ext_stride = max((t.ext for t in job.templates), default=0) + 8
    corr_base = 1_000_000 + rank  # keep ids apart from External ids, as Kineto's are
    colls = np.array([t.coll for t in job.templates])
    exts = np.array([t.ext for t in job.templates])
    corrs = np.array([t.corr for t in job.templates])
    pieces = []
    events = 0
    for s in range(c.steps):
        xs = (exts + s * ext_stride).tolist()
        cs = (corrs + s * corr_stride + corr_base).tolist()
        qs = (colls + s * job.coll_per_step + 1).tolist()
        n = c.first_step + s
        for e, (fmt, a, b, p, q, x, cc, sq) in enumerate(
            zip(fmts, tq[s].tolist(), tm[s].tolist(), dq[s].tolist(), dm[s].tolist(), xs, cs, qs,
                strict=True)
        ):  # fmt: skip
            pieces.append(
                fmt % {"tq": a, "tm": b, "dq": p, "dm": q, "x": x, "c": cc, "q": sq, "n": n}
            )
            events += 1 + (job.templates[e].kind == "gpu" or job.templates[e].flow)
    first = int(rs.min())
    last = int((rs + d).max())
    first_ts = f"{first // 1000}.{first % 1000:03d}"
    span = last - first
    trace_span = (
        f'\n  {{\n    "ph": "X", "cat": "Trace", "ts": {first_ts}, "dur": {span // 1000}.{span % 1000:03d},\n'
        '    "pid": "Spans", "tid": "PyTorch Profiler",\n'
        f'    "name": "PyTorch Profiler (0)",\n    "args": {{\n      "Op count": 0\n    }}\n  }},'
        f'\n  {{\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
        f'    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": {first_ts}\n  }},'
    )
    end_ts = f"{last // 1000}.{last % 1000:03d}"
    ranks = ", ".join(str(r) for r in range(c.ranks))
    head = (
        '\n{\n  "schemaVersion": 1,\n  "deviceProperties": ['
        + _device_properties(c.ranks_per_host)
        + "\n  ],"
        + f'\n  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {c.ranks}, '
        f'"pg_count": 1, "pg_config": [{{"pg_name": "0", "pg_desc": "default_pg", '
        f'"backend_config": "cuda:nccl", "pg_size": {c.ranks}, "ranks": [{ranks}]}}], '
        f'"nccl_version": "{NCCL_VERSION}"}},'
        '\n  "cuda_runtime_version": 12040,\n  "cuda_driver_version": 12040,'
        f'\n  "host_name": "{_host_name(rank // c.ranks_per_host)}",'
        '\n  "traceEvents": ['
    )
    tail = (
        f'\n  {{\n    "name": "Record Window End", "ph": "i", "s": "g",\n    "pid": "", "tid": "", "ts": {end_ts}\n  }}\n  ],'
        f'\n  "traceName": "/tmp/traces/{_host_name(rank // c.ranks_per_host)}_{int(job.pids[rank])}.pt.trace.json",'
        f'\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {base_ns}\n}}'
    )
    text = head + _metadata(job, rank, first_ts) + trace_span + "".join(pieces) + tail
    return text.encode(), events + 3


def base_time_ns(config: SynthConfig) -> int:
    """Kineto's ``baseTimeNanoseconds``, the same for every rank: the trimonth boundary at or
    before the earliest host-clock reading (so no timestamp is negative)."""
    offset, _ = clock_params(config)
    earliest = config.start_ns + min(0, int(offset.min())) - 10**9
    return (earliest // 10**9 // TRIMONTH_S) * TRIMONTH_S * 10**9
