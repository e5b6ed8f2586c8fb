"""The launcher base: the life of a run, written once; backends fill a few hooks.

:class:`Launcher` creates the run directory, writes ``run.json`` (pending → running/queued →
final state, always atomically), collects what the ranks recorded about their own failures, and
turns the backend's answer into a final state. A backend (``local`` = torchrun child process,
``slurm`` = submitit job) only implements:

* :meth:`Launcher._start` — start the job and return at once with a backend handle (any object);
* :meth:`Launcher._poll` — non-blocking: ``None`` while the job runs, else a :class:`JobOutcome`;
* :meth:`Launcher._cancel` — ask the job to stop (``interrupt=True``: the user pressed Ctrl-C);
* optionally :meth:`Launcher._wait` (block efficiently), :meth:`Launcher._record_fields`
  (extra ``run.json`` fields, e.g. the Slurm job id) and :meth:`Launcher._attach` (rebuild the
  backend handle from ``run.json`` in another process, for ``rankscope status/cancel``).

``run.json`` itself (:class:`~rankscope.launchers.rundir.RunRecord`, ``load_run``,
``update_run``) belongs to the run directory's contract, ``rundir.py``. The launchers never import
the analysis floor.

Why one module of ~510 lines: the life of a run (launch, wait, watch for hangs, finish, record)
is one sequence of states that every backend shares; split, its hooks would be read in several
places for one question (what happens when the job ends).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import os
import secrets
import shutil
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rankscope.atomic import translate_write_errors
from rankscope.errors import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from rankscope.errors import InputFileError, OutputError, RankscopeError, UsageError
from rankscope.launchers import rundir
from rankscope.launchers.hang_probe import is_collective_timeout
from rankscope.launchers.hang_watch import EXIT_HUNG as EXIT_HUNG
from rankscope.launchers.hang_watch import (
    HangNotice,
    HangWatch,
    RankProgress,
    signal_pid,
    wait_watching,
)
from rankscope.launchers.rundir import RunRecord, RunState, load_run, update_run, utc_now
from rankscope.launchers.spec import LauncherKind, RunSpec, check_run_name

#: Where each backend lives ("module:Class"), imported on demand.
LAUNCHERS: dict[LauncherKind, str] = {
    LauncherKind.LOCAL: "rankscope.launchers.local:LocalLauncher",
    LauncherKind.SLURM: "rankscope.launchers.slurm.launcher:SlurmLauncher",
}

#: Seconds between two polls in the default :meth:`Launcher._wait`.
POLL_INTERVAL_S = 1.0

#: Key of the per-rank error record in ``ranks/NNNNN/meta.json`` (written by the runtime).
META_ERROR_KEY = "error"


def make_run_id(name: str) -> str:
    """``YYYYmmdd-HHMMSS-<name>-<4 hex>``: sorts by start time, unique across parallel runs."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{name}-{secrets.token_hex(2)}"


def check_out_dir(out: Path) -> Path:
    """Create ``out`` if needed and check it is a writable folder, else raise UsageError."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"output folder {out} cannot be created: {exc.strerror or exc}") from exc
    if not out.is_dir():
        raise UsageError(f"output folder {out} is not a folder")
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"output folder {out} is not writable")
    return out


def create_run_dir(out: Path, name: str) -> Path:
    """Create ``out/<run_id>`` with its ``ranks/`` and ``logs/`` folders; return its path."""
    try:
        check_run_name(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    check_out_dir(out)
    for _ in range(10):
        run_dir = out / make_run_id(name)
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue
        try:
            with translate_write_errors(run_dir):
                (run_dir / rundir.RANKS_DIR).mkdir()
                (run_dir / rundir.LOGS_DIR).mkdir()
        except OutputError:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        return run_dir.resolve()
    raise UsageError(f"could not create a unique run folder in {out}")


def read_rank_metas(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Every readable ``ranks/NNNNN/meta.json`` by rank (unreadable ones are skipped)."""
    metas: dict[int, dict[str, Any]] = {}
    ranks = Path(run_dir) / rundir.RANKS_DIR
    if not ranks.is_dir():
        return metas
    for folder in sorted(ranks.iterdir()):
        if not folder.name.isdigit():
            continue
        try:
            meta = rundir.read_json(folder / rundir.META_JSON)
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict):
            metas[int(folder.name)] = meta
    return metas


