"""Writing a rank's finished profiler windows without ever harming the training.

The window half of :class:`~rankscope.launchers.runtime.RankRuntime` (a mixin: the state lives
in the runtime): when a window ends, the trace is exported at once (the profiler's data is only
valid then), the FLOPs torch counted are summed per step (``step_flops``), and the compression
and the fsync'd writes go to one background thread (:class:`WindowWriter`) so they do not hold
up the training step: ``ranks/NNNNN/window-KKK.json.gz`` (temporary file, gzip, rename). A write
that fails (full disk, read-only, quota) is one line on stderr and the job runs on.
Separate from ``runtime.py`` because the export, the writer thread and the failure handling of
the files are one concern, apart from when steps end and how the rank starts and stops.
"""

from __future__ import annotations

import bisect
import contextlib
import gzip
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.atomic import write_cause
from rankscope.launchers import rundir

if TYPE_CHECKING:
    from rankscope.launchers.spec import ProfilerSettings
    from rankscope.launchers.triggers import Trigger

#: gzip level of window files: 3 is ~3x faster than 9 for ~10% larger Kineto JSON.
GZIP_LEVEL = 3
#: Seconds the end of a rank waits for queued windows to be written.
WRITER_TIMEOUT_S = 300.0
#: Prefix of the temporary Chrome-trace export next to the window files.
EXPORT_TMP_PREFIX = ".export-"
#: Longest error message kept in meta.json, in characters.
MAX_ERROR_CHARS = 500


