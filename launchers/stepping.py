"""How a rank's profiler advances: one profiler step per training iteration, and its cost.

The stepping half of :class:`~rankscope.launchers.runtime.RankRuntime` (a mixin: the state lives
in the runtime, these methods only read and update it): the global optimizer-step post hook
(only the lead optimizer drives the profiler, and only once torch's ``Optimizer.step`` range has
closed), explicit ``rankscope.step(samples=N)``, holding Ctrl-C/SIGTERM back while the profiler
changes state, and the per-step records of meta.json: ``step_samples`` and ``step_cpu`` (wall
time, the main thread's CPU time and run-queue delay, in ns, from :data:`THREAD_SCHEDSTAT`).
Separate from ``runtime.py`` because the rules of when a step ends are the subtle part of the
runtime and read best on their own; the lifecycle, clock sync and failure capture stay there.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from rankscope.launchers.collective_wait import CLOCK as WAIT_CLOCK
from rankscope.launchers.step_log import UNKNOWN

if TYPE_CHECKING:
    from rankscope.launchers.hang_probe import HangProbe

#: The calling thread's scheduler counters (Linux): ns on a CPU, ns runnable but waiting for one
#: (run-queue delay), time slices. Opened once by the training thread and read with ``pread`` at
#: every step end (~8 µs under load; opening it each time cost ~100 µs); absent elsewhere.
THREAD_SCHEDSTAT = Path("/proc/thread-self/schedstat")
#: Key of meta.json holding ``{step: [wall_ns, cpu_ns, runq_ns]}`` per recorded step.
STEP_CPU_KEY = "step_cpu"
#: Key under which the rank's facts are added to every Kineto trace (``prof.add_metadata_json``).
TRACE_METADATA_KEY = "rankscope"

#: Signals whose Python handlers are held back while the profiler changes state.
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold back Ctrl-C/SIGTERM handlers for the duration; run them (raise) right after.

    Only Python-level handlers are swapped (``signal.signal`` works in the main thread only;
    elsewhere, or with SIG_DFL/SIG_IGN, nothing changes).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def defer(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    saved = {sig: signal.getsignal(sig) for sig in DEFERRED_SIGNALS}
    for sig, handler in saved.items():
        if callable(handler):
            signal.signal(sig, defer)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if callable(handler):
                signal.signal(sig, handler)
        for signum in pending:
            held = saved[signal.Signals(signum)]
            if callable(held):
                held(signum, None)


def _thread_times(fd: int | None) -> tuple[int, int, int] | None:
    """(wall ns, the training thread's CPU ns, its run-queue ns) from its open
    :data:`THREAD_SCHEDSTAT` ``fd``: the run-queue delay is the time the thread could have run but
    another task held the core; None where Linux does not say."""
    if fd is None:
        return None
    wall = time.monotonic_ns()
    try:
        fields = os.pread(fd, 128, 0).split()
        return wall, int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


class RankStepping:
    """Stepping the profiler of one rank (mixed into :class:`~rankscope.launchers.runtime.RankRuntime`,
    which sets every attribute below in its ``__init__``)."""

    prof: Any
    window: int
    manual: bool
    recording: bool
    exiting: bool
    meta: dict[str, Any]
    lock: threading.RLock
    _recording_actions: tuple[Any, ...]
    _save_action: Any
    _step_depth: int
    _step_due: bool
    _step_mark: tuple[int, int, int] | None
    _schedstat: int | None
    _lead_settled: bool
    _after_lead: weakref.ref[Any] | None
    _lead_optimizer: weakref.ref[Any] | None
    probe: HangProbe

    # ------------------------------------------------------------------ stepping
    def step(self, samples: float | None = None) -> None:
        """Advance the profiler by one step (explicit ``rankscope.step()``); ``samples``: what
        the step that ends processed, recorded when that step is recorded (``step_samples``)."""
        self.manual = True
        prof = self.prof
        if samples is not None and prof is not None and not self.exiting:
            recording = prof.current_action in self._recording_actions
            with self.lock:
                if recording:
                    self.meta["step_samples"].setdefault(str(prof.step_num), samples)
        self._advance()

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Global optimizer-step post hook: exactly one profiler step per training iteration.

        * Several optimizers per iteration: one *lead* optimizer drives the profiler. The first
          optimizer that steps leads; if another one steps after it before it steps again (GAN,
          per-module optimizers), that later one closes the iteration and takes the lead, once.
        * torch calls post hooks INSIDE the ``Optimizer.step#…`` profiler range, so stepping the
          profiler here would end ``ProfilerStep#N`` inside that range (crossing ranges, an op
          cut off at a window's end). So the hook marks the step as due, and a thin wrapper
          around the optimizer class's ``step`` advances the profiler when the range has closed,
          as a hand-written loop would.
        """
        if self.manual or self.prof is None:
            return
        lead = self._lead_optimizer() if self._lead_optimizer is not None else None
        if lead is None:  # first optimizer step of the run (or the lead was garbage-collected)
            self._lead_optimizer = weakref.ref(optimizer)
            self._lead_settled = False
            self._after_lead = None
            self._wrap_optimizer_step(type(optimizer))
        elif optimizer is not lead:
            self._after_lead = weakref.ref(optimizer)
            return
        else:
            later = self._after_lead() if self._after_lead is not None else None
            self._after_lead = None
            settled, self._lead_settled = self._lead_settled, True
            if later is not None and not settled:
                # `later` stepped after the lead within the iteration: it closes iterations
                self._lead_optimizer = weakref.ref(later)
                self._wrap_optimizer_step(type(later))
                return
        if self._step_depth > 0:
            self._step_due = True  # the wrapper advances when the outermost step returns
        else:
            self._advance()

    def _wrap_optimizer_step(self, cls: type) -> None:
        """Wrap ``cls.step`` so the profiler advances after torch's ``Optimizer.step`` range."""
        inner = cls.step  # type: ignore[attr-defined]
        if getattr(inner, "_rankscope_outer", False):
            return
        runtime = self

        @functools.wraps(inner)
        def step(*args: Any, **kwargs: Any) -> Any:
            runtime._step_depth += 1
            try:
                return inner(*args, **kwargs)
            finally:
                runtime._step_depth -= 1
                if runtime._step_depth == 0 and runtime._step_due:
                    runtime._step_due = False
                    runtime._advance()

        step._rankscope_outer = True  # type: ignore[attr-defined]
        step.hooked = True  # type: ignore[attr-defined]  # torch's mark: do not wrap again
        cls.step = step  # type: ignore[attr-defined]

    def _advance(self) -> None:
        if self.prof is None or self.exiting:
            return
        # the step ends now (before the profiler's own work below): its record for the step log
        end_ns = time.time_ns()
        wait_ns = WAIT_CLOCK.take()
        current = self.prof.current_action
        mark = self._record_step_cpu(current in self._recording_actions)
        if current == self._save_action or self.prof.schedule(self.prof.step_num + 1) != current:
            # the profiler changes state (a window starts or ends, the trace is exported): a
            # Ctrl-C/SIGTERM in the middle would leave it half-way; let it land just after
            with signals_deferred():
                self.prof.step()
        else:
            self.prof.step()
        self.meta["steps"] += 1
        cpu_ns, runq_ns = (mark[1], mark[2]) if mark is not None else (UNKNOWN, UNKNOWN)
        self.probe.beat(self.meta["steps"], end_ns, wait_ns, cpu_ns, runq_ns)
        self._tag_window()
        # the next step begins now, as the trace's ProfilerStep#N does: the profiler's own work
        # in step() (starting a window, exporting one, counting FLOPs: milliseconds under load)
        # is not the training step's
        self._step_mark = _thread_times(self._schedstat)

    def _record_step_cpu(self, recording: bool) -> tuple[int, int, int] | None:
        """The step that ends now: its wall time, the main thread's CPU time and run-queue delay
        (``step_cpu``), when it was recorded. The first step has no start mark and is skipped.
        Returns the thread's counters now (the step log keeps them at every step), None where
        Linux does not say."""
        mark = _thread_times(self._schedstat)
        before, self._step_mark = self._step_mark, None
        if not recording or before is None or mark is None:
            return mark
        wall, cpu, runq = (now - then for now, then in zip(mark, before, strict=True))
        with self.lock:
            self.meta[STEP_CPU_KEY].setdefault(str(self.prof.step_num), [wall, cpu, runq])
        return mark

    def _tag_window(self) -> None:
        """At the first recorded step of a window, add the rank's facts to the trace."""
        recording = self.prof.current_action in self._recording_actions
        if recording and not self.recording:
            import json

            facts = {
                k: self.meta[k]
                for k in ("rank", "local_rank", "world_size", "host", "pid", "device")
            }
            facts["clock_domain"] = self.meta["clock"]["domain"]
            facts["run_id"] = self.meta["run_id"]
            facts["window"] = self.window
            with contextlib.suppress(Exception):  # a nicety: never break the job for it
                self.prof.add_metadata_json(TRACE_METADATA_KEY, json.dumps(facts))
        self.recording = recording