def rank_failures(run_dir: Path) -> list[dict[str, Any]]:
    """Failures the ranks recorded themselves (uncaught exception in the user's script)."""
    failures = []
    for rank, meta in read_rank_metas(run_dir).items():
        error = meta.get(META_ERROR_KEY)
        if isinstance(error, dict) and not error.get("interrupted"):
            failures.append(
                {
                    "rank": rank,
                    "error": f"{error.get('type', 'Error')}: {error.get('message', '')}".strip(),
                    "exit_code": error.get("exit_code", 1),
                    "time_ns": error.get("time_ns"),
                }
            )
    return failures


def unfinished_profiles(run_dir: Path, world_size: int | None) -> list[dict[str, Any]]:
    """After a job that completed: one failure naming the ranks whose final ``meta.json`` is
    missing or not final (no ``ended_ns``), else none.

    Every rank that ends normally rewrites its meta.json last, with ``ended_ns``; when it could
    not (a full disk, a quota…), the rank printed why, the training went on, and the profile is
    incomplete: the run must not look like a success that merely saw no training step.
    """
    metas = read_rank_metas(run_dir)
    ranks = range(world_size) if world_size else sorted(metas)
    unfinished = [r for r in ranks if not (metas.get(r) or {}).get("ended_ns")]
    if not unfinished:
        return []
    first = rundir.rank_dir(Path(run_dir), unfinished[0]) / rundir.META_JSON
    which = ", ".join(str(r) for r in unfinished[:8]) + (", …" if len(unfinished) > 8 else "")
    return [
        {
            "rank": unfinished[0],
            "error": f"profiling output incomplete on rank(s) {which}: {first} not final (a "
            "write failed, see the ranks' lines above); the training itself completed",
            "exit_code": None,
        }
    ]


@dataclass
class JobOutcome:
    """How a job ended, as the backend saw it."""

    state: RunState
    """Final state (completed, failed, interrupted, cancelled, timeout)."""
    exit_code: int | None = None
    """Exit status of the job (the launcher's process, or Slurm's), None if unknown."""
    failures: list[dict[str, Any]] = field(default_factory=list)
    """Failures the backend saw (``rank``, ``error``, ``exit_code``), e.g. a rank killed by a signal."""
    fields: dict[str, Any] = field(default_factory=dict)
    """Extra ``run.json`` fields to record (e.g. Slurm's final job state)."""


class RunHandle:
    """A started (or re-attached) run: its folder, its state, and how to wait for or stop it."""

    def __init__(self, launcher: Launcher, run_dir: Path, job: Any) -> None:
        self.launcher = launcher
        self.run_dir = Path(run_dir)
        self.job = job
        """The backend's own handle (a Popen, a submitit Job, …); None if it cannot be reached."""

    def record(self) -> dict[str, Any]:
        """The current ``run.json``."""
        return load_run(self.run_dir)

    def state(self) -> RunState:
        """Current state: from ``run.json``, refreshed from the backend while unfinished."""
        state = RunState(self.record()["state"])
        if state.finished or self.job is None:
            return state
        outcome = self.launcher._poll(self.job)
        if outcome is None:
            return state
        return self.launcher._finish(self, outcome)

    def wait(
        self,
        timeout: float | None = None,
        hang: HangWatch | None = None,
        on_hang: Callable[[HangNotice], None] | None = None,
        monitor: Callable[[], None] | None = None,
    ) -> RunState:
        """Block until the job ends (or ``timeout`` seconds pass); return the state.

        Ctrl-C while waiting stops the job (state ``interrupted``) and re-raises
        KeyboardInterrupt once ``run.json`` is final; ``hang``/``on_hang``/``monitor``: see
        :meth:`Launcher.wait`.
        """
        return self.launcher.wait(self, timeout, hang, on_hang, monitor)

    def cancel(self) -> RunState:
        """Stop the job (state ``cancelled``)."""
        return self.launcher.cancel(self)

    @property
    def exit_code(self) -> int | None:
        """Exit status recorded in ``run.json`` (None while running)."""
        code = self.record().get("exit_code")
        return None if code is None else int(code)


