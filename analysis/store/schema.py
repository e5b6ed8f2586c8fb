"""Store schema v1: names, kinds and the DataFrame contract between the merge and the analyses.

The merge (``rankscope.orchestrator.ingest.merge``) writes a store through ``rankscope.analysis.store.reader``;
every analysis reads it through :class:`rankscope.analysis.store.reader.Store`. This module holds what
both sides must agree on. The on-disk layout is documented in ``docs/format.md``.

Units: every time is **int64 nanoseconds**. Event ``ts`` is on the *aligned* clock (the clock
of rank 0 after clock alignment, Unix epoch based); ``dur`` is a duration in ns.
"""

from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the merge's reader uses this module without pandas (file_trace.py)
    import pandas as pd

SCHEMA_NAME = "rankscope-store"
SCHEMA_VERSION = 1


class EventKind(enum.IntEnum):
    """What an event is, decided once at merge time from Kineto's ``cat`` and ``name``.

    Stored as int8 in ``/ranks/NNNNN/events/kind``.
    """

    CPU_OP = 0
    """A host-side operator (``cat`` cpu_op / operator), e.g. ``aten::mm``."""
    USER_ANNOTATION = 1
    """A ``record_function`` range (``cat`` user_annotation / gpu_user_annotation)."""
    PROFILER_STEP = 2
    """A ``ProfilerStep#N`` range (host side)."""
    KERNEL_COMPUTE = 3
    """A GPU kernel that is not communication."""
    KERNEL_COMM = 4
    """A GPU communication kernel (``ncclKernel_*`` / ``ncclDevKernel_*``)."""
    MEMCPY = 5
    """A GPU memcpy (``cat`` gpu_memcpy)."""
    MEMSET = 6
    """A GPU memset (``cat`` gpu_memset)."""
    SYNC = 7
    """A CUDA synchronization event (``cat`` cuda_sync)."""
    RUNTIME = 8
    """A CUDA runtime / driver call (``cat`` cuda_runtime / cuda_driver)."""
    COMM_CPU = 9
    """A host-side collective implementation (gloo ``gloo:*`` on a runloop thread)."""
    COMM_ENQUEUE = 10
    """A c10d collective call on the calling thread (``c10d::allreduce_``, ``record_param_comms``)."""
    PYTHON = 11
    """A Python function event (``with_stack``)."""
    OTHER = 12
    """Anything else with a duration (kept, never classified as work)."""


class LaneKind(enum.IntEnum):
    """A lane is one timeline row: a host thread or a GPU stream."""

    THREAD = 0
    GPU_STREAM = 1


class ClockMethod(enum.StrEnum):
    """How a rank's clock offset was obtained (``/clock`` ``method``)."""

    REFERENCE = "reference"
    """This rank's clock is the reference (rank 0, or shares rank 0's host clock)."""
    RUNTIME = "runtime"
    """Runtime ping-pong samples only."""
    RUNTIME_COLLECTIVES = "runtime+collectives"
    """Runtime samples refined with matched collective end times."""
    COLLECTIVES = "collectives"
    """Matched collectives alone (no runtime samples, e.g. foreign traces)."""
    RAW = "raw"
    """Nothing to align with: the rank's own clock, unchanged."""
    SAME_HOST = "same-host"
    """No runtime clock facts, but the same host as the reference: CLOCK_REALTIME is per host, so
    the offset stays 0 (kept only while 0 is consistent with causality; a process shifted by e.g.
    libfaketime violates it and is fitted from collectives instead)."""


#: Columns of ``Store.events(rank)``, in order, with their numpy dtypes.
EVENT_COLUMNS: dict[str, str] = {
    "ts": "int64",  # start, ns, aligned clock
    "dur": "int64",  # duration, ns (>= 0)
    "name": "category",  # operator / kernel / range name
    "cat": "category",  # Kineto category as written in the trace
    "kind": "int8",  # EventKind
    "lane": "int32",  # index into Store.lanes(rank)
    "step": "int32",  # ProfilerStep number the event starts in, -1 outside any
    "corr": "int64",  # Kineto correlation id (links a CPU launch to its GPU kernel), -1 if none
    "coll": "int64",  # row id in Store.collectives() ("coll" column), -1 if not a collective
    "window": "int16",  # profiler window index the event came from
}

