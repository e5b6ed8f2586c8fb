"""What a rank tells when the job looks stuck: its progress, every thread's Python stack, and the
collectives it entered and completed.

The launcher cannot see inside a rank that stopped making progress, and the rank's own main
thread is the one that is stuck (in an endless loop, in a collective, waiting on a data-loader
worker). So every rank runs, beside the training, one daemon thread of this module:

* **Progress.** :meth:`HangProbe.beat` (called at the end of every step) writes
  ``ranks/NNNNN/progress.json`` — steps done, when the last one ended (ns since the epoch),
  the pid — at most every :data:`BEAT_INTERVAL_S`, atomically: the launcher reads them to notice
  that no rank finishes steps any more.
* **Answers.** When the launcher writes ``RUN/hang.request``, the thread writes
  ``ranks/NNNNN/hang.json``: the Python stack of every thread (``sys._current_frames``: the
  thread runs between the stuck thread's bytecodes, or while it waits in C code that released
  the GIL, as collectives do), each frame marked as user code or not, and PyTorch's Flight
  Recorder as JSON (``_dump_fr_trace_json``: the collectives of every process group with their
  sequence numbers, whatever the backend; never its pickle form: docs/security.md).
* **Every step.** :meth:`HangProbe.beat` also keeps the step's record (steps done, end time,
  collective wait) in memory; the thread appends them in blocks to ``ranks/NNNNN/steps.bin``
  (:mod:`rankscope.launchers.step_log`) at every look (:data:`REQUEST_POLL_S`), as the rank
  ends, and in its answers (SIGTERM, its own error): the whole run's step times, read live by
  ``rankscope run``'s monitor and merged into the store after the run (docs/live.md).
* **Last resort.** ``faulthandler`` on :data:`STACK_SIGNAL` writes every thread's stack to
  ``ranks/NNNNN/stacks.txt`` from C, for a rank whose Python threads cannot run at all (a C
  extension holding the GIL); the launcher sends that signal to ranks that do not answer.

Why one module: progress, answers, the step log and the trigger file are the duties of ONE
thread with ONE poll loop (:meth:`HangProbe._watch`); they share its state (steps done, the
SIGTERM wakeup, what was answered) and its rule that the training never waits for it.

Times are ns since the epoch (``time.time_ns``) unless a name says ``_s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import sysconfig
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankscope.launchers import rundir, step_log

#: Seconds between two progress.json writes at most (a step ends far more often in small jobs).
BEAT_INTERVAL_S = 0.5
#: Seconds between two looks for the launcher's request (and for a triggered window's request,
#: and between two appends to the step log): the live monitor's trigger lead time allows for it.
REQUEST_POLL_S = 0.05
#: Signal on which faulthandler writes every thread's stack (C level, no GIL needed).
STACK_SIGNAL = signal.SIGUSR2
#: Frames kept per thread (innermost last), like faulthandler's own limit.
MAX_FRAMES = 100
#: Environment variable (and value) that makes PyTorch keep its Flight Recorder ring buffer of
#: collectives; set by ``rankscope run`` for its ranks unless the user set it.
FLIGHT_RECORDER_ENV = "TORCH_FR_BUFFER_SIZE"
FLIGHT_RECORDER_ENTRIES = "2000"


#: A collective that timed out, in the words of the backend that raised it. The job is then hung:
#: some rank never arrived (``rankscope run`` says who and where, not "rank N failed").
#:
#: * gloo: ``gloo/transport/tcp/unbound_buffer.cc`` raises "Timed out waiting {ms}ms for recv
#:   operation to complete" (or "send"), which ``ProcessGroupGloo`` passes on as the
#:   RuntimeError of the waiting collective (PyTorch 2.13, behind the source location
#:   "[…/unbound_buffer.cc:78] ").
#: * NCCL: ``ProcessGroupNCCL.cpp``'s watchdog logs "[Rank {r}] Watchdog caught collective
#:   operation timeout: WorkNCCL(SeqNum={s}, OpType={op}, …) ran for {ms} milliseconds before
#:   timing out." and then ends the process (SIGABRT; no Python exception).
COLLECTIVE_TIMEOUT_RE = re.compile(
    r"Timed out waiting \d+ms for (?:recv|send) operation to complete"
    r"|Watchdog caught collective operation timeout"
)
#: The NCCL watchdog's line, with the rank, the collective's sequence number and its op.
NCCL_WATCHDOG_RE = re.compile(
    r"\[Rank (?P<rank>\d+)\] Watchdog caught collective operation timeout: "
    r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)[^\n]*"
)


def is_collective_timeout(text: str) -> bool:
    """Whether an error's text is a collective's timeout (:data:`COLLECTIVE_TIMEOUT_RE`)."""
    return COLLECTIVE_TIMEOUT_RE.search(text) is not None


def _library_dirs() -> tuple[str, ...]:
    """Folders whose code is not the user's: the standard library, installed packages, and
    rankscope itself (its runtime wraps the user's script)."""
    paths = sysconfig.get_paths()
    dirs = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    import rankscope

    # rankscope's own folders, not their parent: in a clone, the user's examples sit beside them
    dirs.add(str(Path(rankscope.__file__).resolve().parent))
    dirs.add(str(Path(__file__).resolve().parent))
    return tuple(sorted(d for d in dirs if d))


LIBRARY_DIRS = _library_dirs()


#: Folder names that hold installed packages wherever the interpreter found them (a conda
#: environment, ``--system-site-packages``, the user's site, ``PYTHONPATH``): their code is not
#: the user's either.
PACKAGE_DIR_NAMES = frozenset({"site-packages", "dist-packages"})


def is_user_file(filename: str) -> bool:
    """Whether a frame's file is the user's code (not Python's, an installed package's — torch's
    wrappers around its collectives included — or rankscope's)."""
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if PACKAGE_DIR_NAMES.intersection(Path(path).parts):
        return False
    return not any(path.startswith(d + os.sep) or path == d for d in LIBRARY_DIRS)


def innermost_user_frame(exc: BaseException) -> dict[str, Any] | None:
    """``{file, line, function}`` of the deepest frame of ``exc``'s traceback in user code (where
    the user's script called what failed), None when no frame is the user's."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            found = {"file": code.co_filename, "line": tb.tb_lineno, "function": code.co_name}
        tb = tb.tb_next
    return found


def _frame_record(code: Any, line: int | None) -> dict[str, Any]:
    """One frame of a stack: where, whether it is the user's, and whether it is a closure (a
    decorator's wrapper is one: it calls the function it closes over; the analysis looks
    through it to name what the user called)."""
    return {
        "file": code.co_filename,
        "line": line,
        "function": code.co_name,
        "user": is_user_file(code.co_filename),
        "closure": bool(code.co_freevars),
    }


def traceback_frames(exc: BaseException) -> list[dict[str, Any]]:
    """The frames of ``exc``'s traceback, innermost last (as :func:`thread_stacks` writes a
    thread's): where the main thread was when the exception was raised."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(_frame_record(tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    return frames[-MAX_FRAMES:]


