"""Export a merged store as one Chrome trace-event JSON that Perfetto and chrome://tracing load.

Layout of the output (Trace Event Format, JSON object form):

* one *process* per rank (``pid`` = rank, ``process_name`` "rank N (host)", sorted by rank) and
  one *thread* per lane (``tid`` = lane id, ``thread_name`` = the lane's name);
* every event of the store once, as a complete event (``"ph": "X"``) with ``ts`` and ``dur`` in
  **µs** on the aligned clock, written as exact decimals: ``ns / 1000`` with 3 decimals (epoch
  µs need 19 digits; a float would round them). Readers that parse numbers as doubles (Perfetto)
  keep about 0.25 µs of it;
* each collective linked across its ranks by flow events (``s`` → ``t`` … → ``f``, ``id`` = the
  collective id, in arrival order), bound to the enclosing collective slices; collective slices
  carry ``wait_us`` / ``transfer_us`` from :func:`rankscope.analysis.compute.collectives.collective_waits`;
* the memory events of the store (``--profile-memory``) as counter tracks (``"ph": "C"``), one
  per rank and device ("memory cpu", "memory cuda:0"): ``allocated`` and ``reserved`` bytes after
  each allocation or free, on the same aligned clock;
* the clock alignment as metadata: a ``process_labels`` record per rank (offset, uncertainty,
  method) and the whole clock table under ``otherData``.

The file is streamed rank by rank (one rank's events in memory at a time), gzip-compressed when
the name ends in ``.gz``, and written to a temporary name in the same folder, then renamed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from rankscope.analysis.store.schema import EventKind, text_values
from rankscope.atomic import atomic_output

if TYPE_CHECKING:
    import pandas as pd
    from rankscope.analysis.store.reader import Store

#: Output names ending in this are gzip-compressed.
GZIP_SUFFIX = ".gz"
#: gzip level of a compressed export (fast; traces compress ~10x anyway).
GZIP_LEVEL = 5
#: Category of the flow events that link one collective across ranks.
FLOW_CAT = "collective"
NS_PER_US = 1000
#: Permissions of the written trace (atomic_output would otherwise leave mkstemp's 0600).
FILE_MODE = 0o644
#: ``otherData.generator`` of an export, written first in the file: it is how ``rankscope merge``
#: recognises (by the file's first bytes) one of its own exports and never reads it as input.
GENERATOR = "rankscope export --perfetto"


@dataclass
class ExportStats:
    """What :func:`export_perfetto` wrote."""

    path: Path
    """The output file."""
    events: dict[int, int] = field(default_factory=dict)
    """Complete (``X``) events written per rank."""
    flows: int = 0
    """Collectives linked across ranks by flow events."""
    counters: dict[int, int] = field(default_factory=dict)
    """Memory counter (``C``) events written per rank (none without memory events)."""


def us_text(ns: int) -> str:
    """``ns`` as exact µs text with 3 decimals: 1234567 -> ``1234.567`` (negative kept exact)."""
    sign = "-" if ns < 0 else ""
    q, r = divmod(abs(int(ns)), NS_PER_US)
    return f"{sign}{q}.{r:03d}"


def _window_mask(ts: Any, dur: Any, window: tuple[int, int] | None) -> Any:
    """Rows overlapping ``window`` (the same rule as ``Store.events(window=...)``)."""
    import numpy as np

    if window is None:
        return np.ones(len(ts), dtype=bool)
    start, end = window
    return (ts < end) & ((ts + dur > start) | ((dur == 0) & (ts >= start)))


def _flow_records(
    waits: pd.DataFrame, lane_of: dict[int, Any], event_rows: dict[int, Any]
) -> Iterator[tuple[int, str]]:
    """Flow event lines per collective with >= 2 exported ranks; yields (coll, json line)."""
    for coll, group in waits.groupby("coll", sort=True):
        group = group.sort_values(["arrival", "rank"], kind="stable")
        points = []
        for rank, ts, event in zip(group["rank"], group["arrival"], group["event"], strict=True):
            rank, event = int(rank), int(event)
            rows = event_rows.get(rank)
            if rows is None or event < 0 or event >= len(rows) or not rows[event]:
                continue
            points.append((rank, int(ts), int(lane_of[rank][event])))
        if len(points) < 2:
            continue
        name = json.dumps(str(group["op"].iloc[0]))
        for i, (rank, ts, lane) in enumerate(points):
            ph = "s" if i == 0 else ("f" if i == len(points) - 1 else "t")
            bp = ',"bp":"e"' if ph != "s" else ""
            yield (
                int(coll),
                f'{{"ph":"{ph}","id":{int(coll)},"cat":"{FLOW_CAT}","name":{name},'
                f'"pid":{rank},"tid":{lane},"ts":{us_text(ts)}{bp}}}',
            )


def write_trace(
    store: Store,
    fh: IO[str],
    *,
    ranks: Sequence[int] | None = None,
    window: tuple[int, int] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExportStats:
    """Write the trace JSON of ``store`` to the text stream ``fh`` (see the module docstring).

    ``ranks`` selects ranks (default all); ``window=(start_ns, end_ns)`` keeps the events
    overlapping it. ``progress(done, total)`` is called after each rank.
    """
    from rankscope.analysis.compute.collectives import collective_waits

    chosen = list(store.ranks if ranks is None else ranks)
    stats = ExportStats(Path())
    clock = store.clock()
    colls = store.collectives()
    waits = collective_waits(colls, clock)
    if len(waits):
        waits = waits.merge(colls[["coll", "rank", "event"]], on=["coll", "rank"], how="left")
    wait_of: dict[tuple[int, int], tuple[int, int]] = {
        (int(c), int(r)): (int(w), int(t))
        for c, r, w, t in zip(
            waits["coll"], waits["rank"], waits["wait_ns"], waits["transfer_ns"], strict=True
        )
    }
    clock_of = {int(r): row for r, row in zip(clock["rank"], clock.to_dict("records"), strict=True)}
    kind_names = {int(k): k.name.lower() for k in EventKind}
    other: dict[str, Any] = {
        "generator": GENERATOR,
        "clock": "aligned (rank 0's clock after alignment), µs since the Unix epoch",
        "store": str(store.path),
        "run_id": store.meta.get("run_id"),
        "world_size": store.world_size,
        "ranks": chosen,
        "window_ns": list(window) if window is not None else None,
        "clock_alignment": [
            {k: (v.item() if hasattr(v, "item") else v) for k, v in rec.items()}
            for rec in clock.to_dict("records")
        ],
    }
    fh.write('{"otherData":')  # first, with the generator first: the marker merge looks for
    fh.write(json.dumps(other, default=str))
    fh.write(',\n"traceEvents":[\n')
    first = True

    def emit(line: str) -> None:
        nonlocal first
        fh.write(line if first else ",\n" + line)
        first = False

    lane_of: dict[int, Any] = {}
    event_rows: dict[int, Any] = {}
    for done, rank in enumerate(chosen, 1):
        meta = store.rank_meta(rank)
        host = str(meta.get("host") or clock_of.get(rank, {}).get("host") or "")
        pname = f"rank {rank}" + (f" ({host})" if host else "")
        emit(
            f'{{"ph":"M","name":"process_name","pid":{rank},"args":{{"name":{json.dumps(pname)}}}}}'
        )
        emit(
            f'{{"ph":"M","name":"process_sort_index","pid":{rank},"args":{{"sort_index":{rank}}}}}'
        )
        ck = clock_of.get(rank)
        if ck is not None:
            label = (
                f"clock offset {int(ck['offset_ns']) / 1e6:.3f} ms "
                f"± {int(ck['uncertainty_ns']) / 1e3:.1f} µs, drift {float(ck['drift_ppb']):.0f} ppb "
                f"({ck['method']})"
            )
            emit(
                f'{{"ph":"M","name":"process_labels","pid":{rank},"args":{{"labels":{json.dumps(label)}}}}}'
            )
        lanes = store.lanes(rank)
        for lane, name in zip(lanes["lane"], lanes["name"], strict=True):
            emit(
                f'{{"ph":"M","name":"thread_name","pid":{rank},"tid":{int(lane)},'
                f'"args":{{"name":{json.dumps(str(name))}}}}}'
            )
            emit(
                f'{{"ph":"M","name":"thread_sort_index","pid":{rank},"tid":{int(lane)},'
                f'"args":{{"sort_index":{int(lane)}}}}}'
            )
        ev = store.events(rank)
        ts_all, dur_all = ev["ts"].to_numpy(), ev["dur"].to_numpy()
        keep = _window_mask(ts_all, dur_all, window)
        lane_of[rank] = ev["lane"].to_numpy()
        event_rows[rank] = keep
        names = text_values(ev["name"])
        cats = text_values(ev["cat"])
        n = 0
        kinds, steps = ev["kind"].to_numpy().tolist(), ev["step"].to_numpy().tolist()
        corrs, coll_ids = ev["corr"].to_numpy().tolist(), ev["coll"].to_numpy().tolist()
        for i in keep.nonzero()[0].tolist():
            coll = coll_ids[i]
            args = f'"kind":"{kind_names.get(kinds[i], "other")}","step":{steps[i]}'
            corr = corrs[i]
            if corr >= 0:
                args += f',"correlation":{corr}'
            if coll >= 0:
                args += f',"collective":{coll}'
                wt = wait_of.get((coll, rank))
                if wt is not None:
                    args += f',"wait_us":{us_text(wt[0])},"transfer_us":{us_text(wt[1])}'
            emit(
                f'{{"ph":"X","name":{json.dumps(names[i])},"cat":{json.dumps(cats[i])},'
                f'"pid":{rank},"tid":{int(lane_of[rank][i])},'
                f'"ts":{us_text(int(ts_all[i]))},"dur":{us_text(int(dur_all[i]))},'
                f'"args":{{{args}}}}}'
            )
            n += 1
        stats.events[rank] = n
        stats.counters[rank] = _memory_counters(store, rank, window, emit)
        if progress is not None:
            progress(done, len(chosen))
    if len(waits):
        linked: set[int] = set()
        sel = waits[waits["rank"].isin(chosen)]
        for coll, line in _flow_records(sel, lane_of, event_rows):
            emit(line)
            linked.add(coll)
        stats.flows = len(linked)
    fh.write("\n]}\n")
    return stats


def _memory_counters(
    store: Store, rank: int, window: tuple[int, int] | None, emit: Callable[[str], None]
) -> int:
    """Emit the memory counter events of ``rank`` in ``window``; returns how many."""
    from rankscope.analysis.compute.memory import device_name

    mem = store.memory(rank)
    if not len(mem):
        return 0
    ts = mem["ts"].to_numpy()
    if window is not None:
        mem = mem[(ts >= window[0]) & (ts < window[1])]
    names = {
        (int(t), int(d)): json.dumps(f"memory {device_name(int(t), int(d))}")
        for t, d in set(zip(mem["device_type"], mem["device_id"], strict=True))
    }
    cols = ("ts", "device_type", "device_id", "total_allocated", "total_reserved")
    rows = zip(*(mem[c].to_numpy().tolist() for c in cols), strict=True)
    n = 0
    for t, dt, did, alloc, rsvd in rows:
        emit(
            f'{{"ph":"C","name":{names[(dt, did)]},"pid":{rank},"ts":{us_text(t)},'
            f'"args":{{"allocated":{alloc},"reserved":{rsvd}}}}}'
        )
        n += 1
    return n


def export_perfetto(
    store: Store | str | Path,
    out: str | Path,
    *,
    ranks: Sequence[int] | None = None,
    window: tuple[int, int] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExportStats:
    """Write ``store`` (a Store, ``trace.h5`` or run directory) as a Perfetto/Chrome trace.

    ``out`` ending in ``.gz`` is gzip-compressed. Written to a temporary file beside ``out`` and
    renamed, so a failed export never leaves a partial file. Raises ``KeyError`` for a rank that
    is not in the store and ``OSError`` when ``out`` cannot be written.
    """
    import gzip
    import io

    from rankscope.analysis.store.reader import Store

    if not isinstance(store, Store):
        from rankscope.analysis.store.reader import open_store

        with open_store(cast("str | Path", store)) as opened:
            return export_perfetto(opened, out, ranks=ranks, window=window, progress=progress)
    the_store = cast("Store", store)
    for rank in ranks or []:
        if rank not in the_store.ranks:
            raise KeyError(f"rank {rank} is not in {the_store.path} (ranks: {the_store.ranks})")
    path = Path(out)
    with atomic_output(path, mode=FILE_MODE) as raw:  # an exported trace is for sharing
        gz = path.name.endswith(GZIP_SUFFIX)
        binary: Any = (
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0)
            if gz
            else raw
        )
        fh = io.TextIOWrapper(binary, encoding="utf-8", newline="\n", write_through=False)
        stats = write_trace(the_store, fh, ranks=ranks, window=window, progress=progress)
        fh.flush()
        fh.detach()  # keep ``raw`` open: atomic_output syncs and closes it
        if gz:
            binary.close()  # writes the gzip trailer; does not close ``raw``
    stats.path = path
    return stats