class Launcher(ABC):
    """Shared life of a run; subclasses fill :meth:`_start`, :meth:`_poll` and :meth:`_cancel`."""

    kind: ClassVar[LauncherKind]
    """Which backend this is (recorded in ``run.json``)."""
    started_state: ClassVar[RunState] = RunState.RUNNING
    """State right after :meth:`_start` returns (``queued`` for a batch scheduler)."""
    ranks_are_local: ClassVar[bool] = True
    live_poll_s: ClassVar[float] = POLL_INTERVAL_S
    """Seconds between two looks while a live monitor follows the job (``monitor``)."""
    """The ranks run on this host (a silent rank can be sent the stack signal)."""

    # ----------------------------------------------------------------- hooks for backends
    @abstractmethod
    def _start(self, spec: RunSpec, run_dir: Path) -> Any:
        """Start the job and return its backend handle at once (do not wait for it)."""

    @abstractmethod
    def _poll(self, job: Any) -> JobOutcome | None:
        """``None`` while the job is pending or running, else how it ended. Must not block."""

    @abstractmethod
    def _cancel(self, job: Any, *, interrupt: bool) -> JobOutcome:
        """Stop the job (``interrupt``: Ctrl-C, let ranks flush) and return how it ended."""

    def _wait(self, job: Any, timeout: float | None) -> JobOutcome | None:
        """Block until the job ends or ``timeout`` seconds pass (None); default polls."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            outcome = self._poll(job)
            if outcome is not None:
                return outcome
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(POLL_INTERVAL_S)

    def _mute_output(self, job: Any) -> None:
        """Stop copying the job's output to the terminal (it still goes to the log): called
        when the job hangs, so that its teardown noise does not bury the diagnosis. Backends
        whose output does not reach this terminal (a batch job) have nothing to do."""
        return None

    def follows(self, job: Any) -> bool:
        """This process waits for the job to end (so it watches the ranks for hangs); a batch
        job that this process only submitted is not followed."""
        return True

    def _stop_following(self, job: Any) -> bool:
        """Ctrl-C while waiting: True when it only stops this process following the job (a
        batch scheduler's job goes on), False when it stops the job (the default)."""
        return False

    def _running(self, job: Any) -> bool:
        """The job's ranks have been started (a batch job may wait in the queue first: that
        time is not the first step's)."""
        return True

    def _failing(self, job: Any) -> bool:
        """The job is failing already in a way the hang watch cannot see from the ranks'
        progress (e.g. another node's torchrun reported a dead rank): not a hang. The local
        watch sees dead ranks by their pids itself."""
        return False

    def _signal_ranks(self, job: Any, ranks: list[RankProgress]) -> list[int]:
        """Send :data:`~rankscope.launchers.hang_probe.STACK_SIGNAL` to ranks that did not
        answer the hang request (their faulthandler writes their stacks); return the ranks
        signalled. Here: ``os.kill`` (the ranks run on this host)."""
        return [p.rank for p in ranks if p.pid and signal_pid(p.pid)]

    def _end_hung(self, job: Any) -> JobOutcome:
        """End a job that hangs (``--on-hang report/kill``) and return how it ended: as a
        cancel by default."""
        return self._cancel(job, interrupt=False)

    def _record_fields(self, job: Any) -> dict[str, Any]:
        """Extra ``run.json`` fields once the job has started (e.g. ``{"slurm": {...}}``)."""
        return {}

    def _attach(self, run_dir: Path, record: dict[str, Any]) -> Any:
        """Rebuild the backend handle from ``run.json`` in another process (None if impossible)."""
        return None

    # --------------------------------------------- hooks for `rankscope status` / `cancel`
    def refresh(self, run_dir: Path) -> str | None:
        """Ask the backend for news of a run (from any process) and record them in ``run.json``.

        Returns a note when the backend cannot be asked (the record then stays as last written).
        """
        self.attach(run_dir).state()
        return None

    def status_details(self, run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
        """What ``rankscope status`` shows beyond ``run.json``'s common fields: ``tasks`` (one dict
        per task: node, host, state, exit code), ``notes`` (lines), and backend ids."""
        return {"tasks": [], "notes": []}

    def cancel_run(self, run_dir: Path) -> str:
        """Stop a run from another shell (``rankscope cancel``); returns what happens, one line."""
        raise UsageError(f"{run_dir}: a {self.kind} run cannot be cancelled from another shell")

    # ----------------------------------------------------------------- shared logic
    def launch(self, spec: RunSpec) -> RunHandle:
        """Create the run directory, write ``run.json`` and start the job.

        A ``run.json`` that cannot be written before the start (full disk, read-only…) stops
        here, one line (:class:`OutputError`), nothing started, the empty run folder removed.
        Once the job runs, a failed ``run.json`` update never stops it: one warning line, and
        the final update (:meth:`_finish`) tries again.
        """
        run_dir = create_run_dir(spec.out, spec.name)
        try:
            RunRecord.of_spec(spec, run_dir, launcher=self.kind, state=RunState.PENDING).write(
                run_dir
            )
        except OutputError:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        try:
            job = self._start(spec, run_dir)
        except BaseException as exc:
            with contextlib.suppress(OutputError):  # the launch's own error is the one to see
                update_run(
                    run_dir,
                    state=str(RunState.FAILED),
                    ended_at=utc_now(),
                    failures=[{"rank": None, "error": f"launch failed: {exc}", "exit_code": None}],
                )
            raise
        try:
            update_run(run_dir, state=str(self.started_state), **self._record_fields(job))
        except OutputError as exc:
            warn(f"{exc} (the job runs on)")
        return RunHandle(self, run_dir, job)

    def attach(self, run_dir: Path | str) -> RunHandle:
        """A handle on an existing run (e.g. for ``rankscope status`` in another process)."""
        run_dir = Path(run_dir)
        record = load_run(run_dir)
        job = None if RunState(record["state"]).finished else self._attach(run_dir, record)
        return RunHandle(self, run_dir, job)

    def wait(
        self,
        handle: RunHandle,
        timeout: float | None = None,
        hang: HangWatch | None = None,
        on_hang: Callable[[HangNotice], None] | None = None,
        monitor: Callable[[], None] | None = None,
    ) -> RunState:
        """Wait for the job; on Ctrl-C stop it, record ``interrupted`` and re-raise.

        With ``hang``, the ranks' progress is read between polls: when the job hangs
        (:mod:`rankscope.launchers.hang_watch`) the notice is printed at once, the ranks are
        asked where they are (unless ``--on-hang kill``), ``on_hang`` gets the notice (the
        orchestrator diagnoses and says who and where), and the job is ended as ``hung``
        (:data:`EXIT_HUNG`) — or, ``--on-hang wait``, left running. ``monitor`` (with
        ``hang``) is called between the looks, every :attr:`live_poll_s` (the live line).
        """
        current = RunState(handle.record()["state"])
        if current.finished:
            return current
        if handle.job is None:
            raise UsageError(f"run {handle.run_dir} cannot be reached from this process")
        try:
            poll_s = POLL_INTERVAL_S if monitor is None else self.live_poll_s
            outcome = wait_watching(self, handle, timeout, hang, on_hang, poll_s, monitor)
        except KeyboardInterrupt:
            if self._stop_following(handle.job):
                return RunState(handle.record()["state"])
            outcome = self._cancel(handle.job, interrupt=True)
            outcome.state = RunState.INTERRUPTED
            if outcome.exit_code is None:
                outcome.exit_code = EXIT_INTERRUPTED
            try:
                self._finish(handle, outcome)
            except RankscopeError as exc:  # the interrupt stays the outcome; say what failed
                warn(str(exc))
            raise
        if outcome is None:
            return current
        return self._finish(handle, outcome)

    def cancel(self, handle: RunHandle) -> RunState:
        """Stop the job and record ``cancelled``."""
        current = RunState(handle.record()["state"])
        if current.finished:
            return current
        if handle.job is None:
            raise UsageError(f"run {handle.run_dir} cannot be reached from this process")
        outcome = self._cancel(handle.job, interrupt=False)
        if outcome.state != RunState.HUNG:  # a job ended while it hung stays hung
            outcome.state = RunState.CANCELLED
        return self._finish(handle, outcome)

    def _finish(self, handle: RunHandle, outcome: JobOutcome) -> RunState:
        """Record the final state, exit code and failures (the ranks' own and the backend's)."""
        failures = rank_failures(handle.run_dir)
        if outcome.state == RunState.COMPLETED and not outcome.failures and not failures:
            with contextlib.suppress(InputFileError):
                world = load_run(handle.run_dir).get("world_size")
                failures = unfinished_profiles(handle.run_dir, world)
        seen = {f["rank"] for f in failures}
        roots = {f.get("rank") for f in outcome.failures if f.get("root_cause")}
        failures += [f for f in outcome.failures if f.get("rank") not in seen]
        for f in failures:
            if f.get("rank") in roots:
                f["root_cause"] = True
        # the backend's root cause first, then by time: the first rank to fail is usually the
        # cause, the others its victims (e.g. "connection closed by peer")
        failures.sort(
            key=lambda f: (
                not f.get("root_cause"),
                f.get("time_ns") is None,
                f.get("time_ns") or 0,
                f.get("rank") if f.get("rank") is not None else -1,
            )
        )
        state = outcome.state
        if state == RunState.COMPLETED and failures:
            state = RunState.FAILED
        fields = dict(outcome.fields)
        if (
            state == RunState.FAILED
            and failures
            and is_collective_timeout(str(failures[0].get("error") or ""))
        ):
            # the first rank to fail waited for a collective the others never joined: a hang
            # (the orchestrator says who and where, from the ranks' own answers)
            state = RunState.HUNG
            outcome.exit_code = EXIT_HUNG
            first = failures[0]
            fields["hang"] = {
                "collective_timeout": {
                    "rank": first.get("rank"),
                    "error": first["error"],
                    "time_ns": first.get("time_ns"),
                }
            }
        try:
            update_run(
                handle.run_dir,
                state=str(state),
                exit_code=outcome.exit_code,
                ended_at=utc_now(),
                failures=failures,
                **fields,
            )
        except OutputError as exc:
            # The job has ended all the same: say how, in the same line.
            code = "" if outcome.exit_code is None else f" (exit status {outcome.exit_code})"
            raise OutputError(f"{exc}; the job itself ended as {state}{code}") from exc
        return state


def warn(message: str) -> None:
    """One warning line on stderr (``rankscope: warning: …``): the run goes on."""
    print(f"rankscope: warning: {message}", file=sys.stderr, flush=True)


def launcher_for_kind(kind: LauncherKind | str) -> Launcher:
    """An instance of the backend for ``kind`` (imported on demand)."""
    kind = LauncherKind(kind)
    if kind not in LAUNCHERS:
        raise UsageError(f"runs started by an {kind} launcher cannot be followed by rankscope")
    module_name, _, class_name = LAUNCHERS[kind].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    launcher: Launcher = cls()
    return launcher


def launcher_for_run(run_dir: Path | str, record: dict[str, Any] | None = None) -> Launcher:
    """The backend named in a run's ``run.json`` (local when it names none)."""
    record = load_run(run_dir) if record is None else record
    try:
        kind = LauncherKind(record.get("launcher", LauncherKind.LOCAL))
    except ValueError as exc:
        raise InputFileError(f"{Path(run_dir) / rundir.RUN_JSON}: unknown launcher") from exc
    return launcher_for_kind(kind)


def open_run(run_dir: Path | str) -> RunHandle:
    """A handle on an existing run, with the backend named in its ``run.json``."""
    return launcher_for_run(run_dir).attach(run_dir)
