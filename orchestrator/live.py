"""The live line of ``rankscope run``, the changes it notices, and the extra window it asks for.

While the launcher waits for a local job (or follows a Slurm one) it calls
:meth:`LiveMonitor.poll` between its looks. The monitor reads what the ranks appended to their
step logs since the last look (``ranks/NNNNN/steps.bin``, from the byte offset it reached per
rank: a file is never read twice), and

* draws **the live line**: steps done, the job's p50 step time over the last
  :data:`LINE_STEPS` steps, throughput when samples per step are known, the rank the others wait
  for (from the collective waits, where the step log has them), time since start and the ETA
  when ``--total-steps`` says how many steps the run makes — redrawn in place on a terminal,
  a plain line at most every :data:`LOG_LINE_S` in a log;
* **notices a change** (``analysis/compute/step_changes.py``): a lasting rise of the job's step
  time, or one rank drifting behind the others, printed as one line and appended to
  ``RUN/changes.jsonl`` (:data:`~rankscope.launchers.rundir.CHANGES_FILE`);
* **asks for a profile of it**: ``RUN/trigger.json`` (``--trigger on``, at most
  ``--max-triggers`` per run) from a step far enough ahead that every rank's probe sees it
  before it gets there (``launchers/triggers.py``).

Steps whose time is the profiler's (the windows' and each export step) are left out of the
series the changes are judged on; a rise the host's CPU contention explains (the ranks'
run-queue delays from the step logs, the host's stolen time sampled at every look:
:class:`StealClock`) is said as the host's and not profiled. Details and limits: docs/live.md.

Why one module: a look of the monitor — reading the step logs where it left them, judging,
saying, asking for a window — is one loop over one state (the offsets, the baseline's start,
the triggers, the steal samples), and ``rankscope status``'s line reuses its reading and
rendering; the judging itself is the analysis' (``step_changes``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

import numpy as np
from rankscope.analysis.compute import step_changes as sc
from rankscope.launchers import rundir, step_log
from rankscope.launchers.hang_probe import REQUEST_POLL_S
from rankscope.launchers.spec import ProfilerSettings
from rankscope.orchestrator.live_options import LiveOptions, TriggerMode

#: Steps the live line's p50 and slowest rank are taken over (the newest).
LINE_STEPS = 100
#: Seconds between two plain lines when stdout is not a terminal (a log).
LOG_LINE_S = 30.0
#: Seconds the ranks get to see a trigger.json before its first warm-up step: their probes look
#: every REQUEST_POLL_S; four looks allow for threads that wake late on a loaded machine.
TRIGGER_LEAD_S = 4 * REQUEST_POLL_S
#: ... and never fewer steps than this: a rank's probe thread can wake far later than four looks
#: on a loaded machine (a CI run: rank 0 of a Slurm job saw the file after its first warm-up
#: step with the 0.2 s lead, and refused a window the other ranks recorded). Six steps keep the
#: window within the ten steps after the notice that docs/live.md promises (six, the warm-up,
#: and the newest record's age), and give every rank several of its own steps to see the file.
TRIGGER_LEAD_STEPS = 6
#: Seconds between two reads of rank 0's meta.json for the samples per step.
SAMPLES_READ_S = 5.0
#: The kernel's CPU counters (the host's stolen time: :class:`StealClock`).
PROC_STAT = Path("/proc/stat")
#: Samples of the stolen time kept (one a look: 0.1 s locally, hours of them).
STEAL_SAMPLES = 100_000


class RankSeries:
    """One rank's step log as read so far: the byte offset reached, and the records by step
    (``cpu_ns`` / ``runq_ns``: the training thread's cumulative counters at each step's end,
    :data:`~rankscope.launchers.step_log.UNKNOWN` where not told)."""

    FIELDS = ("end_ns", "wait_ns", "cpu_ns", "runq_ns")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.layout: step_log.Layout | None = None
        """The step log's version, once its first 8 bytes are written."""
        self.end_ns = np.zeros(1024, dtype=np.int64)
        self.wait_ns = np.full(1024, step_log.UNKNOWN, dtype=np.int64)
        self.cpu_ns = np.full(1024, step_log.UNKNOWN, dtype=np.int64)
        self.runq_ns = np.full(1024, step_log.UNKNOWN, dtype=np.int64)
        self.count = 0
        """Steps known (records 1 … count)."""

    def read_new(self) -> None:
        """Read the whole records appended since the last read (none when the file is absent)."""
        try:
            with self.path.open("rb") as f:
                if self.layout is None:
                    self.layout = step_log.layout_of(f.read(len(step_log.MAGIC)))
                    if self.layout is None:
                        return
                    self.offset = self.layout.header
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        recs = step_log.decode(data, self.layout)
        if len(recs) == 0:
            return
        self.offset += len(recs) * self.layout.record_size
        top = int(recs["steps"].max())
        if top > len(self.end_ns):
            size = max(top, 2 * len(self.end_ns))
            for name in self.FIELDS:
                old = getattr(self, name)
                grown = np.full(size, 0 if name == "end_ns" else step_log.UNKNOWN, np.int64)
                grown[: self.count] = old[: self.count]
                setattr(self, name, grown)
        idx = recs["steps"] - 1
        ok = idx >= 0
        for name in self.FIELDS:
            getattr(self, name)[idx[ok]] = recs[name][ok]
        self.count = max(self.count, top)


