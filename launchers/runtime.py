"""The per-rank runtime: profiler windows, step hooks and clock-sync inside every rank.

:func:`start` is called by :mod:`rankscope.launchers.rank` before the user's script runs. It

* starts ``torch.profiler.profile`` with the schedule from :data:`rundir.ENV_PROFILER`
  (activities CPU, plus CUDA when available);
* steps it from a global optimizer-step post hook — once per iteration even with several
  optimizers (only the first optimizer that steps drives it) — or from :func:`step`
  (``rankscope.step()``) for loops without an optimizer; once :func:`step` is called the hook
  stops stepping;
* wraps ``torch.distributed.init_process_group`` so that, right after it returns, the clock-sync
  group is created and a first exchange runs (:mod:`rankscope.launchers.clocksync`);
* writes each finished window at once as ``ranks/NNNNN/window-KKK.json.gz`` (temporary file,
  gzip, rename), runs a clock-sync exchange, and rewrites ``meta.json``;
* on exit stops the profiler so a window in progress is flushed, and records an uncaught
  exception (type and one-line message) in ``meta.json`` for the launcher;
* records what the trace cannot say per recorded step in ``meta.json``: the samples given to
  ``rankscope.step(samples=N)`` (``step_samples``) and, with ``with_flops``, the FLOPs torch
  counted (``step_flops``, summed from the profiler's events when the window ends: the exported
  trace does not carry them). Keys are the profiler step numbers (``ProfilerStep#N``) as text.
  Also, per recorded step, what the step cost the main thread (``step_cpu``: wall time, the
  thread's CPU time and the time it was runnable but waiting for a core, from
  :data:`THREAD_SCHEDSTAT`): a rank slowed because other processes took its core says so.

Outside a rankscope run (no :data:`rundir.ENV_RUN_DIR`), :func:`step` is a no-op.

The rank's state and lifecycle (start, close, failure capture, clock sync) are here; when the
profiler steps (and what each step cost) is in ``stepping.py``, exporting and writing windows in
``windows.py``: both are mixins of :class:`RankRuntime`, whose names this module re-exports.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import platform
import re
import sys
import threading
import time
import traceback
import weakref
from pathlib import Path
from typing import Any

from rankscope import __version__
from rankscope.atomic import output_error
from rankscope.launchers import clocksync, collective_wait, p2p, rundir
from rankscope.launchers.hang_probe import (
    HangProbe,
    innermost_user_frame,
    is_collective_timeout,
)
from rankscope.launchers.profiler import make_profile
from rankscope.launchers.spec import LauncherKind, ProfilerSettings, check_samples
from rankscope.launchers.stepping import DEFERRED_SIGNALS as DEFERRED_SIGNALS
from rankscope.launchers.stepping import STEP_CPU_KEY as STEP_CPU_KEY
from rankscope.launchers.stepping import THREAD_SCHEDSTAT as THREAD_SCHEDSTAT
from rankscope.launchers.stepping import TRACE_METADATA_KEY as TRACE_METADATA_KEY
from rankscope.launchers.stepping import RankStepping as RankStepping
from rankscope.launchers.stepping import _thread_times as _thread_times
from rankscope.launchers.stepping import signals_deferred as signals_deferred
from rankscope.launchers.triggers import RankTriggers, Trigger
from rankscope.launchers.windows import EXPORT_TMP_PREFIX as EXPORT_TMP_PREFIX
from rankscope.launchers.windows import GZIP_LEVEL as GZIP_LEVEL
from rankscope.launchers.windows import MAX_ERROR_CHARS as MAX_ERROR_CHARS
from rankscope.launchers.windows import WRITER_TIMEOUT_S as WRITER_TIMEOUT_S
from rankscope.launchers.windows import RankWindows as RankWindows
from rankscope.launchers.windows import WindowWriter as WindowWriter
from rankscope.launchers.windows import _write_failure_cause as _write_failure_cause

#: Index of a window file name (rundir.WINDOW_FORMAT).
WINDOW_INDEX_RE = re.compile(r"window-(\d+)\.json\.gz")
#: torchrun's count of restarts of the worker group (0 in the first attempt).
TORCHRUN_RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
#: torchrun tells each worker where to write its error file (read for its failure summary).
TORCHELASTIC_ERROR_ENV = "TORCHELASTIC_ERROR_FILE"

_runtime: RankRuntime | None = None


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM (the launcher stopping this rank), not a failure."""


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class RankRuntime(RankStepping, RankWindows, RankTriggers):
    """State of the profiler in one rank (one instance per process, see :func:`start`)."""

    def __init__(
        self,
        run_dir: Path,
        settings: ProfilerSettings,
        script: str = "",
        script_args: list[str] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.settings = settings
        self.script = script
        self.script_args = list(script_args or [])
        self.rank = _env_int("RANK", 0)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
        self.dir = rundir.rank_dir(run_dir, self.rank)
        self.prof: Any = None
        self.window = 0
        self.manual = False
        self.recording = False
        self.exiting = False
        self.external = False
        self.sync: clocksync.ClockSync | None = None
        self._recording_actions: tuple[Any, ...] = ()
        self._save_action: Any = None
        self._step_depth = 0
        self._step_due = False
        self._step_mark: tuple[int, int, int] | None = None
        """(wall ns, thread CPU ns, run-queue ns) when the current step began."""
        self._schedstat: int | None = None
        """File descriptor of the training thread's :data:`THREAD_SCHEDSTAT` (None: none)."""
        self._lead_settled = False
        self._after_lead: weakref.ref[Any] | None = None
        self._lead_optimizer: weakref.ref[Any] | None = None
        self.lock = threading.RLock()
        self._triggers: list[Trigger] = []  # accepted extra windows (launchers/triggers.py)
        self._base_schedule: Any = None
        self._actions: dict[str, Any] = {}
        """Guards ``meta`` and meta.json between the main thread and the writer thread."""
        self.disabled = False
        """The rank's folder could not be created: the training runs without profiling."""
        self._warned: set[str] = set()
        self.writer = WindowWriter(self._write_window)
        self.probe = HangProbe(run_dir, self.rank, on_trigger=self.take_trigger)
        """Progress for the launcher, and the answer when the job looks hung."""
        self.meta: dict[str, Any] = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "host": platform.node(),
            "pid": os.getpid(),
            "device": "cpu",
            "backend": None,
            "versions": {"python": platform.python_version(), "rankscope": __version__},
            "run_id": run_dir.name,
            "profiler": settings.to_dict(),
            "started_ns": time.time_ns(),
            "ended_ns": None,
            "steps": 0,
            "windows": [],
            "step_samples": {},
            STEP_CPU_KEY: {},
            "clock": {
                "domain": clocksync.clock_domain(),
                "leader_rank": None,
                "reference_rank": clocksync.REFERENCE_RANK,
                "samples": [],
            },
        }

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Describe the rank, hook torch, and start the profiler."""
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.profiler import ProfilerAction, ProfilerActivity, schedule

        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # never harm the job: it runs on, unprofiled
            self.disabled = True
            self.warn(f"{output_error(self.dir, exc)}; this rank runs without profiling")
            return
        self._continue_previous_attempt()
        self.probe.start()
        cuda = torch.cuda.is_available()
        versions = self.meta["versions"]
        versions.update(torch=torch.__version__, nccl=None, cuda=torch.version.cuda, driver=None)
        if cuda:
            self.meta["device"] = torch.cuda.get_device_name(
                self.local_rank % max(1, torch.cuda.device_count())
            )
            try:
                versions["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
            except Exception:  # NCCL missing from this build
                versions["nccl"] = None
        self.write_meta()

        self._recording_actions = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
        self._save_action = ProfilerAction.RECORD_AND_SAVE
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        s = self.settings
        experimental = self._experimental_config()
        self._base_schedule = schedule(
            wait=s.wait, warmup=s.warmup, active=s.active, repeat=s.repeat, skip_first=s.skip_first
        )
        a = ProfilerAction
        self._actions = {"warmup": a.WARMUP, "record": a.RECORD, "save": a.RECORD_AND_SAVE}
        self.prof = make_profile(
            activities=activities,
            schedule=self._schedule,  # the settings' schedule, plus triggered windows
            on_trace_ready=self._on_trace_ready,
            record_shapes=s.record_shapes,
            profile_memory=s.profile_memory,
            with_stack=s.with_stack or experimental is not None,
            experimental_config=experimental,
            with_flops=s.with_flops,
        )
        register_optimizer_step_post_hook(self._on_optimizer_step)
        self._wrap_init_process_group()
        try:
            p2p.install()
        except Exception as exc:  # a torch without the hooks it needs: profile without peers
            self.meta["p2p_error"] = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
        try:
            collective_wait.install()
        except Exception as exc:  # a torch without them: the step log says UNKNOWN waits
            self.meta["wait_error"] = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
        self.prof.start()
        try:  # the thread that starts the profiler is the one that trains and steps
            self._schedstat = os.open(THREAD_SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._schedstat = None
        self._step_mark = _thread_times(self._schedstat)
        self._tag_window()
        atexit.register(self.close)
        if self.rank == 0:
            self._describe_external_run()

    def _describe_external_run(self) -> None:
        """Under the user's own launcher there is no run.json yet: rank 0 writes one."""
        if (self.run_dir / rundir.RUN_JSON).exists():
            return
        self.external = True
        record = rundir.RunRecord(
            run_id=self.run_dir.name,
            name=self.run_dir.name,
            launcher=LauncherKind.EXTERNAL,
            command=[sys.executable, *sys.orig_argv[1:]],
            torchrun_args=[],
            script=self.script,
            script_args=list(self.script_args),
            world_size=self.world_size,
            nnodes=None,
            nproc_per_node=self.local_world_size,
            profiler=self.settings.to_dict(),
            state=rundir.RunState.RUNNING,
        )
        try:
            record.write(self.run_dir)
        except OSError as exc:
            self.warn(str(output_error(self.run_dir / rundir.RUN_JSON, exc)))

    def _finish_external_run(self) -> None:
        """Rank 0 records the end of an external run (as rank 0 saw it)."""
        error = self.meta.get("error")
        if error is None:
            state, code = rundir.RunState.COMPLETED, 0
        elif error.get("interrupted"):
            state, code = rundir.RunState.INTERRUPTED, error.get("exit_code")
        else:
            state, code = rundir.RunState.FAILED, error.get("exit_code")
        try:
            rundir.update_run(
                self.run_dir, state=str(state), exit_code=code, ended_at=rundir.utc_now()
            )
        except Exception as exc:
            self.warn(f"cannot update run.json: {exc}")

    def _continue_previous_attempt(self) -> None:
        """After a torchrun restart (``--max-restarts``), keep the earlier attempts' windows.

        Window numbers continue where the previous attempt stopped, so no file is overwritten;
        each window records its ``attempt`` (profiler steps restart from 0 in every attempt).
        """
        self.meta["attempt"] = _env_int(TORCHRUN_RESTART_ENV, 0)
        try:
            previous = rundir.read_json(self.dir / rundir.META_JSON)
        except (OSError, ValueError):
            return
        if not isinstance(previous, dict):
            return
        self.meta["windows"] = list(previous.get("windows", []))
        # step numbers restart in every attempt: the earliest attempt's value of a step is kept,
        # as the merge keeps the earliest attempt's ProfilerStep range
        for key in ("step_samples", "step_flops", STEP_CPU_KEY):
            if isinstance(previous.get(key), dict):
                self.meta[key] = dict(previous[key])
        self.meta["clock"]["samples"] = list(previous.get("clock", {}).get("samples", []))
        # a trigger.json an earlier attempt saw is not taken again (steps restart from 0)
        self.meta["triggers"] = list(previous.get("triggers") or [])
        self.meta["previous_errors"] = [*previous.get("previous_errors", [])]
        if previous.get("error"):
            self.meta["previous_errors"].append(previous["error"])
        # (the regex, not a slice of the name: window 1000 has four digits)
        existing = [
            int(m.group(1))
            for p in self.dir.glob(rundir.WINDOW_GLOB)
            if (m := WINDOW_INDEX_RE.fullmatch(p.name))
        ]
        self.window = (
            max([w.get("index", -1) for w in self.meta["windows"]] + existing, default=-1) + 1
        )

    def close(self) -> None:
        """Stop the profiler (flushing a window in progress) and write the final meta.json."""
        if self.prof is not None and not self.exiting:
            self.exiting = True
            try:
                self.prof.stop()
            except Exception as exc:  # never mask the user's own error
                self.meta["flush_error"] = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
        if self.writer.finish():
            self._remove_exports()
        if self.sync is not None:
            self.sync.close()
        if self._schedstat is not None:
            with contextlib.suppress(OSError):
                os.close(self._schedstat)
            self._schedstat = None
        self.meta["ended_ns"] = time.time_ns()
        self.probe.stop()
        self.write_meta()
        if self.external:
            self.external = False
            self._finish_external_run()

    def record_error(self, exc: BaseException) -> None:
        """Record an uncaught exception of the user's script (read by the launcher)."""
        interrupted = isinstance(exc, KeyboardInterrupt | Terminated)
        message = str(exc).strip().splitlines()
        tb = traceback.format_exception(exc)
        self.meta["error"] = {
            "rank": self.rank,
            "type": type(exc).__name__,
            "message": (message[0] if message else "")[:MAX_ERROR_CHARS],
            "exit_code": exc.code if isinstance(exc, SystemExit) else (130 if interrupted else 1),
            "interrupted": interrupted,
            "time_ns": time.time_ns(),
            "signal": "SIGINT"
            if isinstance(exc, KeyboardInterrupt)
            else ("SIGTERM" if isinstance(exc, Terminated) else None),
            "traceback": "".join(tb[-3:])[-2000:],
            "user_frame": innermost_user_frame(exc),
        }
        if not interrupted and is_collective_timeout(str(exc)):
            # a hang seen from a waiting rank: say where this rank waited (and the collectives
            # it entered) now, while its process group still answers; the launcher reads it
            self.meta["error"]["collective_timeout"] = True
            self.probe.died_of(exc, timed_out=True)
        self.write_meta()
        if not interrupted:
            self.probe.died_of(exc)  # once: after a timeout's answer, nothing more
            self._write_torchelastic_error(exc, "".join(tb))

    def _write_torchelastic_error(self, exc: BaseException, tb: str) -> None:
        """Also tell torchrun (its error file), so its summary names the right root cause."""
        path = os.environ.get(TORCHELASTIC_ERROR_ENV)
        if not path:
            return

        record = {
            "message": {
                "message": f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS],
                "extraInfo": {"py_callstack": tb, "timestamp": str(int(time.time()))},
            }
        }
        with contextlib.suppress(OSError):
            rundir.write_json_atomic(Path(path), record)

    def write_meta(self) -> None:
        """Rewrite ``meta.json`` atomically (after every window and at the end).

        A failed write never reaches the training: one line on stderr (once per cause), the
        previous meta.json untouched.
        """
        if self.disabled:
            return
        try:
            with self.lock:
                rundir.write_json_atomic(self.dir / rundir.META_JSON, self.meta)
        except OSError as exc:
            self.warn(f"{output_error(self.dir / rundir.META_JSON, exc)}")

    def warn(self, message: str) -> None:
        """One line on stderr, ``rankscope: rank N: …`` (the same line only once per rank)."""
        if message in self._warned:
            return
        self._warned.add(message)
        print(f"rankscope: rank {self.rank}: {message} (training continues)", file=sys.stderr)

    def _experimental_config(self) -> Any:
        """torch's ``_ExperimentalConfig`` recording Python GC events (``--record-gc``), or None
        (not asked, or a torch without ``record_python_gc_info``: said in meta.json, the job
        runs on without them)."""
        if not self.settings.record_gc:
            return None
        try:
            from torch.profiler import _ExperimentalConfig

            return _ExperimentalConfig(record_python_gc_info=True)
        except (ImportError, TypeError) as exc:
            self.meta["record_gc_error"] = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
            return None

    # ------------------------------------------------------------------ distributed
    def _wrap_init_process_group(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        from torch.distributed import distributed_c10d

        original = distributed_c10d.init_process_group
        if getattr(original, "_rankscope_wrapped", False):
            return

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self._after_init()
            return result

        init_process_group._rankscope_wrapped = True  # type: ignore[attr-defined]
        distributed_c10d.init_process_group = init_process_group
        dist.init_process_group = init_process_group

    def _after_init(self) -> None:
        """Right after the user's ``init_process_group``: describe the group, first sync."""
        import torch.distributed as dist

        try:
            self.rank = dist.get_rank()
            self.world_size = dist.get_world_size()
            self.meta.update(
                rank=self.rank, world_size=self.world_size, backend=str(dist.get_backend())
            )
            self.sync = clocksync.setup()
            self.meta["clock"].update(self.sync.describe())
        except Exception as exc:
            self.meta["clock"]["error"] = f"setup: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
            self.sync = None
        self._sync("init")
        self.write_meta()

    def _sync(self, phase: str) -> None:
        """One clock-sync exchange (collective); after a failure, syncing stops for good."""
        if self.sync is None or self.sync.failed is not None:
            return
        try:
            samples = clocksync.exchange(self.sync, phase)
        except Exception as exc:
            self.sync.failed = f"{phase}: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
            self.meta["clock"]["error"] = self.sync.failed
            return
        self.meta["clock"]["samples"].extend(samples)


def start(script: str = "", script_args: list[str] | None = None) -> RankRuntime | None:
    """Start the runtime in this rank if it runs under rankscope (idempotent).

    ``script``/``script_args`` (what the rank will run) are recorded in the run.json that rank 0
    writes when the user's own launcher started the ranks.
    """
    global _runtime
    if _runtime is not None:
        return _runtime
    run_dir = os.environ.get(rundir.ENV_RUN_DIR)
    if not run_dir:
        return None
    text = os.environ.get(rundir.ENV_PROFILER)
    settings = ProfilerSettings.from_json(text) if text else ProfilerSettings()
    runtime = RankRuntime(Path(run_dir), settings, script, script_args)
    runtime.start()
    _runtime = runtime
    return runtime


def current() -> RankRuntime | None:
    """The runtime of this process (None outside a rankscope run)."""
    return _runtime


def step(samples: float | None = None) -> None:
    """``rankscope.step(samples=N)``: advance the profiler by one step; ``samples`` (or tokens)
    processed in the step that ends is recorded for the throughput KPI. A no-op outside a
    rankscope run (``samples`` is checked either way: a number > 0, or None)."""
    if samples is not None:
        samples = check_samples(samples)
    if _runtime is not None:
        _runtime.step(samples)