def frame_stack(frame: Any) -> list[dict[str, Any]]:
    """The stack from ``frame`` outwards, innermost last (at most :data:`MAX_FRAMES`)."""
    frames: list[dict[str, Any]] = []
    f: Any = frame
    while f is not None and len(frames) < MAX_FRAMES:
        frames.append(_frame_record(f.f_code, f.f_lineno))
        f = f.f_back
    frames.reverse()
    return frames


def thread_stacks() -> list[dict[str, Any]]:
    """Every thread's Python stack: ``{"thread", "name", "frames": [{file, line, function,
    user}]}`` with the innermost frame last (the probe's own thread left out)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        out.append({"thread": ident, "name": names.get(ident, "?"), "frames": frame_stack(frame)})
    out.sort(key=lambda t: (t["name"] != "MainThread", str(t["name"])))
    return out


def flight_recorder() -> dict[str, Any] | None:
    """PyTorch's Flight Recorder of this process as JSON (None when torch.distributed is not in
    use, or this torch cannot dump it)."""
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        import torch._C._distributed_c10d as c10d

        text = c10d._dump_fr_trace_json(includeCollectives=True)  # type: ignore[attr-defined]
    except Exception:  # a torch without it, or a process group that cannot say
        return None
    try:
        doc = json.loads(text if isinstance(text, str) else bytes(text).decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def p2p_call(frame: Any) -> dict[str, Any] | None:
    """The point-to-point call the stack from ``frame`` is blocked in (the innermost frame of
    torch.distributed's ``send`` or ``recv``, the keys of ``launchers.p2p.PEER_KEYS``):
    ``{"op", "peer", "group", "sizes"}`` — the peer as a global rank (``p2p.peer_of``), the
    group's name (the default group's too), the tensor's sizes. None when it is in none, or its
    arguments cannot be read.

    Why from the frame: gloo's Flight Recorder records no point-to-point op (PyTorch 2.13,
    measured: docs/hangs.md), so the call's own arguments are the only record of whom a rank
    waits for. Read, never called: a tensor's ``shape`` and a group's ``group_name``."""
    from rankscope.launchers.p2p import PEER_KEYS, peer_of

    f: Any = frame
    while f is not None:
        code = f.f_code
        if code.co_name in PEER_KEYS and Path(code.co_filename).name == COLLECTIVES_MODULE:
            break
        f = f.f_back
    if f is None:
        return None
    try:
        args = dict(f.f_locals)
        op = f.f_code.co_name
        group = args.get("group") or sys.modules["torch.distributed"].group.WORLD
        tensor = args.get("tensor")
        return {
            "op": op,
            "peer": peer_of(op, (), args),
            "group": "" if group is None else str(group.group_name),  # "": none initialised
            "sizes": None if tensor is None else [list(tensor.shape)],
        }
    except Exception:  # a torch whose call has other arguments: no record, never an error
        return None


#: The token of the answer a rank writes by itself when it gets SIGTERM (torchrun ending the
#: survivors of a failed rank): where it was when the job ended.
TERMINATED_TOKEN = "terminated"
#: Seconds the probe's thread leaves the main thread to answer SIGTERM itself (from its signal
#: handler, :func:`answer_terminated`: exactly where it was) before it answers in its place (the
#: main thread is blocked in C code, a collective, where the handler cannot run: its stack
#: stays where it is meanwhile).
TERMINATED_ANSWER_WAIT_S = 1.0
#: Seconds after that answer that a main thread still blocked in the same collective call may
#: keep the rank alive. SIGTERM's own action ends a process at once; the runtime's handler, which
#: flushes the profiler, holds it back, and cannot run while the main thread waits in C code.
#: In a collective that can no longer complete (every rank of a desync waits in one) it would
#: never run: the rank would live on until torchrun's SIGKILL, 30 s later. So the probe ends it
#: then, with SIGTERM's status (128 + 15), as SIGTERM would have.
BLOCKED_EXIT_S = 5.0
#: torch.distributed's module whose functions are the collectives a user calls.
COLLECTIVES_MODULE = "distributed_c10d.py"
#: What the rank's log says when the probe ends it so.
BLOCKED_EXIT_LINE = (
    "rankscope: rank {rank} got SIGTERM while blocked in {where}, which cannot end: "
    "ending it (its profiler window in progress is not written)"
)

#: Tries of the SIGTERM handler's answer (another signal's handler may raise while it writes).
ANSWER_TRIES = 3

_ACTIVE: list[HangProbe] = []
"""The probe of this process, once started (for the SIGTERM handler)."""


def answer_terminated(frame: Any) -> None:
    """Called by the rank's SIGTERM handler with the frame it interrupted: the main thread
    answers where it is, before it unwinds (the probe's thread would see it already elsewhere)."""
    frames = frame_stack(frame)
    for probe in _ACTIVE:
        for _ in range(ANSWER_TRIES):
            try:
                probe.answer_once(frames, call_frame=frame)
                break
            except Exception:  # another handler raised while we wrote: write again
                # (a DataLoader's SIGCHLD handler raises when torchrun's SIGTERM ends its worker;
                # the rank ends on SIGTERM all the same)
                continue


def _sigterm_wakeup() -> int | None:
    """The read end of a pipe on which Python's C-level signal handler writes each signal
    number (``signal.set_wakeup_fd``) — it does so even while the main thread is blocked in C
    code (a collective), when the Python-level handler cannot run yet. None when this is not
    the main thread or someone else (asyncio) uses the wakeup fd already."""
    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        return None
    if old != -1:
        signal.set_wakeup_fd(old)  # theirs: left alone
        os.close(r)
        os.close(w)
        return None
    return r


class HangProbe:
    """The rank side of hang diagnosis (see the module docstring): one per rank process."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        on_trigger: Callable[[Any], None] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.on_trigger = on_trigger
        """Called (in the probe's thread) with each new ``RUN/trigger.json`` document."""
        self._trigger_text: str | None = None
        self.rank = rank
        self.dir = rundir.rank_dir(run_dir, rank)
        self.steps = 0
        self.last_step_ns: int | None = None
        self.records: deque[tuple[int, int, int, int, int]] = deque()
        """Step records not yet in the step log (appended by the training thread, taken by
        whoever flushes: a deque's ``append`` / ``popleft`` are atomic, no lock on the step)."""
        self._flush_lock = threading.RLock()
        self.step_log = self.dir / step_log.STEP_LOG_FILE
        self._written_ns = 0
        self._written_steps = -1
        self._answered: str | None = None
        self._lock = threading.RLock()
        self._ended = threading.Event()
        """The rank answered TERMINATED_TOKEN (it is ending: the first answer stands)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stacks_file: Any = None
        self._wake: int | None = None
        self.stack_signal = False
        """faulthandler answers STACK_SIGNAL in this process (else the launcher must not send
        it: its default action ends the process)."""

    def start(self) -> None:
        """Register the stack signal, write the first progress record, start the thread."""
        with contextlib.suppress(OSError, ValueError, RuntimeError, AttributeError):
            import faulthandler

            self._stacks_file = open(self.dir / rundir.STACKS_FILE, "a")  # noqa: SIM115
            faulthandler.register(STACK_SIGNAL, file=self._stacks_file, all_threads=True)
            self.stack_signal = True
        self._wake = _sigterm_wakeup()
        self._write_progress()
        self._thread = threading.Thread(
            target=self._watch, name="rankscope-hang-probe", daemon=True
        )
        self._thread.start()
        _ACTIVE[:] = [self]

    def beat(
        self,
        steps: int,
        end_ns: int | None = None,
        wait_ns: int = step_log.UNKNOWN,
        cpu_ns: int = step_log.UNKNOWN,
        runq_ns: int = step_log.UNKNOWN,
    ) -> None:
        """A step ended (``steps`` done in all, at ``end_ns``, ns since the epoch; now when
        None; ``wait_ns`` of it in collectives; the training thread's CPU and run-queue ns so
        far, cumulative): kept for the step log, and progress.json
        written now when BEAT_INTERVAL_S passed since the last write, else by the probe's
        thread within that time (so the last step before a hang is always on disk)."""
        now = time.time_ns() if end_ns is None else end_ns
        self.records.append((steps, now, wait_ns, cpu_ns, runq_ns))
        self.steps = steps
        self.last_step_ns = now
        if now - self._written_ns >= BEAT_INTERVAL_S * 1e9 or steps == 1:
            self._write_progress()

    def died_of(self, exc: BaseException, timed_out: bool = False) -> None:
        """The rank's own error ends it: answer as it does to SIGTERM (``terminated.json``),
        with the main thread where the error was raised. On a multi-node job a rank whose peer
        died usually fails this way (its collective's connection closes) before any SIGTERM
        reaches it: the answer says which collective it was waiting in."""
        error = {"type": type(exc).__name__, "message": str(exc)[:500]}
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        frame = tb.tb_frame if tb is not None else None
        self.answer_once(traceback_frames(exc), timed_out, error, call_frame=frame)

    def stop(self) -> None:
        """The rank ends: the step log completed, a last progress record, the thread stopped."""
        self._stop.set()
        self.flush_steps()
        self._write_progress()

    def flush_steps(self) -> None:
        """Append the step records kept so far to the step log (one write; a failed write
        drops them: the training never waits or fails for it)."""
        with self._flush_lock:
            n = len(self.records)
            if n == 0:
                return
            block = [self.records.popleft() for _ in range(n)]
            with contextlib.suppress(OSError):
                step_log.append(self.step_log, block)

    def _write_progress(self) -> None:
        self._written_ns = time.time_ns()
        self._written_steps = self.steps
        doc = {
            "rank": self.rank,
            "pid": os.getpid(),
            "steps": self.steps,
            "last_step_ns": self.last_step_ns,
            "written_ns": self._written_ns,
            "stack_signal": self.stack_signal,
        }
        with contextlib.suppress(OSError):
            rundir.write_json_atomic(self.dir / rundir.PROGRESS_FILE, doc)

    def _watch(self) -> None:
        request = self.run_dir / rundir.HANG_REQUEST
        while not self._stop.is_set():
            if self._terminated() and not self._ended.wait(TERMINATED_ANSWER_WAIT_S):
                self.answer_once(None)  # the main thread is blocked in C: where it is now
                self._end_if_blocked_in_collective()
            if self._stop.is_set():
                break
            self.flush_steps()
            self._look_for_trigger()
            if (
                self._written_steps != self.steps
                and time.time_ns() - self._written_ns >= BEAT_INTERVAL_S * 1e9
            ):
                self._write_progress()  # steps the main thread did not write (throttled)
            try:
                token = request.read_text().strip()
            except OSError:
                continue
            if token and token != self._answered:
                self._answered = token
                self.answer(token)

    def _end_if_blocked_in_collective(self) -> None:
        """After SIGTERM: end the process when its main thread stays in the same collective
        call for BLOCKED_EXIT_S (its SIGTERM handler cannot run; see BLOCKED_EXIT_S)."""
        ident = threading.main_thread().ident
        if ident is None:
            return
        frame = sys._current_frames().get(ident)
        if frame is None or Path(frame.f_code.co_filename).name != COLLECTIVES_MODULE:
            return
        lasti = frame.f_lasti
        deadline = time.monotonic() + BLOCKED_EXIT_S
        while time.monotonic() < deadline:
            if self._stop.wait(REQUEST_POLL_S):
                return
            now = sys._current_frames().get(ident)
            if now is not frame or now.f_lasti != lasti:
                return  # it moved: the collective ended, the handler runs
        where = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
        print(BLOCKED_EXIT_LINE.format(rank=self.rank, where=where), file=sys.stderr, flush=True)
        self.flush_steps()  # os._exit skips the rank's end: its last steps are kept here
        os._exit(128 + signal.SIGTERM)

    def _look_for_trigger(self) -> None:
        """Hand a new ``RUN/trigger.json`` to ``on_trigger`` (its text changed since the last
        look; unreadable or half-written JSON waits for the next look)."""
        if self.on_trigger is None:
            return
        try:
            text = (self.run_dir / rundir.TRIGGER_FILE).read_text()
        except OSError:
            return
        if text == self._trigger_text:
            return
        try:
            doc = json.loads(text)
        except ValueError:
            return
        self._trigger_text = text
        with contextlib.suppress(Exception):  # never break the job for it
            self.on_trigger(doc)

    def _terminated(self) -> bool:
        """Wait up to REQUEST_POLL_S; True when SIGTERM arrived meanwhile (the wakeup pipe)."""
        if self._wake is None:
            self._stop.wait(REQUEST_POLL_S)
            return False
        import select

        ready, _, _ = select.select([self._wake], [], [], REQUEST_POLL_S)
        if not ready:
            return False
        try:
            got = os.read(self._wake, 64)
        except OSError:
            return False
        return int(signal.SIGTERM) in got

    def answer_once(
        self,
        main_frames: list[dict[str, Any]] | None,
        timed_out: bool = False,
        error: dict[str, str] | None = None,
        call_frame: Any = None,
    ) -> None:
        """The rank's own answer as it ends (:data:`TERMINATED_TOKEN`, in ``terminated.json``),
        written once: by the SIGTERM handler, the probe's thread, or the main thread whose own
        error ends it (a collective that timed out, a peer that vanished), whichever comes
        first (``main_frames``: where the main thread was, if not now)."""
        with self._lock:
            if self._ended.is_set():
                return
            self.answer(
                TERMINATED_TOKEN, rundir.TERMINATED_DUMP, main_frames, timed_out, error, call_frame
            )
            self._ended.set()

    def answer(
        self,
        token: str,
        name: str = rundir.HANG_DUMP,
        main_frames: list[dict[str, Any]] | None = None,
        timed_out: bool = False,
        error: dict[str, str] | None = None,
        call_frame: Any = None,
    ) -> None:
        """Write ``hang.json`` (or ``name``): stacks, Flight Recorder, progress (the launcher's
        ``token``).

        ``main_frames``: the main thread's stack to write instead of its current one (where it
        was when SIGTERM interrupted it, or where its own ``error`` was raised); ``timed_out``:
        that error was its collective timing out (the analysis counts it as not completed);
        ``call_frame``: the live frame ``main_frames`` were read from (the point-to-point call
        it was blocked in is read from its arguments: :func:`p2p_call`)."""
        self.flush_steps()
        self._write_progress()
        threads = thread_stacks()
        if main_frames is None:
            call_frame = sys._current_frames().get(threading.main_thread().ident or 0)
        if main_frames is not None:
            main = {"thread": threading.main_thread().ident, "name": "MainThread"}
            threads = [
                {**main, "frames": main_frames},
                *(t for t in threads if t["name"] != "MainThread"),
            ]
        doc = {
            "token": token,
            "rank": self.rank,
            "pid": os.getpid(),
            "time_ns": time.time_ns(),
            "steps": self.steps,
            "last_step_ns": self.last_step_ns,
            "threads": threads,
            "flight_recorder": flight_recorder(),
            "p2p_call": None if call_frame is None else p2p_call(call_frame),
            "timed_out": timed_out,
            "error": error,
        }
        with self._lock, contextlib.suppress(OSError):
            rundir.write_json_atomic(self.dir / name, doc)