class StealClock:
    """The host's stolen time, sampled at every look of the monitor (``/proc/stat``'s ``cpu``
    line, ``steal``: the time the hypervisor ran other work while this VM's CPUs wanted to
    run), so that the steps' share of it can be told afterwards (:meth:`fraction`). Read by
    the monitor's process, never on the ranks' path; absent off Linux (then nothing is said)."""

    def __init__(self, keep: int = STEAL_SAMPLES) -> None:
        self.t_ns: deque[int] = deque(maxlen=keep)
        self.steal_ns: deque[float] = deque(maxlen=keep)
        """Stolen ns per CPU so far (the host's total over its CPUs / their count)."""
        self.ok = True
        try:
            self._tick_ns = 1e9 / os.sysconf("SC_CLK_TCK")
        except (ValueError, OSError, AttributeError):
            self.ok = False

    def sample(self) -> None:
        """One reading (a failed one turns the clock off: nothing is guessed)."""
        if not self.ok:
            return
        try:
            with PROC_STAT.open("rb") as f:
                head = f.read(4096).decode("ascii", "replace")
            lines = head.splitlines()
            cpus = sum(1 for x in lines if x.startswith("cpu") and x[3:4].isdigit())
            steal = int(lines[0].split()[8]) * self._tick_ns / max(1, cpus)
        except (OSError, ValueError, IndexError):
            self.ok = False
            return
        self.t_ns.append(time.time_ns())
        self.steal_ns.append(steal)

    def fraction(self, end_ns: np.ndarray) -> np.ndarray | None:
        """The fraction of each CPU's time stolen during each step (``end_ns``: one rank's step
        ends, ns since the epoch on THIS host's clock; one value fewer than ends); None before
        two samples. Steps outside the samples' span count none."""
        if not self.ok or len(self.t_ns) < 2 or len(end_ns) < 2:
            return None
        t = np.asarray(self.t_ns, np.float64)
        cum = np.interp(end_ns.astype(np.float64), t, np.asarray(self.steal_ns, np.float64))
        span = np.diff(end_ns.astype(np.float64))
        with np.errstate(divide="ignore", invalid="ignore"):
            f = np.where(span > 0, np.diff(cum) / span, 0.0)
        return np.asarray(np.clip(f, 0.0, 1.0))


def rank_series(run_dir: Path, world_size: int | None) -> list[RankSeries]:
    """The ranks' step logs, rank 0 first (``world_size`` of them, else the rank folders)."""
    if world_size:
        ranks = range(world_size)
    else:
        found = [p.name for p in (run_dir / rundir.RANKS_DIR).glob("*") if p.name.isdigit()]
        ranks = range(len(found))
    return [RankSeries(rundir.rank_dir(run_dir, r) / step_log.STEP_LOG_FILE) for r in ranks]


