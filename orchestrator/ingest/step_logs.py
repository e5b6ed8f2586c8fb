"""Every step of the whole run into the store (issue 30): each rank's step log
(``ranks/NNNNN/steps.bin``, :mod:`rankscope.launchers.step_log`) and the live monitor's changes
(``RUN/changes.jsonl``).

The step log is read in the per-rank task (:func:`read_rank_step_log`, beside the rank's
traces, so a 1,024-rank merge reads them in parallel and the parent never holds them all:
:mod:`~rankscope.orchestrator.ingest.rank_selection` parks each on disk with the rank's
columns), aligned with the very transform that puts the rank's trace events on the reference
clock (:func:`aligned`: ``end_ns`` is ``time.time_ns`` of the rank, the clock its clock-sync
samples are taken with) and written once per rank as ``/ranks/NNNNN/step_log``
(docs/format.md).

What is not there is no error: runs made before the step log, folders of other tools' traces
and ranks that recorded no step have no table. A record cut by a crash is ignored by the reader;
a rank that restarted (torchrun ``--max-restarts``: its new attempt counts its steps again,
appended to the same log, later) keeps its last attempt, said in one problem line; a file whose
records stop making sense otherwise (an end time that goes back, a step count below 1) keeps its
records up to the first such one and says so in ONE problem line, never a traceback; an
unreadable file is one problem line too.

Why apart from ``rank_columns.py`` and ``merge.py``: the step log is a second input of the rank
with its own checks; both callers stay one line each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rankscope.analysis.store.schema import CHANGE_COLUMNS, STEP_LOG_COLUMNS, ChangeKind
from rankscope.launchers.rundir import CHANGES_FILE
from rankscope.launchers.step_log import STEP_LOG_FILE, read_steps
from rankscope.orchestrator.ingest.discovery import Problem, RankSource
from rankscope.orchestrator.ingest.staging import Spill

if TYPE_CHECKING:  # the merge's reader uses this module without pandas (file_trace.py)
    import pandas as pd

#: The step log's part in the spill (:class:`~rankscope.orchestrator.ingest.staging.Spill`).
STEP_LOG_PART = "steplog"


def step_log_path(source: RankSource) -> Path | None:
    """Where ``source``'s step log is (``ranks/NNNNN/steps.bin`` of a run directory), None for
    sources outside a run directory (they have none)."""
    if not source.from_run_dir or not source.files:
        return None
    return source.files[0][1].parent / STEP_LOG_FILE


def read_rank_step_log(
    source: RankSource, rank: int
) -> tuple[dict[str, np.ndarray] | None, Problem | None]:
    """The step log of ``source`` as raw columns (schema.STEP_LOG_COLUMNS, ``end`` on the rank's
    own clock) and the one problem it had, if any; ``(None, None)`` without one."""
    path = step_log_path(source)
    if path is None:
        return None, None
    try:
        records = read_steps(path)
    except OSError as exc:
        return None, Problem(str(path), rank, f"step log not read: {exc.strerror or exc}")
    if not len(records):
        return None, None
    steps = records["steps"]
    end = records["end_ns"]
    # A restarted rank (torchrun --max-restarts) appends its new attempt's steps, counted again
    # from its start: the step count falls, time goes on. Its last attempt is the run's.
    restart = np.flatnonzero((np.diff(steps) <= 0) & (np.diff(end) >= 0) & (steps[1:] >= 1))
    problem = None
    if len(restart):
        first = int(restart[-1]) + 1
        problem = Problem(
            str(path),
            rank,
            f"step log: the rank restarted {len(restart)} time(s); the {first} record(s) before "
            "its last attempt left out",
        )
        records = records[first:]
        steps, end = records["steps"], records["end_ns"]
    ok = (steps >= 1) & (end > 0)
    ok[1:] &= (np.diff(steps) > 0) & (np.diff(end) >= 0)
    bad = np.flatnonzero(~ok)
    if len(bad):
        first = int(bad[0])
        problem = Problem(
            str(path),
            rank,
            f"step log: record {first + 1} of {len(records)} does not follow the one before "
            f"(steps {int(steps[first])}, end {int(end[first])} ns); it and the "
            f"{len(records) - first - 1} after it ignored",
        )
        records = records[:first]
        if not len(records):
            return None, problem
    return {
        "steps": records["steps"].astype(np.int64),
        "end": records["end_ns"].astype(np.int64),
        "wait": records["wait_ns"].astype(np.int64),
    }, problem


def park(spill: Spill, rank: int, result: Any) -> None:
    """Park ``result``'s step log (a parsed rank's) beside its columns, and drop it from memory."""
    if getattr(result, "step_log", None) is not None:
        spill.put(rank, result.step_log, part=STEP_LOG_PART)
        result.step_log = None


def aligned(
    columns: dict[str, np.ndarray], offset_ns: int, drift_ppb: float, t_ref_ns: int
) -> dict[str, np.ndarray]:
    """``columns`` with ``end`` on the aligned clock: the rank's transform (``clock.py``)."""
    from rankscope.orchestrator.ingest.clock import apply_transform

    out = dict(columns)
    out["end"] = apply_transform(
        np.asarray(columns["end"], np.int64), offset_ns, drift_ppb, t_ref_ns
    )
    return out


def write_aligned(
    writer: Any, spill: Spill, rank: int, offset_ns: int, drift_ppb: float, t_ref_ns: int
) -> None:
    """Write ``rank``'s parked step log, aligned, into the store (nothing when it has none)."""
    columns = spill.take(rank, part=STEP_LOG_PART)
    if columns and all(c in columns for c in STEP_LOG_COLUMNS):
        writer.write_step_log(rank, aligned(columns, offset_ns, drift_ppb, t_ref_ns))


def read_changes(run_dir: Path) -> tuple[pd.DataFrame | None, Problem | None]:
    """The live monitor's changes (``RUN/changes.jsonl``) as schema.CHANGE_COLUMNS, and one
    problem line for lines that are not understood (they are left out); ``(None, None)`` when
    the run has no such file."""
    import pandas as pd

    path = run_dir / CHANGES_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, Problem(str(path), -1, f"changes not read: {exc.strerror or exc}")
    rows: list[dict[str, Any]] = []
    lines = [line for line in text.splitlines() if line.strip()]
    bad = 0
    for line in lines:
        try:
            rows.append(_change_row(json.loads(line)))
        except (ValueError, TypeError, KeyError, AttributeError):
            bad += 1  # a line cut by a crash, or not one of ours
    problem = (
        Problem(str(path), -1, f"{bad} of {len(lines)} line(s) not understood; left out")
        if bad
        else None
    )
    frame = pd.DataFrame(rows, columns=list(CHANGE_COLUMNS))
    return frame.astype({k: v for k, v in CHANGE_COLUMNS.items() if v != "str"}), problem


def _change_row(doc: dict[str, Any]) -> dict[str, Any]:
    """One line of ``changes.jsonl`` (the contract in docs/format.md, "/changes") as a row."""

    def number(key: str, missing: float) -> float:
        value = doc.get(key)
        return float(value) if value is not None else missing

    return {
        "step": int(doc["step"]),
        "kind": str(ChangeKind(doc["kind"])),
        "before_ms": float(doc["before_ms"]),
        "after_ms": float(doc["after_ms"]),
        "rank": int(number("rank", -1)),
        "behind_ms": number("behind_ms", float("nan")),
        "sentence": str(doc.get("sentence") or ""),
        "noticed_ns": int(number("noticed_ns", -1)),
        "trigger": int(number("trigger", -1)),
    }
