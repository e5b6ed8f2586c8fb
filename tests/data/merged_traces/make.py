"""Write this folder's merged traces from the real 4-rank gloo run in ../cpu_gloo_4rank_straggler.

Run from the repository root: ``python tests/data/merged_traces/make.py``. Each output holds the
same four ranks' events (the same run, rank 2 the straggler), merged into ONE file the way a tool
people use writes it (written here from those tools' documented behaviour, not with their code):

* ``tracelens_4rank.json.gz`` — TraceLens's merge: every event gets ``args.rank``; ``pid``,
  ``id`` and ``args.correlation`` are offset by rank x 10^8; the top-level fields are rank 0's.
* ``composer_4rank.json.gz`` — Composer's ``json_trace_merger``: a JSON array; each rank's trace
  starts with the metadata Composer's JSONTraceHandler records (``process_name`` "Rank N training
  loop process", ``thread_name``, ``thread_sort_index``, ``global_rank``, ``process_sort_index``,
  ``clock_sync_timestamp_us``, ``clock_sync_error_bound``); every event's ``pid`` becomes the
  global rank, ``ts`` moves by (rank 0's clock sync - this rank's), events without pid/tid or on a
  "PyTorch Profiler" tid are dropped, a ``thread_sort_index`` is written per new thread. The four
  ranks ran on one host (one clock): their sync stamps are one value, so no ``ts`` moves.
* ``handmerged_4rank.json.gz`` — the four files' ``traceEvents`` concatenated as they are (rank 0's
  top-level fields): several ranks that nothing tells apart, which rankscope must refuse.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "cpu_gloo_4rank_straggler"
RANKS = range(4)
PID_OFFSET = 10**8


def load(rank: int) -> dict[str, Any]:
    return json.loads((SOURCE / f"rank{rank}.step5.pt.trace.json").read_text())


def write(name: str, doc: Any) -> None:
    text = json.dumps(doc, separators=(",", ":")).encode()
    (HERE / name).write_bytes(gzip.compress(text, mtime=0))


def tracelens() -> None:
    traces = [load(r) for r in RANKS]
    events = []
    for rank, trace in zip(RANKS, traces, strict=True):
        for ev in trace["traceEvents"]:
            ev = dict(ev)
            args = dict(ev.get("args") or {})
            if isinstance(ev.get("pid"), int):
                ev["pid"] += rank * PID_OFFSET
            if isinstance(ev.get("id"), int):
                ev["id"] += rank * PID_OFFSET
            if isinstance(args.get("correlation"), int):
                args["correlation"] += rank * PID_OFFSET
            args["rank"] = rank
            ev["args"] = args
            events.append(ev)
    top = {k: v for k, v in traces[0].items() if k != "traceEvents"}
    write("tracelens_4rank.json.gz", {**top, "traceEvents": events})


def composer() -> None:
    traces = [load(r) for r in RANKS]
    sync_us = min(ev["ts"] for ev in traces[0]["traceEvents"] if ev.get("ph") == "X")
    out: list[dict[str, Any]] = []
    for rank, trace in zip(RANKS, traces, strict=True):
        tid = trace["distributedInfo"]["rank"] + 1000  # the handler's os.getpid(), any number
        meta = [
            ("process_name", {"name": f"Rank {rank} training loop process"}),
            ("thread_name", {"name": "Training Loop"}),
            ("thread_sort_index", {"sort_index": 0}),
            ("global_rank", {"value": rank}),
            ("process_sort_index", {"sort_index": rank}),
            ("clock_sync_timestamp_us", {"value": sync_us}),
            ("clock_sync_error_bound", {"value": 0}),
        ]
        events = [
            {"name": n, "ph": "M", "ts": sync_us, "pid": rank, "tid": tid, "args": a}
            for n, a in meta
        ] + trace["traceEvents"]
        seen: set[Any] = set()
        for ev in events:
            if "pid" not in ev or "tid" not in ev or "PyTorch Profiler" in str(ev["tid"]):
                continue
            ev = dict(ev)
            ev["pid"] = rank  # ts + (rank 0's sync - this rank's sync) = ts: one host
            if ev["tid"] not in seen:
                seen.add(ev["tid"])
                out.append(
                    {
                        "name": "thread_sort_index",
                        "ph": "M",
                        "pid": rank,
                        "tid": ev["tid"],
                        "args": {"sort_index": 99999},
                    }
                )
            out.append(ev)
    write("composer_4rank.json.gz", out)


def handmerged() -> None:
    traces = [load(r) for r in RANKS]
    top = {k: v for k, v in traces[0].items() if k != "traceEvents"}
    events = [ev for trace in traces for ev in trace["traceEvents"]]
    write("handmerged_4rank.json.gz", {**top, "traceEvents": events})


if __name__ == "__main__":
    tracelens()
    composer()
    handmerged()