#: Optional event columns, written only when the trace recorded them (``record_shapes=True``:
#: Kineto's ``args["Input Dims"]`` / ``args["Input type"]`` as text, e.g. ``[[2, 64], []]`` and
#: ``['float', 'Scalar']``). Additive: ``Store.events`` returns them only when asked, as
#: categoricals with NaN where an event has none (and for every event of older stores).
SHAPE_COLUMNS: dict[str, str] = {
    "shapes": "category",  # str(Input Dims), the key of key_averages(group_by_input_shape=True)
    "dtypes": "category",  # str(Input type)
}

#: Columns of ``Store.lanes(rank)``: one row per lane, row index == lane id.
LANE_COLUMNS: dict[str, str] = {
    "lane": "int32",
    "kind": "int8",  # LaneKind
    "pid": "str",  # Kineto pid as written (may be a string)
    "tid": "str",  # Kineto tid as written (thread id or "stream 7")
    "name": "str",  # thread name ("pt_gloo_runloop") or "stream 7"
}

#: Point-to-point ops: a collective of these is a matched (send, recv) PAIR, or one rank's op alone
#: when the peer is unknown. Their waits are the pipeline's schedule (bubbles), not stragglers.
P2P_OPS = frozenset({"send", "recv"})
#: Root attribute of the store: how many send/recv ops had no known peer at all (neither the
#: trace's ``Dst Rank`` / ``Src Rank`` nor the runtime's annotation). The other one-rank send/recv
#: collectives named a peer whose side of the transfer is in no trace. Absent in older stores.
P2P_WITHOUT_PEER_ATTR = "p2p_without_peer"

#: Columns of ``Store.collectives()``: LONG form, one row per (collective, rank).
COLLECTIVE_COLUMNS: dict[str, str] = {
    "coll": "int64",  # collective id, dense 0..n-1 in order of first start
    "group": "str",  # process group name (or the stream / runloop lane when unknown)
    "seq": "int64",  # sequence number within the group (record_param_comms Seq, else order)
    "op": "str",  # allreduce, allgather, alltoall, broadcast, send, recv, ...
    "bytes": "int64",  # message size in bytes, -1 if unknown
    "rank": "int32",
    "start": "int64",  # ns, aligned: when this rank's collective started (arrival)
    "end": "int64",  # ns, aligned: when it ended on this rank
    "event": "int64",  # row index of the event in Store.events(rank)
}

#: Columns of ``Store.steps()``: one row per (rank, ProfilerStep).
STEP_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "step": "int32",
    "start": "int64",  # ns, aligned
    "end": "int64",  # ns, aligned
}

#: Columns of one rank's ``/ranks/NNNNN/step_log`` (every step of the whole run, from the rank's
#: ``steps.bin``: ``rankscope.launchers.step_log``). ``Store.step_log(rank)`` returns them.
STEP_LOG_COLUMNS: dict[str, str] = {
    "steps": "int64",  # steps the rank had done when this one ended (1 for the first step)
    "end": "int64",  # ns, aligned (the rank's clock transform of /clock applied)
    "wait": "int64",  # ns the step waited in collectives, -1 where the runtime could not tell
}

#: Columns of ``Store.changes()``: the changes of the step time the live monitor noticed while
#: the job ran (``RUN/changes.jsonl``, one row per line; empty for runs without any).
CHANGE_COLUMNS: dict[str, str] = {
    "step": "int64",  # steps the job had done when the change was noticed
    "kind": "str",  # ChangeKind: "job" (the job's step time), "rank" (one rank drifting away), "host"
    "before_ms": "float64",  # step time before the change, ms per step
    "after_ms": "float64",  # step time after it, ms per step
    "rank": "int32",  # the rank drifting away (or named for a job-wide change), -1 for none
    "behind_ms": "float64",  # how far that rank was behind the median, ms (NaN: not said)
    "sentence": "str",  # what the terminal printed
    "noticed_ns": "int64",  # when noticed, ns since the epoch (the launcher's clock)
    "trigger": "int64",  # the triggered window it asked for (its trigger id), -1 for none
}