class WindowWriter:
    """One background thread that compresses and writes finished windows in order.

    Exporting must happen in ``on_trace_ready`` (the profiler's data lives until the next
    window), but gzip and two fsync'd writes need not hold up the training step that ends the
    window: they cost ~10 ms of I/O wait per window here. A window queued but not yet written
    when the process is SIGKILLed is lost (its exported JSON stays as a dot-file); every other
    exit path waits for the queue in :meth:`finish`.
    """

    def __init__(self, write: Callable[[Path, dict[str, Any]], None]) -> None:
        self._write = write
        self._queue: queue.Queue[tuple[Path, dict[str, Any]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, tmp: Path, window: dict[str, Any]) -> None:
        """Queue an exported window (``tmp``) for compression and writing."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rankscope-writer", daemon=True)
            self._thread.start()
        self._queue.put((tmp, window))

    def finish(self, timeout_s: float = WRITER_TIMEOUT_S) -> bool:
        """Write everything queued, then stop the thread (waits at most ``timeout_s`` s).

        Returns False when the thread is still writing after ``timeout_s``.
        """
        if self._thread is None:
            return True
        self._queue.put(None)
        self._thread.join(timeout_s)
        done = not self._thread.is_alive()
        self._thread = None
        return done

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            self._write(*item)


def _write_failure_cause(folder: Path) -> str:
    """Why a write into ``folder`` failed when the writer did not say (Kineto only logs it)."""
    import errno

    try:
        st = os.statvfs(folder)
    except OSError as exc:
        return f"cannot write ({write_cause(exc)})"
    if st.f_flag & os.ST_RDONLY:
        code = errno.EROFS
    elif st.f_bavail == 0 or st.f_favail == 0:
        code = errno.ENOSPC
    elif not os.access(folder, os.W_OK | os.X_OK):
        code = errno.EACCES
    else:
        return "the profiler could not write it (see its ERROR line above)"
    return f"cannot write ({write_cause(OSError(code, os.strerror(code)))})"


class RankWindows:
    """Exporting and writing the windows of one rank (mixed into
    :class:`~rankscope.launchers.runtime.RankRuntime`, which sets every attribute below and
    provides the methods declared for type checking)."""

    window: int
    recording: bool
    exiting: bool
    disabled: bool
    settings: ProfilerSettings
    meta: dict[str, Any]
    dir: Path
    lock: threading.RLock
    writer: WindowWriter

    if TYPE_CHECKING:

        def warn(self, message: str) -> None: ...

        def write_meta(self) -> None: ...

        def _sync(self, phase: str) -> None: ...

        def _trigger_of(self, last_step: int) -> Trigger | None: ...

    def _remove_exports(self) -> None:
        """Remove what a failed export left in the rank's folder (the profiler's own temporary
        ``.export-KKK.json.tmp`` included); called once the writer thread has stopped."""
        if self.disabled:
            return
        for leftover in self.dir.glob(f"{EXPORT_TMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                leftover.unlink()

    # ------------------------------------------------------------------ windows
    def _on_trace_ready(self, prof: Any) -> None:
        """A window ended: export it (the profiler's data is only valid now), hand the
        compression and the fsync'd writes to the writer thread, then run a clock sync."""
        index = self.window
        self.window += 1
        self.recording = False
        last_step = prof.step_num - (0 if self.exiting else 1)
        window = {
            "index": index,
            "file": rundir.WINDOW_FORMAT.format(window=index),
            "first_step": max(0, last_step - self.settings.active + 1),
            "last_step": last_step,
            "complete": not self.exiting,
            "attempt": self.meta["attempt"],
        }
        trigger = self._trigger_of(last_step)
        if trigger is not None:  # an extra window the live monitor asked for (issue 30)
            window["first_step"] = trigger.start_step
            window["trigger"] = {"id": trigger.id, "reason": trigger.reason}
        if self.settings.with_flops:
            self._count_flops(prof)
        tmp = self.dir / f"{EXPORT_TMP_PREFIX}{index:03d}.json"
        # Kineto writes ``tmp`` through its own ``tmp.tmp`` and, when that write fails (a full
        # disk), only logs it: the export returns, ``tmp`` is missing, ``tmp.tmp`` stays.
        kineto_tmp = tmp.with_name(tmp.name + ".tmp")
        try:
            prof.export_chrome_trace(str(tmp))
            exported = tmp.exists()
            cause = None if exported else _write_failure_cause(self.dir)
        except Exception as exc:
            exported, cause = False, str(exc)
        if exported:
            self.writer.submit(tmp, window)
        else:
            for leftover in (tmp, kineto_tmp):
                with contextlib.suppress(OSError):
                    leftover.unlink(missing_ok=True)
            self.warn(f"window {index} not written: {self.dir / window['file']}: {cause}")
        if not self.exiting:
            self._sync(f"window-{index:03d}")
            self.write_meta()

    def _count_flops(self, prof: Any) -> None:
        """FLOPs per recorded step of the window that ended (``step_flops``): the sum of torch's
        per-operator counts (``with_flops``) of the operators that start inside the step's
        ``ProfilerStep#N`` range, 0 for a step without any. Never breaks the job."""
        try:
            events = prof.profiler.kineto_results.events()
            steps: list[tuple[int, int, str]] = []
            counted: list[tuple[int, int]] = []
            for ev in events:
                name = ev.name()
                if name.startswith("ProfilerStep#"):
                    number = name[len("ProfilerStep#") :]
                    if number.isdigit():
                        steps.append((ev.start_ns(), ev.start_ns() + ev.duration_ns(), number))
                    continue
                flops = ev.flops()
                if flops:
                    counted.append((ev.start_ns(), int(flops)))
            steps.sort()
            starts = [lo for lo, _, _ in steps]
            totals = {number: 0 for _, _, number in steps}
            for start, flops in counted:
                i = bisect.bisect_right(starts, start) - 1
                if i >= 0 and start < steps[i][1]:
                    totals[steps[i][2]] += flops
        except Exception as exc:
            self.warn(f"FLOPs not counted: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS])
            return
        with self.lock:
            recorded = self.meta.setdefault("step_flops", {})
            for number, total in totals.items():
                recorded.setdefault(number, total)

    def _write_window(self, tmp: Path, window: dict[str, Any]) -> None:
        """In the writer thread: gzip the exported trace, write it atomically, record it."""
        try:
            raw = tmp.read_bytes()
            if not raw.rstrip().endswith(b"}"):  # Kineto renames what it could write, even 0 B
                self.warn(
                    f"window {window['index']} not written: {self.dir / window['file']}: "
                    f"{_write_failure_cause(self.dir)} (the profiler's export is truncated)"
                )
                return
            data = gzip.compress(raw, compresslevel=GZIP_LEVEL)
            rundir.write_bytes_atomic(self.dir / window["file"], data)
        except Exception as exc:
            self.warn(f"window {window['index']} not written: {exc}")
            return
        finally:
            tmp.unlink(missing_ok=True)
        window.update(
            events=raw.count(b'"ph":'),
            bytes=len(data),
            json_bytes=len(raw),
            written_ns=time.time_ns(),
        )
        with self.lock:
            self.meta["windows"].append(window)
        self.write_meta()
