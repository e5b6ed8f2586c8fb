"""Noticing that a job hangs, from the launcher: no rank finishes a step any more.

Every rank rewrites ``ranks/NNNNN/progress.json`` as it trains (``launchers/hang_probe.py``).
While the launcher waits for the job it reads them every poll (:meth:`HangWatch.check`):

* **After the first step**, the job is hung when no rank has finished a step for
  :attr:`HangRule.hang_after_s` seconds — by default ``max(10 × the p99 step time seen,
  300 s)``: long enough that a job whose steps slowly grow (0.2 s → 3 s) is never called hung,
  short enough that a stuck job does not burn its allocation for the 10–30 minutes a collective
  timeout takes.
* **Before the first step**, imports, rendezvous, data loading and compilation take their
  time: the rule is :data:`FIRST_STEP_FACTOR` times the set ``hang_after_s`` but at least
  :data:`FIRST_STEP_MIN_S` (else :data:`FIRST_STEP_DEFAULT_S`), counted from the launch.

Then (:meth:`HangWatch.ask_ranks`) every rank is asked where it is: the launcher writes
``RUN/hang.request`` and waits up to :data:`ANSWER_WAIT_S` for each rank's ``hang.json``; a rank
that does not answer within :data:`SIGNAL_AFTER_S` gets :data:`STACK_SIGNAL`, on which
faulthandler writes its stacks from C. How a rank is signalled and how the job is ended are the
launcher's (:meth:`~rankscope.launchers.base.Launcher._signal_ranks`,
:meth:`~rankscope.launchers.base.Launcher._end_hung`: ``os.kill`` and torchrun's process group
here, the node tasks and ``scancel`` on Slurm); :func:`wait_watching` is the same for both. What
to make of the answers is the analysis' (``rankscope.analysis.compute.hang``): this floor may not
import it, so the orchestrator does. Seconds unless a name says ``_ns``.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from rankscope.launchers.base import JobOutcome, Launcher, RunHandle

from rankscope.config_flags import flag
from rankscope.errors import OutputError
from rankscope.launchers import rundir
from rankscope.launchers.hang_probe import STACK_SIGNAL
from rankscope.launchers.rundir import RunState, update_run

#: The default threshold after the first step is this many times the p99 step time seen ...
STEP_FACTOR = 10.0
#: ... and never less than this many seconds.
MIN_HANG_AFTER_S = 300.0
#: Before the first step: this many times ``--hang-after`` when it was set, and at least
#: FIRST_STEP_MIN_S (imports, rendezvous, data loading and compilation: on a busy 2-core machine
#: ten ranks took 20 s to import torch) ...
FIRST_STEP_FACTOR = 3.0
FIRST_STEP_MIN_S = 120.0
#: ... else this many seconds.
FIRST_STEP_DEFAULT_S = 1800.0
#: Seconds the launcher waits for every rank's answer.
ANSWER_WAIT_S = 10.0
#: Seconds after which a rank that did not answer gets STACK_SIGNAL.
SIGNAL_AFTER_S = 4.0
#: py-spy, where installed (on PATH or beside this Python: the dev extra), dumps the native and
#: Python frames of a rank on this host that did not answer (a C extension holding the GIL)...
PY_SPY = "py-spy"
#: ... bounded by this many seconds per rank.
PY_SPY_TIMEOUT_S = 20.0
#: Step intervals kept per job for the p99 (the most recent ones).
MAX_INTERVALS = 2000
#: Exit status of a run ended because it hung, as timeout(1) ends a command that overran.
EXIT_HUNG = 124


class OnHang(enum.StrEnum):
    """What ``rankscope run`` does when the job hangs (``--on-hang``)."""

    REPORT = "report"
    """Ask every rank where it is, say who and where, then end the job (the default: the
    allocation is not burnt waiting for a collective timeout)."""
    KILL = "kill"
    """End the job at once, without asking the ranks."""
    WAIT = "wait"
    """Ask, say who and where, and leave the job running (for a debugger); Ctrl-C ends it."""


def positive_seconds(text: str) -> float:
    """A number of seconds > 0 (``--hang-after``); ValueError otherwise."""
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class HangRule:
    """When a job counts as hung, and what to do then (``rankscope run``'s flags, generated from
    these fields by :mod:`rankscope.config_flags`)."""

    hang_after_s: float | None = field(
        default=None, metadata=flag(name="--hang-after", metavar="S", parse=positive_seconds)
    )
    """the job is hung when no rank finishes a step for S seconds (default: max(10 x the p99 step
    time, 300 s); before the first step, 3 x S and at least 120 s)"""
    on_hang: OnHang = field(default=OnHang.REPORT, metadata=flag(metavar="{report,kill,wait}"))
    """when it hangs: 'report' where every rank is, then end the job (default); 'kill' it at
    once; 'wait': report and leave it running"""


@dataclass
class RankProgress:
    """One rank's progress as its progress.json said at the last look."""

    rank: int
    pid: int | None
    steps: int
    last_step_ns: int | None
    stack_signal: bool = False
    """Its faulthandler answers STACK_SIGNAL (else the signal would end it)."""


