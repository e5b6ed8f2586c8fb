"""Run folders as ``rankscope run`` leaves them, written by hand for tests that only read them
(status, cancel, start-up imports): no torchrun needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rankscope.launchers import rundir

#: run.json of a finished local 2-rank run whose rank 1 raised.
FAILED_LOCAL_RUN: dict[str, Any] = {
    "run_id": "run",
    "launcher": "local",
    "state": "failed",
    "exit_code": 1,
    "world_size": 2,
    "started_at": "2026-01-01T00:00:00.000Z",
    "ended_at": "2026-01-01T00:00:09.000Z",
    "failures": [{"rank": 1, "error": "RuntimeError: injected", "exit_code": 1}],
}


def failed_local_run(tmp_path: Path) -> Path:
    """``tmp_path/run``: a finished local run folder with :data:`FAILED_LOCAL_RUN` as run.json."""
    run_dir = tmp_path / "run"
    (run_dir / rundir.RANKS_DIR).mkdir(parents=True)
    rundir.write_json_atomic(run_dir / rundir.RUN_JSON, dict(FAILED_LOCAL_RUN))
    return run_dir


def first_job_change(run_dir: Path) -> dict[str, Any]:
    """The first change of kind ``job`` in ``RUN/changes.jsonl`` (the live monitor's notices);
    before it, only the host's contention may have been said (a loaded machine), never
    profiled."""
    lines = (run_dir / rundir.CHANGES_FILE).read_text().splitlines()
    changes = [json.loads(line) for line in lines]
    first = next((c for c in changes if c["kind"] == "job"), None)
    assert first is not None, changes
    before = changes[: changes.index(first)]
    assert all(c["kind"] == "host" and c["trigger"] is None for c in before), changes
    return first