class ChangeKind(enum.StrEnum):
    """What the live monitor noticed (``changes.jsonl`` ``kind``; ``Store.changes()``)."""

    JOB = "job"
    """A lasting rise (or fall) of the job's step time."""
    RANK = "rank"
    """One rank drifting away from the others."""
    HOST = "host"
    """The job's step time (or one rank's lateness) rose, and the ranks' longer waits for a CPU
    (run-queue delay, the VM's stolen time) account for it: contention on the host, not the
    job (``step_changes.host_explains``); no window is triggered for it."""


#: Columns of ``Store.clock()``: one row per rank.
CLOCK_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "host": "str",
    "offset_ns": "int64",  # added to the rank's raw clock to get the aligned clock (at t_ref)
    "drift_ppb": "float64",  # extra offset per second of elapsed time, parts per billion (ns/s)
    "t_ref_ns": "int64",  # raw-clock time at which offset_ns holds
    "uncertainty_ns": "int64",  # half-width of the bound on the offset
    "method": "str",  # ClockMethod
    "violations_before": "int32",  # causality violations on the raw clocks
    "violations_after": "int32",  # after alignment and repair
}

#: Columns of ``Store.problems()``: what could not be ingested and why.
PROBLEM_COLUMNS: dict[str, str] = {
    "file": "str",  # the input file (path as given)
    "rank": "int32",  # -1 when unknown
    "problem": "str",  # one line, human readable
}


def text_values(column: pd.Series) -> np.ndarray:
    """A text column (``name``, ``cat``, …) as an object array of ``str``, as
    ``column.astype(str).to_numpy(object)`` gives it (a missing value is ``"nan"``).

    Why: the store returns its string-coded columns as Categoricals over the whole string table;
    ``astype(str)`` builds a new string array row by row (pandas 3: an Arrow string array, then
    converted back), the largest single cost of a rank's analysis at ~30 k events. Taking the
    categories by the codes is one array take."""
    import pandas as pd

    if isinstance(column.dtype, pd.CategoricalDtype):
        codes, texts = text_codes(column)
        out: np.ndarray = texts[codes]
        return out
    return column.astype(str).to_numpy(object)


def text_codes(column: pd.Series, missing: str = "nan") -> tuple[np.ndarray, np.ndarray]:
    """``(codes, texts)`` of a text column: ``texts[codes]`` is :func:`text_values` (a missing
    value ``missing``), ``codes`` int64 — to group rows by their text on integers (grouping on
    Python strings hashes each row's string: most of a rank's op table)."""
    import pandas as pd

    if isinstance(column.dtype, pd.CategoricalDtype):
        index = column.cat.categories  # the store's: one Index for all calls, its type cached
        texts = np.asarray(index, dtype=object)
        if index.inferred_type != "string":
            texts = np.asarray([str(c) for c in texts], dtype=object)
        codes = column.cat.codes.to_numpy().astype(np.int64)
    else:
        codes, uniq = pd.factorize(column.to_numpy(object), use_na_sentinel=True)
        codes = codes.astype(np.int64)
        texts = np.asarray([str(v) for v in uniq], dtype=object)
    if (codes < 0).any():
        codes = np.where(codes < 0, len(texts), codes)
        texts = np.append(texts, np.asarray([missing], dtype=object))
    return codes, texts


#: The stream number at the end of a lane's tid (``"stream 7"`` → 7, ``"12"`` → 12).
STREAM_NUMBER_RE = re.compile(r"(-?\d+)\s*$")


def tid_numbers(lanes: pd.DataFrame) -> list[int | None]:
    """Per lane row, the number its tid ends with (:data:`STREAM_NUMBER_RE`); None when it ends
    with none or the tid is missing.

    Why a plain loop: a rank has tens of lanes, and the analyses ask for their streams about a
    dozen times per rank; pandas' ``astype(str).str.extract`` built an Arrow string array and a
    frame each time (~1 ms per call, ~10 % of a small rank's analysis)."""
    out: list[int | None] = []
    for tid in lanes["tid"].to_numpy(object):
        if tid is None or (isinstance(tid, float) and tid != tid):
            out.append(None)
            continue
        m = STREAM_NUMBER_RE.search(str(tid))
        out.append(int(m.group(1)) if m else None)
    return out
