"""Local backend: torchrun as a child process on this machine.

Every rank runs ``python -m rankscope.launchers.rank SCRIPT ARGS…`` under
``python -m torch.distributed.run <torchrun flags> -m …``. torchrun runs in its own process group
(so Ctrl-C reaches rankscope first and is forwarded in order: SIGINT, then SIGTERM, then SIGKILL
after grace periods). Its output goes both to the terminal and to ``RUN/logs/torchrun.log``;
the terminal's copy leaves out Kineto's per-window trace markers
(:class:`rankscope.launchers.output.ConsoleFilter`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from rankscope.launchers import rundir
from rankscope.launchers.base import EXIT_INTERRUPTED, JobOutcome, Launcher
from rankscope.launchers.output import ConsoleFilter, tee
from rankscope.launchers.rundir import RunState
from rankscope.launchers.spec import LauncherKind, RunSpec
from rankscope.launchers.torchrun import (
    TORCHELASTIC_DIR,
    prune_empty_dirs,
    rank_command,
    rank_env,
    torchrun_failures,
)


def pid_alive(pid: Any) -> bool:
    """Is process ``pid`` alive (on this host)? Unknown pids are not."""
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


#: Seconds between two looks at a local job with the live line: the monitor reads only what the
#: ranks appended (a few records), so it can look often; a change is noticed within a window of
#: steps plus this.
LIVE_POLL_S = 0.1
#: Log of torchrun's combined stdout/stderr inside ``RUN/logs/``.
TORCHRUN_LOG = "torchrun.log"
#: Seconds the ranks get to flush after SIGINT before SIGTERM, and after SIGTERM before SIGKILL.
INTERRUPT_GRACE_S = 20.0
TERMINATE_GRACE_S = 10.0


@dataclass
class LocalJob:
    """The torchrun child process and the thread copying its output."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    pump: threading.Thread
    echo: IO[bytes] | None = None
    shown: ConsoleFilter = field(default_factory=ConsoleFilter)
    """What of the job's output reaches the terminal (muted once the job hangs)."""
    extra: dict[str, Any] = field(default_factory=dict)


class LocalLauncher(Launcher):
    """torchrun on this machine, in its own process group."""

    kind: ClassVar[LauncherKind] = LauncherKind.LOCAL
    live_poll_s: ClassVar[float] = LIVE_POLL_S

    def __init__(self, *, echo: bool = True) -> None:
        self.echo = echo
        """Copy the job's output to this process's stdout (besides the log file)."""

    def _start(self, spec: RunSpec, run_dir: Path) -> LocalJob:
        log_path = run_dir / rundir.LOGS_DIR / TORCHRUN_LOG
        proc = subprocess.Popen(
            rank_command(spec, run_dir),
            env=rank_env(spec, run_dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if proc.stdout is None:  # cannot happen with stdout=PIPE; keeps the type checker honest
            raise RuntimeError("torchrun started without an output pipe")
        echo = getattr(sys.stdout, "buffer", None) if self.echo else None
        shown = ConsoleFilter()
        pump = threading.Thread(target=tee, args=(proc.stdout, log_path, echo, shown), daemon=True)
        pump.start()
        return LocalJob(proc=proc, log_path=log_path, pump=pump, echo=echo, shown=shown)

    def _mute_output(self, job: LocalJob) -> None:
        job.shown.mute()

    def _record_fields(self, job: LocalJob) -> dict[str, Any]:
        return {"local": {"pid": job.proc.pid, "log": str(job.log_path)}}

    def _outcome(self, job: LocalJob, code: int) -> JobOutcome:
        job.pump.join(timeout=10)
        prune_empty_dirs(job.log_path.parent / TORCHELASTIC_DIR)  # a failed rank's error.json stays
        try:
            text = job.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        state = RunState.COMPLETED if code == 0 else RunState.FAILED
        failures = torchrun_failures(text) if code != 0 else []
        return JobOutcome(state=state, exit_code=code, failures=failures)

    def _poll(self, job: LocalJob) -> JobOutcome | None:
        code = job.proc.poll()
        return None if code is None else self._outcome(job, code)

    def _wait(self, job: LocalJob, timeout: float | None) -> JobOutcome | None:
        try:
            code = job.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._outcome(job, code)

    def _signal(self, job: LocalJob, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.proc.pid, sig)

    # ------------------------------------------------------ `rankscope status` / `cancel`
    def status_details(self, run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
        """A note when the run is still marked running but its torchrun is gone."""
        notes = []
        pid = (record.get("local") or {}).get("pid")
        state = record.get("state")
        finished = RunState(state).finished if state in set(RunState) else True
        if not finished and pid is not None and not pid_alive(pid):
            notes.append(
                f"torchrun (pid {pid}) is gone but the run was never finished: the launcher died"
            )
        return {"tasks": [], "notes": notes}

    def cancel_run(self, run_dir: Path) -> str:
        """A local run is stopped in its own terminal: say how, with its torchrun pid."""
        from rankscope.errors import UsageError
        from rankscope.launchers.rundir import load_run

        pid = (load_run(run_dir).get("local") or {}).get("pid")
        where = f" (torchrun pid {pid})" if pid else ""
        raise UsageError(f"{run_dir} is a local run{where}: stop it with Ctrl-C in its terminal")

    def _cancel(self, job: LocalJob, *, interrupt: bool) -> JobOutcome:
        """SIGINT (ranks flush), then SIGTERM, then SIGKILL, each after a grace period."""
        steps = [
            (signal.SIGINT if interrupt else signal.SIGTERM, INTERRUPT_GRACE_S),
            (signal.SIGTERM, TERMINATE_GRACE_S),
            (signal.SIGKILL, TERMINATE_GRACE_S),
        ]
        code: int | None = None
        for sig, grace in steps:
            self._signal(job, sig)
            try:
                code = job.proc.wait(timeout=grace)
                break
            except (subprocess.TimeoutExpired, KeyboardInterrupt):  # 2nd Ctrl-C: escalate now
                continue
        outcome = self._outcome(job, code if code is not None else -9)
        outcome.state = RunState.INTERRUPTED if interrupt else RunState.CANCELLED
        outcome.exit_code = EXIT_INTERRUPTED if interrupt else outcome.exit_code
        return outcome