@dataclass
class HangNotice:
    """A hang, as the launcher noticed it."""

    idle_s: float
    """Seconds since any rank finished a step (since the launch, before the first step)."""
    threshold_s: float
    """The rule's threshold at that moment."""
    before_first_step: bool
    """No rank had finished a step."""
    ranks: list[RankProgress]
    """Every rank's progress (those that wrote one)."""
    noticed_ns: int = field(default_factory=time.time_ns)
    """When (ns since the epoch)."""
    answered: list[int] = field(default_factory=list)
    """Ranks that wrote hang.json."""
    signalled: list[int] = field(default_factory=list)
    """Ranks sent STACK_SIGNAL (they did not answer in time)."""
    native: list[int] = field(default_factory=list)
    """Ranks whose native stacks py-spy wrote (``ranks/NNNNN/native-stacks.txt``)."""
    on_hang: OnHang = OnHang.REPORT
    """What the watch does about it (``--on-hang``): recorded before the job is ended, so that
    whoever reads the job's end afterwards (a Slurm job is ``CANCELLED`` in accounting) knows it
    was ended because it hung."""

    def since_s(self, p: RankProgress) -> float | None:
        """Seconds from ``p``'s last step to the notice (None: it finished none)."""
        return None if p.last_step_ns is None else (self.noticed_ns - p.last_step_ns) / 1e9

    def line(self) -> str:
        """The terminal's first word on it, at once: how long, and each rank's last step."""
        if self.before_first_step:
            head = f"no rank has finished a step {self.idle_s:.0f} s after the launch"
        else:
            head = f"no rank has finished a step for {self.idle_s:.0f} s"
        parts = []
        for p in sorted(self.ranks, key=lambda p: p.rank)[:8]:
            since = self.since_s(p)
            parts.append(
                f"rank {p.rank}: no step yet"
                if since is None
                else f"rank {p.rank}: step {p.steps}, {since:.0f} s ago"
            )
        more = f"; {len(self.ranks) - 8} more" if len(self.ranks) > 8 else ""
        return f"{head} ({'; '.join(parts)}{more}) (threshold {self.threshold_s:.0f} s)"

    def record(self) -> dict[str, Any]:
        """The notice for ``run.json``'s ``hang`` object."""
        return {
            "noticed_ns": self.noticed_ns,
            "idle_s": round(self.idle_s, 3),
            "threshold_s": round(self.threshold_s, 3),
            "before_first_step": self.before_first_step,
            "answered": self.answered,
            "signalled": self.signalled,
            "native_stacks": self.native,
            "on_hang": str(self.on_hang),
        }