def clock(seconds: float) -> str:
    """``H:MM:SS``."""
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def render_line(
    fig: sc.LiveFigures, elapsed_s: float, total_steps: int | None, last: int = LINE_STEPS
) -> str:
    """The live line's text (no newline)."""
    parts = [f"step {fig.steps:,}" + (f"/{total_steps:,}" if total_steps else "")]
    if fig.p50_ms is not None:
        parts.append(f"{fig.p50_ms:.1f} ms/step (p50 of the last {last})")
    if fig.samples_per_s is not None:
        parts.append(f"{fig.samples_per_s:,.0f} samples/s")
    if fig.slowest_rank is not None and fig.slowest_by_ms is not None:
        parts.append(f"slowest rank {fig.slowest_rank} (others wait {fig.slowest_by_ms:.1f} ms)")
    parts.append(f"{clock(elapsed_s)} elapsed")
    if total_steps and fig.p50_ms is not None and fig.steps < total_steps:
        parts.append(f"ETA {clock((total_steps - fig.steps) * fig.p50_ms / 1e3)}")
    return "rankscope: " + " · ".join(parts)


class LineWriter:
    """Draws the live line: in place on a terminal (carriage return, cleared to the end), else
    a plain line at most every ``log_every_s`` (a log)."""

    def __init__(self, out: IO[str], tty: bool | None = None, log_every_s: float = LOG_LINE_S):
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.log_every_s = log_every_s
        self._last_log = -math.inf
        self._drawn = False
        self._pending: str | None = None
        """(a log) the newest line, not written yet: written at the end."""

    def draw(self, line: str, now_s: float) -> None:
        if self.tty:
            self.out.write("\r\x1b[K" + line)
            self._drawn = True
        elif now_s - self._last_log >= self.log_every_s:
            self.out.write(line + "\n")
            self._last_log = now_s
            self._pending = None
        else:
            self._pending = line
        self.out.flush()

    def say(self, line: str) -> None:
        """A line of its own (a change): over the live line on a terminal."""
        self.out.write(("\r\x1b[K" if self.tty else "") + line + "\n")
        self._drawn = False
        self.out.flush()

    def close(self) -> None:
        """The job ended: the terminal's line is left as it is; a log gets the newest line."""
        if self.tty and self._drawn:
            self.out.write("\n")
            self._drawn = False
        elif not self.tty and self._pending is not None:
            self.out.write(self._pending + "\n")
            self._pending = None
        self.out.flush()


def sentence(
    step: int,
    job: sc.JobChange | None,
    drift: sc.RankDrift | None,
    host: sc.HostShare | None = None,
) -> str:
    """The change in one line: ``step 4,210: step time 120 → 180 ms (+50 %); rank 12 is 60 ms
    behind the median``; with ``host`` (the host's contention explains it), what the ranks
    waited more for a CPU, and that no profile is taken."""
    parts = []
    if job is not None:
        parts.append(
            f"step time {job.before_ms:.1f} → {job.after_ms:.1f} ms ({job.rise * 100:+.0f} %)"
        )
    if drift is not None:
        parts.append(
            f"rank {drift.rank} is {drift.behind_ms:.1f} ms behind the median"
            + ("" if job is not None else f" (was {drift.before_ms:.1f} ms)")
        )
    text = f"step {step:,}: " + "; ".join(parts)
    if host is not None:
        who = "the ranks" if job is not None else f"rank {drift.rank if drift else '?'}"
        stolen = (
            f" ({host.stolen_ms:.1f} of them the VM's stolen time)" if host.stolen_ms > 0.05 else ""
        )
        text += (
            f": {who} waited {host.rise_ms:.1f} ms/step more for a CPU{stolen} — contention on "
            "the host, not the job; no profile taken"
        )
    return text


class LiveMonitor:
    """Reads the step logs between the launcher's looks; draws, notices, triggers (module
    docstring). ``poll`` never raises for what it reads: a missing or short file is read later."""

    def __init__(
        self,
        run_dir: Path,
        settings: ProfilerSettings,
        options: LiveOptions,
        world_size: int | None,
        out: IO[str] | None = None,
        rule: sc.ChangeRule | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.settings = settings
        self.options = options
        self.world_size = world_size
        self.rule = rule or sc.ChangeRule()
        self.writer = LineWriter(out or sys.stdout)
        self.started = time.monotonic()
        self.series: list[RankSeries] = []
        self.since = 1
        """First step of the current baseline (after the last change noticed)."""
        self.checked = 0
        self.triggers: list[dict[str, Any]] = []
        self.changes: list[dict[str, Any]] = []
        self._samples: float | None = settings.samples_per_step
        self._samples_read = -math.inf
        self._last_start = 0
        """First recorded step of the newest trigger."""
        self.failed = False
        self.steal = StealClock()
        self._local: bool | None = None
        """Whether every rank runs on this host (its stolen time is theirs); None: not known."""

    def poll(self) -> None:
        """One look: read what is new, notice a change, draw the line. The job's wait never
        fails for the monitor: an unexpected error is said once and the monitor stops."""
        if self.failed:
            return
        try:
            self._poll()
        except Exception as exc:
            self.failed = True
            self.writer.say(f"rankscope: the live line stops ({type(exc).__name__}: {exc})")

    def _poll(self) -> None:
        if not self.series:
            self.series = rank_series(self.run_dir, self.world_size)
            if not self.series:
                return
        self.steal.sample()
        for s in self.series:
            s.read_new()
        done = min(s.count for s in self.series)
        if done > self.checked:
            self.checked = done
            self._notice(done)
        if not self.options.no_live and done > 0:
            fig = sc.live_figures(
                done,
                np.stack([s.end_ns[:done] for s in self.series]),
                np.stack([s.wait_ns[:done] for s in self.series]),
                LINE_STEPS,
                self._samples_per_step(),
            )
            now = time.monotonic()
            last = min(LINE_STEPS, max(1, done - 1))
            line = render_line(fig, now - self.started, self.options.total_steps, last)
            self.writer.draw(line, now)

    def close(self) -> None:
        """The job ended: end the live line."""
        self.writer.close()

    def _samples_per_step(self) -> float | None:
        """``--samples-per-step``, else the median of rank 0's recorded ``step_samples``."""
        if self.settings.samples_per_step is not None:
            return self.settings.samples_per_step
        now = time.monotonic()
        if now - self._samples_read >= SAMPLES_READ_S:
            self._samples_read = now
            try:
                meta = rundir.read_json(rundir.rank_dir(self.run_dir, 0) / rundir.META_JSON)
                values = [float(v) for v in (meta.get("step_samples") or {}).values()]
            except (OSError, ValueError, TypeError, AttributeError):
                values = []
            if values:
                self._samples = float(np.median(values))
        return self._samples

    def comparable(self, step: int) -> bool:
        """Whether ``ProfilerStep#step``'s time is the job's own (no window, no export)."""
        if self.settings.perturbed(step):
            return False
        warm = self.settings.warmup
        return not any(
            t["start_step"] - warm <= step <= t["start_step"] + t["steps"] for t in self.triggers
        )

    def _notice(self, done: int) -> None:
        """Judge the steps done (all ranks) since the baseline began; act on a change."""
        rule = self.rule
        # record k (0-based) ends ProfilerStep#k; its interval from record k-1 is that step.
        # The job's step time sets the window's size (short steps: a longer window)
        recent = max(self.since, done - rule.baseline_max - rule.window)
        probe = sc.job_step_ms(np.stack([s.end_ns[recent - 1 : done] for s in self.series]))
        sizes = rule.sizes(float(np.median(probe)) if probe.size else 0.0)
        first = max(self.since, done - sizes.baseline_max - sizes.window - 64)
        steps = np.arange(first, done)
        keep = np.array([self.comparable(int(k)) for k in steps], dtype=bool)
        if keep.sum() < sizes.baseline_min + sizes.window:
            return
        end = np.stack([s.end_ns[first - 1 : done] for s in self.series])
        wait = np.stack([s.wait_ns[first:done] for s in self.series])
        job_ms = sc.job_step_ms(end)[keep]
        job = sc.detect_job_change(job_ms, rule)
        behind = sc.rank_behind_ms(wait)
        level = job.after_ms if job is not None else float(np.median(job_ms))
        drift = None if behind is None else sc.detect_rank_drift(behind[:, keep], level, rule)
        if job is None and drift is None:
            return
        # what the host's CPU contention explains of it (the ranks' run-queue delays, steal)
        delay = sc.host_delay_ms(np.stack([s.runq_ns[first - 1 : done] for s in self.series]))
        job_host = drift_host = None
        if delay is not None and job is not None:
            steal = self.steal.fraction(end[0]) if self._ranks_local() else None
            job_host = sc.job_change_host(
                job_ms,
                sc.job_host_ms(delay)[keep],
                job,
                rule,
                None if steal is None else steal[keep],
            )
        if delay is not None and drift is not None and behind is not None:
            drift_host = sc.drift_host(behind[:, keep], delay[:, keep], drift, level, rule)
        host_job = job_host is not None and job_host.explained
        host_drift = drift_host is not None and drift_host.explained
        if (job is None or host_job) and (drift is None or host_drift):
            share = job_host if host_job else drift_host
            assert share is not None
            self._report(done, job, drift, share)
        else:
            self._report(done, None if host_job else job, None if host_drift else drift)

    def _ranks_local(self) -> bool:
        """Whether every rank runs on this host (their ``meta.json`` ``host``): only then is
        this host's stolen time theirs. Asked only when a change was found; known once every
        rank's record is there."""
        if self._local is not None:
            return self._local
        me = platform.node()
        for s in self.series:
            try:
                host = rundir.read_json(s.path.parent / rundir.META_JSON).get("host")
            except (OSError, ValueError, AttributeError):
                return False
            if host != me:
                self._local = False
                return False
        self._local = True
        return True

    def _report(
        self,
        done: int,
        job: sc.JobChange | None,
        drift: sc.RankDrift | None,
        host: sc.HostShare | None = None,
    ) -> None:
        """Say, write and act on a change; ``host``: the host's contention explains it (said
        as such, no window asked for)."""
        text = sentence(done, job, drift, host)
        trigger = None if host is not None else self._trigger(done, job, drift, text)
        if job is not None:
            kind, before, after = sc.ChangeKind.JOB, job.before_ms, job.after_ms
        elif drift is not None:
            kind, before, after = sc.ChangeKind.RANK, drift.before_ms, drift.after_ms
        else:
            return
        if host is not None:
            kind = sc.ChangeKind.HOST
        record = {
            "step": done,
            "kind": str(kind),
            "before_ms": before,
            "after_ms": after,
            "rank": drift.rank if drift is not None else None,
            "behind_ms": drift.behind_ms if drift is not None else None,
            "sentence": text,
            "noticed_ns": time.time_ns(),
            "trigger": trigger,
            "host_ms": [host.before_ms, host.after_ms] if host is not None else None,
        }
        self.changes.append(record)
        profiled = f" (profiling steps {self._last_start:,}+)" if trigger is not None else ""
        self.writer.say("rankscope: " + text + profiled)
        try:
            with (self.run_dir / rundir.CHANGES_FILE).open("a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as exc:
            self.writer.say(f"rankscope: cannot write {self.run_dir / rundir.CHANGES_FILE}: {exc}")
        # the new level is the baseline from here on: judged again once it has enough steps
        self.since = done

    def _trigger(
        self, done: int, job: sc.JobChange | None, drift: sc.RankDrift | None, reason: str
    ) -> int | None:
        """Write trigger.json for an extra window, when allowed; its id."""
        allowed = self.options.trigger == TriggerMode.ON
        if not allowed or len(self.triggers) >= self.options.max_triggers:
            return None
        step_ms = job.after_ms if job is not None else None
        if step_ms is None:
            ends = np.stack([s.end_ns[max(0, done - 9) : done] for s in self.series])
            step_ms = float(np.median(sc.job_step_ms(ends))) if ends.shape[1] > 1 else 1.0
        start = self.trigger_start(max(step_ms, 1e-3) / 1e3)
        if start is None:
            return None
        ident = len(self.triggers) + 1
        doc = {"id": ident, "start_step": start, "steps": self.settings.active, "reason": reason}
        try:
            rundir.write_json_atomic(self.run_dir / rundir.TRIGGER_FILE, doc)
        except OSError as exc:
            self.writer.say(f"rankscope: cannot write {self.run_dir / rundir.TRIGGER_FILE}: {exc}")
            return None
        self.triggers.append(doc)
        self._last_start = start
        return ident

    def trigger_start(self, step_s: float) -> int | None:
        """The first recorded step of an extra window: where the fastest rank will be once
        :data:`TRIGGER_LEAD_S` passed (from its newest record, its age and the step time; at
        least :data:`TRIGGER_LEAD_STEPS` steps),
        plus the warm-up steps, moved past any window it would overlap."""
        newest = max(s.count for s in self.series)
        last_end = max(int(s.end_ns[s.count - 1]) for s in self.series if s.count)
        age_s = max(0.0, (time.time_ns() - last_end) / 1e9)
        ahead = max(math.ceil((age_s + TRIGGER_LEAD_S) / step_s), TRIGGER_LEAD_STEPS)
        start = newest + ahead + self.settings.warmup
        active = self.settings.active
        for candidate in range(start, start + 4 * (self.settings.cycle + active) + 1):
            clear = all(
                candidate - self.settings.warmup > t["start_step"] + t["steps"]
                for t in self.triggers
            )
            if clear and self.settings.window_fits(candidate, active):
                return candidate
        return None


def read_tail(path: Path, count: int) -> np.ndarray:
    """The newest ``count`` whole records of a step log (either version; one seek: the file is
    not read whole); empty when it is absent."""
    try:
        with path.open("rb") as f:
            layout = step_log.layout_of(f.read(len(step_log.MAGIC)))
            if layout is None:
                return step_log.decode(b"")
            size = f.seek(0, 2) - layout.header
            whole = size - size % layout.record_size
            start = max(0, whole - count * layout.record_size)
            f.seek(layout.header + start)
            data = f.read(whole - start)
    except OSError:
        return step_log.decode(b"")
    return step_log.decode(data, layout)


def status_line(run_dir: Path, record: dict[str, Any]) -> str | None:
    """The live line of a running job from its step logs' tails (``rankscope status RUN``, for a
    Slurm job that nothing follows); None before every rank has a step."""
    world = record.get("world_size") or len(
        [p for p in (run_dir / rundir.RANKS_DIR).glob("*") if p.name.isdigit()]
    )
    if not world:
        return None
    tails = [
        # twice the line's steps: room for ranks a few steps ahead of the slowest
        read_tail(rundir.rank_dir(run_dir, r) / step_log.STEP_LOG_FILE, 2 * LINE_STEPS + 1)
        for r in range(world)
    ]
    if any(len(t) == 0 for t in tails):
        return None
    done = min(int(t["steps"][-1]) for t in tails)
    # the same steps of every rank: each rank's records up to `done`, the newest LINE_STEPS + 1
    kept = [t[t["steps"] <= done] for t in tails]
    n = min(LINE_STEPS + 1, *(len(k) for k in kept))
    end = np.stack([k["end_ns"][len(k) - n :] for k in kept])
    wait = np.stack([k["wait_ns"][len(k) - n :] for k in kept])
    settings = ProfilerSettings.from_dict(record.get("profiler") or {})
    fig = sc.live_figures(done, end, wait, LINE_STEPS + 1, settings.samples_per_step)
    live = (record.get("options") or {}).get("live") or {}
    started = min(int(k["end_ns"][0]) for k in kept) if done <= LINE_STEPS else None
    elapsed = _elapsed_s(run_dir, record, started)
    return render_line(fig, elapsed, live.get("total_steps"), min(LINE_STEPS, n - 1))


def _elapsed_s(run_dir: Path, record: dict[str, Any], first_end_ns: int | None) -> float:
    """Seconds since the job's ranks started: rank 0's ``meta.json`` ``started_ns`` (a Slurm
    job's time in the queue, from ``started_at`` on, is not the run's), else ``started_at`` of
    run.json, else its first step's end."""
    import datetime as dt

    try:
        meta = rundir.read_json(rundir.rank_dir(run_dir, 0) / rundir.META_JSON)
        return (time.time_ns() - int(meta["started_ns"])) / 1e9
    except (OSError, ValueError, TypeError, KeyError):
        pass
    text = record.get("started_at")
    if text:
        try:
            start = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
            return (dt.datetime.now(dt.UTC) - start).total_seconds()
        except ValueError:
            pass
    return 0.0 if first_end_ns is None else (time.time_ns() - first_end_ns) / 1e9