class HangWatch:
    """Reads the ranks' progress between polls and says when the job hangs (module docstring)."""

    def __init__(
        self,
        run_dir: Path,
        rule: HangRule,
        local: bool = True,
        failing: Callable[[], bool] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rule = rule
        self.local = local
        """The ranks run on this host: a rank whose process is gone is a failure in progress
        (torchrun tears the others down), not a hang."""
        self.failing = failing
        """Says whether the job is failing already where this process cannot see the ranks'
        processes (a Slurm node whose torchrun reported a dead rank): a failure, not a hang."""
        self.started = time.monotonic()
        self.started_ns = time.time_ns()
        self._seen: dict[int, tuple[int, int]] = {}
        self.intervals_s: list[float] = []
        self.reported_at_steps: int | None = None
        """Total steps when the last hang was reported (``wait`` mode: report once per hang)."""

    def restart(self) -> None:
        """Count the time before the first step from now (the job has not started yet)."""
        self.started = time.monotonic()
        self.started_ns = time.time_ns()

    def progress(self) -> list[RankProgress]:
        """Every rank's progress.json (unreadable or half-written ones left out this time)."""
        out = []
        for path in sorted((self.run_dir / rundir.RANKS_DIR).glob(f"*/{rundir.PROGRESS_FILE}")):
            try:
                doc = json.loads(path.read_text())
                out.append(
                    RankProgress(
                        rank=int(doc["rank"]),
                        pid=doc.get("pid"),
                        steps=int(doc.get("steps") or 0),
                        last_step_ns=doc.get("last_step_ns"),
                        stack_signal=bool(doc.get("stack_signal")),
                    )
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def threshold_s(self, before_first_step: bool) -> float:
        """Seconds without progress that make a hang, by the rule, now."""
        if before_first_step:
            if self.rule.hang_after_s is not None:
                return max(FIRST_STEP_FACTOR * self.rule.hang_after_s, FIRST_STEP_MIN_S)
            return FIRST_STEP_DEFAULT_S
        if self.rule.hang_after_s is not None:
            return self.rule.hang_after_s
        return max(STEP_FACTOR * self.p99_step_s(), MIN_HANG_AFTER_S)

    def p99_step_s(self) -> float:
        """The 99th percentile of the step times seen (mean step time between two looks at a
        rank's progress); 0 before any."""
        if not self.intervals_s:
            return 0.0
        ordered = sorted(self.intervals_s)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def check(self) -> HangNotice | None:
        """A :class:`HangNotice` when the job hangs now, else None."""
        ranks = self.progress()
        for p in ranks:
            if p.last_step_ns is None or p.steps <= 0:
                continue
            before = self._seen.get(p.rank)
            if before is not None and p.steps > before[0]:
                self.intervals_s.append((p.last_step_ns - before[1]) / 1e9 / (p.steps - before[0]))
                del self.intervals_s[:-MAX_INTERVALS]
            self._seen[p.rank] = (p.steps, p.last_step_ns)
        if self.local and any(p.pid and not _alive(p.pid) for p in ranks):
            return None  # a rank died: torchrun ends the others; the failure is the story
        if self.failing is not None and self.failing():
            return None  # the same, seen by the backend (another node's torchrun)
        stepped = [p.last_step_ns for p in ranks if p.last_step_ns is not None]
        total = sum(p.steps for p in ranks)
        if self.reported_at_steps is not None:
            if total == self.reported_at_steps:
                return None  # the hang reported already (``wait``): until progress resumes
            self.reported_at_steps = None
        now_ns = time.time_ns()
        before_first = not stepped
        idle_s = (now_ns - (max(stepped) if stepped else self.started_ns)) / 1e9
        threshold = self.threshold_s(before_first)
        if idle_s < threshold:
            return None
        self.reported_at_steps = total
        return HangNotice(
            idle_s=idle_s, threshold_s=threshold, before_first_step=before_first, ranks=ranks
        )

    def ask_ranks(
        self,
        notice: HangNotice,
        signal_ranks: Callable[[list[RankProgress]], list[int]] | None = None,
    ) -> None:
        """Write the request, wait for the answers (bounded), have ``signal_ranks`` send
        STACK_SIGNAL to the silent ranks that can take it (the launcher's way: they may run on
        other hosts; it returns the ranks it signalled); fills ``notice.answered`` /
        ``notice.signalled``."""
        token = str(notice.noticed_ns)
        with contextlib.suppress(OSError):
            rundir.write_bytes_atomic(self.run_dir / rundir.HANG_REQUEST, token.encode())
        deadline = time.monotonic() + ANSWER_WAIT_S
        signal_at = time.monotonic() + SIGNAL_AFTER_S
        expected = {p.rank: p for p in notice.ranks}
        tried = False
        while True:
            answered = sorted(r for r in expected if _answer_token(self.run_dir, r) == token)
            if len(answered) == len(expected) or time.monotonic() >= deadline:
                break
            if signal_ranks is not None and not tried and time.monotonic() >= signal_at:
                tried = True
                silent = [
                    p for r, p in expected.items() if r not in answered and p.stack_signal and p.pid
                ]
                if silent:
                    notice.signalled = sorted(signal_ranks(silent))
            time.sleep(0.2)
        notice.answered = answered
        if self.local:  # py-spy reads a process of this host only
            for r, p in sorted(expected.items()):
                if r not in answered and p.pid and _native_stacks(p.pid, self.run_dir, r):
                    notice.native.append(r)


def py_spy() -> str | None:
    """The py-spy program: on PATH, or beside this Python (a venv's bin); None when absent."""
    import shutil

    beside = Path(sys.executable).parent / PY_SPY
    return shutil.which(PY_SPY) or (str(beside) if beside.is_file() else None)


def _native_stacks(pid: int, run_dir: Path, rank: int) -> bool:
    """``py-spy dump --native`` of ``pid`` to the rank's native-stacks.txt (within
    PY_SPY_TIMEOUT_S); False when py-spy is not installed, fails or does not finish."""
    import subprocess

    program = py_spy()
    if program is None:
        return False
    try:
        done = subprocess.run(
            # full paths: the analysis tells the user's files from libraries' by them
            [program, "dump", "--native", "--full-filenames", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=PY_SPY_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    if done.returncode != 0 or not done.stdout.strip():
        return False
    with contextlib.suppress(OSError):
        rundir.write_bytes_atomic(
            rundir.rank_dir(run_dir, rank) / rundir.NATIVE_STACKS_FILE, done.stdout.encode()
        )
        return True
    return False


def _answer_token(run_dir: Path, rank: int) -> str | None:
    """The token of ``rank``'s hang.json (None: none, or unreadable yet)."""
    try:
        doc = json.loads((rundir.rank_dir(run_dir, rank) / rundir.HANG_DUMP).read_text())
    except (OSError, ValueError):
        return None
    return str(doc.get("token")) if isinstance(doc, dict) else None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def signal_pid(pid: int) -> bool:
    """STACK_SIGNAL to ``pid`` (a rank on this host); False when it is gone."""
    try:
        os.kill(pid, STACK_SIGNAL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def report_hang(
    hang: HangWatch,
    notice: HangNotice,
    signal_ranks: Callable[[list[RankProgress]], list[int]],
    who: str = "rankscope run",
) -> None:
    """What every watcher does on a hang before the job is ended (:func:`wait_watching`, and a
    Slurm batch job's first node): say it at once, ask every rank where it is (unless ``--on-hang
    kill``), and record the notice, with ``on_hang``, in ``run.json``."""
    notice.on_hang = hang.rule.on_hang
    print(f"{who}: the job looks hung: {notice.line()}", file=sys.stderr, flush=True)
    if hang.rule.on_hang != OnHang.KILL:
        print(f"{who}: asking every rank where it is ...", file=sys.stderr, flush=True)
        hang.ask_ranks(notice, signal_ranks)
    with contextlib.suppress(OutputError):
        update_run(hang.run_dir, hang=notice.record())


def wait_watching(
    launcher: Launcher,
    handle: RunHandle,
    timeout: float | None,
    hang: HangWatch | None,
    on_hang: Callable[[HangNotice], None] | None,
    poll_s: float,
    monitor: Callable[[], None] | None = None,
) -> JobOutcome | None:
    """``launcher``'s wait for the job, in slices with a look at the
    ranks' progress between them (every ``poll_s``) when ``hang`` is given; on a hang, what
    :meth:`rankscope.launchers.base.Launcher.wait` says. ``monitor``: called after every slice
    while the job runs (the orchestrator's live line: the launchers never import it)."""
    if hang is None:
        return launcher._wait(handle.job, timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        outcome = launcher._wait(handle.job, poll_s if left is None else min(left, poll_s))
        if outcome is not None:
            return outcome
        if not launcher._running(handle.job):
            hang.restart()  # still queued: the first-step rule counts from the start
            continue
        if monitor is not None:
            monitor()
        notice = hang.check()
        if notice is None:
            continue
        ended = launcher._poll(handle.job)
        if ended is not None:
            return ended  # it ended while we looked: not a hang
        if hang.rule.on_hang != OnHang.WAIT:
            launcher._mute_output(handle.job)
        report_hang(hang, notice, lambda ranks: launcher._signal_ranks(handle.job, ranks))
        if on_hang is not None:
            on_hang(notice)
        if hang.rule.on_hang == OnHang.WAIT:
            print(
                "rankscope run: the job keeps running (--on-hang wait); Ctrl-C ends it",
                file=sys.stderr,
                flush=True,
            )
            continue
        ended = launcher._end_hung(handle.job)
        ended.state = RunState.HUNG
        ended.exit_code = EXIT_HUNG
        return ended
