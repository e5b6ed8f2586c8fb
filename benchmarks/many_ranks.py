"""Many ranks (issue 15): merge and analyse synthetic jobs of 8 … 1024 ranks (prints figures).

    python benchmarks/many_ranks.py                # 8,64,256,1024 ranks x ~50k events per rank
    python benchmarks/many_ranks.py --ranks 8,64 --events-per-rank 5000 --hta
    nohup python benchmarks/many_ranks.py --hta > /tmp/rs-many/log.txt 2>&1 &

A figure-printing script, never a timed test; docs/performance.md ("Many ranks") records its
output. For each N of ``--ranks``:

1. **Generate** the job with ``rankscope synth`` (a whole process; orchestrator/synth.py): N ranks,
   8 GPUs per host, ``--layers`` layers and as many steps as give ``--events-per-rank`` (measured
   on a 1-step and a 2-step probe: events grow linearly with steps), seed 1, and TWO stragglers
   with known truth: rank N/3 (+4 ms of backward compute per step) and rank 2N/3 (+2 ms), on
   different hosts from 16 ranks on. A job already in ``WORKDIR/rN`` with the same configuration
   is reused (the "generate" column then says so).
2. **Merge and analyse** as whole processes, what a user runs: ``rankscope merge WORKDIR/rN``,
   then ``rankscope analyze WORKDIR/rN --json WORKDIR/rN-summary.json``, with their default
   schedulers ("auto": in-process unless a Dask LocalCluster pays; the line each prints about
   its choice is shown). Measured: wall seconds, seconds per rank and µs per trace event
   (every event synth wrote, metadata and flows included; the store keeps the events with a
   duration: its own column), and the peak RSS of every process in the command's tree — the
   command itself and every Dask worker or spawned process — sampled with psutil every 100 ms
   (each process's ``VmHWM``, its own high-water mark, so a spike between two samples still
   counts; and the command's ``ru_maxrss`` from ``wait4``). "max proc" is the largest single
   process, "Σ" the largest sum over the tree at one sample. Also the store size and the load
   average while it ran (1-minute figure, averaged over the samples: the machine is shared).
   Stragglers: the ranks in summary.json's ``stragglers[]`` (docs/summary.md) against
   ``truth.json``'s, as precision and recall.
3. **The single HDF5 writer**, at every N: the same merge once more, in a child process
   of this script (``--writer-probe``) that calls ``merge_run_dir`` in-process with the
   ``synchronous`` scheduler (what "auto" picks on a 2-core machine; every phase then runs in
   one process, so every phase can be timed) and with timers wrapped, from this file, around
   the functions of each phase — nothing in orchestrator/ is edited: ``parse_source`` (the
   per-rank parse, what each Dask worker runs), ``Spill.put``/``take`` (parking the parsed
   ranks on disk), ``matching.match`` and ``clock.align`` (the cross-rank step), and the
   ``StoreWriter`` methods (``write_rank``, ``write_memory``, ``write_tables``, ``intern``,
   ``set_attr``, ``close``: the HDF5 writer itself). The merge parses every rank first and
   writes once all clocks are known, so the write phase runs after the parse, alone in the
   parent: with ``w`` parse workers the merge takes about ``E/(w·P) + align + E/W`` (``P`` the
   parse rate of one worker, ``W`` the writer's, events/s). The writer is the bottleneck when
   ``E/W`` exceeds the parse phase, i.e. from ``w ≥ W/P`` workers on; the script prints ``P``,
   ``W``, the writer's share of the merge and that crossover per N, and the verdict at the
   largest N.
4. **HTA 0.5.0** (``--hta``): in its own venv (``--hta-python``, default
   ``/tmp/hta-venv/bin/python``; benchmarks/analysis_scale.py says how to create it), load +
   temporal breakdown of the same traces (a folder of links to the rank files: HTA takes
   every JSON of its folder as a rank trace) in a subprocess with a time limit
   (``--hta-minutes``, default 15) and a memory watchdog (``--hta-max-gb``, default 16: the
   whole tree is killed above it); tried at 8 and 64 ranks, at 256 only if 64 finished, never
   at 1024.

Then one Markdown table with all of it, and the writer's verdict. Job folders are removed after
their row unless ``--keep``; the largest N's folder (traces, truth.json, trace.h5) is always
kept, and every row's summary.json and command logs stay in ``--workdir``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_HTA_PYTHON = Path("/tmp/hta-venv/bin/python")
SAMPLE_S = 0.1
RANKS_PER_HOST = 8
DEFAULT_LAYERS = 16
SEED = 1
#: the two injected stragglers: (share of the world size for the rank, extra ms per step)
STRAGGLERS = ((1 / 3, 4.0), (2 / 3, 2.0))
GB = 2**30

HTA_SCRIPT = """
import json, sys, time, logging, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
t1 = time.perf_counter()
df = ta.get_temporal_breakdown(visualize=False)
t2 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "temporal_s": t2 - t1, "ranks": int(len(df))}))
"""


# --- whole processes, measured -------------------------------------------------------------


@dataclass
class Measured:
    """One command run as a whole process, with the peak memory of its process tree."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    """user + system CPU seconds of the command and the children it waited for (``wait4``)"""
    rc: int | None = None
    max_proc_bytes: int = 0
    max_proc_label: str = ""
    sum_peak_bytes: int = 0
    processes: int = 0
    load: float = 0.0
    killed: str = ""
    """"" or why the watchdog killed it (``time``, ``memory``)"""
    log: Path | None = None
    labels: dict[str, int] = field(default_factory=dict)
    """label → peak bytes of the largest process with that label"""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.killed

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log is not None else ""


def _status_kb(pid: int, key: str) -> int:
    """``VmHWM``/``VmRSS`` of ``pid`` in bytes (0 when gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _label(proc: Any, root_pid: int) -> str:
    import psutil

    if proc.pid == root_pid:
        return "command"
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return "child"
    if "distributed" in cmd or "dask" in cmd:
        return "dask worker"
    if "multiprocessing" in cmd or "spawn_main" in cmd:
        return "spawned"
    return f"child {proc.name()}"


def measure(
    cmd: list[str],
    log: Path,
    *,
    time_limit_s: float | None = None,
    mem_limit_bytes: int | None = None,
    cwd: Path | None = None,
) -> Measured:
    """Run ``cmd`` (output to ``log``), sampling its whole process tree every SAMPLE_S.

    The tree is killed when it runs past ``time_limit_s`` or when the sum of its RSS passes
    ``mem_limit_bytes`` (``Measured.killed`` says which).
    """
    import psutil

    m = Measured(log=log)
    peaks: dict[tuple[int, float], tuple[str, int]] = {}
    loads: list[float] = []
    with log.open("wb") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd
        )
    root = psutil.Process(proc.pid)
    rusage_max = 0
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            m.rc = os.waitstatus_to_exitcode(status)
            proc.returncode = m.rc
            rusage_max = rusage.ru_maxrss * 1024  # KB on Linux
            m.cpu_s = rusage.ru_utime + rusage.ru_stime
            break
        total = 0
        try:
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            members = [root]
        for p in members:
            with contextlib.suppress(psutil.Error):
                key = (p.pid, p.create_time())
                rss = p.memory_info().rss
                total += rss
                hwm = max(_status_kb(p.pid, "VmHWM"), rss)
                label, old = peaks.get(key, (None, 0))
                peaks[key] = (label or _label(p, proc.pid), max(old, hwm))
        m.sum_peak_bytes = max(m.sum_peak_bytes, total)
        loads.append(os.getloadavg()[0])
        elapsed = time.perf_counter() - t0
        why = ""
        if time_limit_s is not None and elapsed > time_limit_s:
            why = "time"
        elif mem_limit_bytes is not None and total > mem_limit_bytes:
            why = "memory"
        if why:
            m.killed = why
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _, status, rusage = os.wait4(proc.pid, 0)
            m.cpu_s = rusage.ru_utime + rusage.ru_stime
            m.rc = os.waitstatus_to_exitcode(status)
            proc.returncode = m.rc
            break
        time.sleep(SAMPLE_S)
    m.wall_s = time.perf_counter() - t0
    # Children left behind (a worker that outlived its parent) must not outlive the benchmark.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    command_key = next((k for k in peaks if k[0] == proc.pid), None)
    if command_key is not None:
        label, old = peaks[command_key]
        peaks[command_key] = (label, max(old, rusage_max))
    else:
        peaks[(proc.pid, 0.0)] = ("command", rusage_max)
    m.processes = len(peaks)
    for label, peak in peaks.values():
        m.labels[label] = max(m.labels.get(label, 0), peak)
        if peak > m.max_proc_bytes:
            m.max_proc_bytes, m.max_proc_label = peak, label
    m.sum_peak_bytes = max(m.sum_peak_bytes, m.max_proc_bytes)
    m.load = sum(loads) / len(loads) if loads else os.getloadavg()[0]
    return m


# --- the jobs -------------------------------------------------------------------------------


def straggler_ranks(n: int) -> list[int]:
    """The two injected stragglers' ranks (different hosts from 16 ranks on)."""
    return [min(n - 1, int(share * n)) for share, _ in STRAGGLERS]


def synth_args(n: int, steps: int, layers: int) -> list[str]:
    out = [
        "--ranks",
        str(n),
        "--ranks-per-host",
        str(min(RANKS_PER_HOST, n)),
        "--steps",
        str(steps),
        "--layers",
        str(layers),
        "--seed",
        str(SEED),
    ]
    for rank, (_, extra_ms) in zip(straggler_ranks(n), STRAGGLERS, strict=True):
        out += ["--straggler", f"{rank}:{extra_ms}:1.0"]
    return out


def steps_for(events_per_rank: int, layers: int) -> tuple[int, float]:
    """Steps that give about ``events_per_rank`` (probe: a 1-step and a 2-step 8-rank job)."""
    import tempfile

    from rankscope.orchestrator.synth import SynthConfig, generate

    counts = []
    with tempfile.TemporaryDirectory(prefix="rs-many-probe-") as tmp:
        for steps in (1, 2):
            got = generate(
                SynthConfig(ranks=8, steps=steps, layers=layers, seed=SEED), Path(tmp) / str(steps)
            )
            counts.append(got["events"] / 8)
    per_step = counts[1] - counts[0]
    fixed = counts[0] - per_step
    steps = max(1, round((events_per_rank - fixed) / per_step))
    return steps, fixed + steps * per_step


def same_job(job: Path, n: int, steps: int, layers: int) -> bool:
    """``job`` holds the job these arguments would generate (all rank files and truth.json)."""
    try:
        cfg = json.loads((job / "truth.json").read_text())["config"]
    except (OSError, ValueError, KeyError):
        return False
    want_stragglers = [
        [r, ms, 1.0] for r, (_, ms) in zip(straggler_ranks(n), STRAGGLERS, strict=True)
    ]
    return (
        cfg.get("ranks") == n
        and cfg.get("steps") == steps
        and cfg.get("layers") == layers
        and cfg.get("seed") == SEED
        and cfg.get("ranks_per_host") == min(RANKS_PER_HOST, n)
        and [list(s) for s in cfg.get("stragglers", [])] == want_stragglers
        and all((job / f"rank-{r}.json.gz").exists() for r in range(n))
    )


def rankscope_cmd() -> list[str]:
    return [sys.executable, "-m", "rankscope"]


def first_line(text: str, prefix: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip().startswith(prefix)), "")


def one(args: argparse.Namespace, n: int, steps: int, expect: float) -> dict[str, Any]:
    """Generate, merge and analyse the N-rank job; return its row's figures."""
    wd: Path = args.workdir
    job = wd / f"r{n}"
    row: dict[str, Any] = {"ranks": n, "steps": steps}
    if same_job(job, n, steps, args.layers):
        row["generate"] = "reused"
        print(f"[{n}] reusing the job in {job}", flush=True)
    else:
        shutil.rmtree(job, ignore_errors=True)
        g = measure(
            [*rankscope_cmd(), "synth", str(job), *synth_args(n, steps, args.layers)],
            wd / f"r{n}-synth.log",
        )
        if not g.ok:
            raise SystemExit(f"synth failed ({g.rc}):\n{g.text()[-3000:]}")
        row["generate"] = f"{g.wall_s:.1f} s"
        print(f"[{n}] {g.text().strip().splitlines()[-1]}", flush=True)
    synth_log = wd / f"r{n}-synth.log"
    said = re.search(r"([\d,]+) events", synth_log.read_text()) if synth_log.exists() else None
    # what synth wrote (every trace event: metadata, flows, instants); else the probe's count
    row["trace_events"] = int(said.group(1).replace(",", "")) if said else round(n * expect)
    truth = json.loads((job / "truth.json").read_text())
    gz = sum(p.stat().st_size for p in job.glob("rank-*.json.gz"))
    row["gz_mb"] = gz / 2**20
    (job / "trace.h5").unlink(missing_ok=True)

    merge = measure([*rankscope_cmd(), "merge", str(job)], wd / f"r{n}-merge.log")
    if not merge.ok:
        raise SystemExit(f"merge failed ({merge.rc}, {merge.killed}):\n{merge.text()[-3000:]}")
    print(f"[{n}] {first_line(merge.text(), 'merge:')}", flush=True)
    store = job / "trace.h5"
    from rankscope.analysis.store.reader import open_store

    with open_store(store) as s:
        events = sum(int(s.rank_meta(r).get("events", 0)) for r in s.ranks)
    row["events"] = events  # what the store holds: events with a duration
    row["store_mb"] = store.stat().st_size / 2**20
    summary = wd / f"r{n}-summary.json"
    analyze = measure(
        [*rankscope_cmd(), "analyze", str(job), "--json", str(summary)], wd / f"r{n}-analyze.log"
    )
    if not analyze.ok:
        raise SystemExit(
            f"analyze failed ({analyze.rc}, {analyze.killed}):\n{analyze.text()[-3000:]}"
        )
    print(f"[{n}] {first_line(analyze.text(), 'analysis:')}", flush=True)
    s_json = json.loads(summary.read_text())
    named = {int(s["rank"]): s.get("cause", "") for s in s_json.get("stragglers", [])}
    expected = {int(t["rank"]): t["cause"] for t in truth["stragglers"]}
    hits = set(named) & set(expected)
    row.update(
        merge=merge,
        analyze=analyze,
        named=named,
        truth=expected,
        precision=len(hits) / len(named) if named else float(not expected),
        recall=len(hits) / len(expected) if expected else 1.0,
    )
    print(f"[{n}] {row_text(row)}", flush=True)
    return row


def hta_try(args: argparse.Namespace, n: int) -> dict[str, Any]:
    """HTA's load + temporal breakdown of the N-rank job, time- and memory-limited."""
    job = args.workdir / f"r{n}"
    traces = args.workdir / f"hta-r{n}"
    shutil.rmtree(traces, ignore_errors=True)
    traces.mkdir(parents=True)
    for f in job.glob("rank-*.json.gz"):
        (traces / f.name).symlink_to(f.resolve())
    m = measure(
        [str(args.hta_python), "-c", HTA_SCRIPT, str(traces)],
        args.workdir / f"r{n}-hta.log",
        time_limit_s=args.hta_minutes * 60,
        mem_limit_bytes=int(args.hta_max_gb * GB),
    )
    shutil.rmtree(traces, ignore_errors=True)
    out: dict[str, Any] = {"measured": m, "ok": False}
    if m.killed == "time":
        out["text"] = (
            f"did not finish in {args.hta_minutes:g} min (Σ {m.sum_peak_bytes / GB:.1f} GB)"
        )
    elif m.killed == "memory":
        out["text"] = (
            f"over memory: Σ {m.sum_peak_bytes / GB:.1f} GB > {args.hta_max_gb:g} GB "
            f"after {m.wall_s:.0f} s"
        )
    elif m.rc != 0:
        last = m.text().strip().splitlines()[-1:] or ["?"]
        out["text"] = f"failed (exit {m.rc}: {last[0][:120]})"
    else:
        res = json.loads(m.text().strip().splitlines()[-1])
        out.update(ok=True, **res)
        out["text"] = (
            f"{res['load_s'] + res['temporal_s']:.1f} s ({res['load_s']:.1f} load), "
            f"max proc {m.max_proc_bytes / GB:.2f} GB, Σ {m.sum_peak_bytes / GB:.2f} GB "
            f"({m.processes} procs)"
        )
    print(f"[{n}] HTA 0.5.0: {out['text']}", flush=True)
    return out


# --- the single HDF5 writer -----------------------------------------------------------------


def writer_probe(job: Path, output: Path) -> dict[str, Any]:
    """Merge ``job`` in this process (synchronous) with timers around each phase's functions."""
    from rankscope.analysis.store.reader import StoreWriter
    from rankscope.orchestrator.ingest import clock, matching, rank_columns, staging
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    times: dict[str, float] = {}
    counts = {"parsed_events": 0, "written_events": 0}
    marks: dict[str, float] = {}

    def timed(owner: Any, name: str, bucket: str, count: str = "") -> None:
        orig = getattr(owner, name, None)
        if orig is None:  # renamed since this script was written: that phase goes untimed
            print(f"writer probe: {owner.__name__}.{name} not found, not timed", file=sys.stderr)
            return

        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                result = orig(*a, **k)
            finally:
                now = time.perf_counter()
                times[bucket] = times.get(bucket, 0.0) + now - t
                marks[f"{bucket}_end"] = now
            if count == "parsed_events" and result.columns is not None:
                counts[count] += len(result.columns["ts"])
            elif count == "written_events":
                counts[count] += len(a[2]["ts"])  # (self, rank, events, ...)
            return result

        setattr(owner, name, wrapper)

    timed(rank_columns, "parse_source", "parse", "parsed_events")
    timed(staging.Spill, "put", "spill_put")
    timed(staging.Spill, "take", "spill_take")
    timed(matching, "match", "match")
    timed(clock, "align_columns", "align")
    timed(StoreWriter, "write_rank", "writer", "written_events")
    for name in ("write_memory", "write_tables", "intern", "set_attr", "close"):
        timed(StoreWriter, name, "writer")
    output.unlink(missing_ok=True)
    t0 = time.perf_counter()
    merge_run_dir(job, output=output, scheduler="synchronous", quiet=True)
    total = time.perf_counter() - t0
    size = output.stat().st_size
    output.unlink(missing_ok=True)
    write_phase = marks.get("writer_end", 0.0) - marks.get("align_end", t0)
    return {
        "total_s": total,
        "write_phase_s": write_phase,
        "store_bytes": size,
        **{f"{k}_s": v for k, v in times.items()},
        **counts,
    }


def writer_row(args: argparse.Namespace, n: int) -> dict[str, Any]:
    job = args.workdir / f"r{n}"
    m = measure(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--writer-probe",
            str(job),
            str(args.workdir / "writer-probe.h5"),
        ],
        args.workdir / f"r{n}-writer-probe.log",
    )
    if not m.ok:
        raise SystemExit(f"writer probe failed ({m.rc}):\n{m.text()[-3000:]}")
    res: dict[str, Any] = json.loads(m.text().strip().splitlines()[-1])
    res["measured"] = m
    return res


# --- output ---------------------------------------------------------------------------------


def gb(b: int) -> str:
    return f"{b / GB:.2f}"


def ranks_text(ranks: dict[int, str]) -> str:
    return ", ".join(f"{r} {c}".strip() for r, c in sorted(ranks.items())) or "none"


def row_text(row: dict[str, Any]) -> str:
    mg: Measured = row["merge"]
    an: Measured = row["analyze"]
    n, ev = row["ranks"], row["trace_events"]
    hta = row.get("hta", {}).get("text", "not tried")
    return (
        f"| {n} | {ev / n:,.0f} | {ev / 1e6:.2f} M | {row['events'] / 1e6:.2f} M | "
        f"{row['gz_mb']:.1f} | "
        f"{row['generate']} | "
        f"{mg.wall_s:.1f} | {mg.wall_s / n:.3f} | {mg.cpu_s / n:.3f} | {1e6 * mg.wall_s / ev:.2f} | "
        f"{gb(mg.max_proc_bytes)} ({mg.max_proc_label}) | {gb(mg.sum_peak_bytes)} ({mg.processes}) | "
        f"{an.wall_s:.1f} | {an.wall_s / n:.3f} | {an.cpu_s / n:.3f} | {1e6 * an.wall_s / ev:.2f} | "
        f"{gb(an.max_proc_bytes)} ({an.max_proc_label}) | {gb(an.sum_peak_bytes)} ({an.processes}) | "
        f"{row['store_mb']:.1f} | {ranks_text(row['truth'])} | {ranks_text(row['named'])} | "
        f"{row['precision']:.2f} | {row['recall']:.2f} | {mg.load:.1f} / {an.load:.1f} | {hta} |"
    )


HEAD = (
    "| ranks | trace events/rank | trace events | store events | traces MB (gz) | generate | "
    "merge s | merge s/rank | merge CPU s/rank | merge µs/event | merge max proc GB | "
    "merge Σ GB (procs) | analyze s | analyze s/rank | analyze CPU s/rank | analyze µs/event | analyze max proc GB | analyze Σ GB (procs) | store MB | "
    "true stragglers | named | precision | recall | load (merge / analyze) | HTA 0.5.0 load + temporal |"
)


def writer_figures(w: dict[str, Any]) -> dict[str, Any]:
    """Rates and shares of one writer probe (events: those the store holds)."""
    ev = w["written_events"]
    parse_rate = w["parsed_events"] / w["parse_s"] if w.get("parse_s") else 0.0
    writer_rate = ev / w["writer_s"] if w.get("writer_s") else 0.0
    return {
        "parse_events_per_s": parse_rate,
        "writer_events_per_s": writer_rate,
        "write_phase_events_per_s": ev / w["write_phase_s"] if w.get("write_phase_s") else 0.0,
        "crossover_workers": writer_rate / parse_rate if parse_rate else 0.0,
        "writer_share": w.get("writer_s", 0.0) / w["total_s"],
        **{k: v for k, v in w.items() if k != "measured"},
    }


def print_writer(probes: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The phase table (one row per N) and the verdict on the largest N."""
    print()
    print("Single HDF5 writer: the merge once more, in-process (synchronous), timers per phase:")
    print(
        "| ranks | merge in-process s | parse s (1 core) | parse s/rank | parse events/s per "
        "worker | spill put + take s | match + align s | write phase s | HDF5 writer s | "
        "writer s/rank | writer events/s | writer MB/s (store) | writer share of merge | "
        "writer limits from | probe max proc GB |"
    )
    print("|---" * 15 + "|")
    out: dict[str, Any] = {}
    for n, w in sorted(probes.items()):
        f = out[str(n)] = writer_figures(w)
        m: Measured = w["measured"]
        wr = w.get("writer_s", 0.0)
        print(
            f"| {n} | {w['total_s']:.1f} | {w.get('parse_s', 0):.1f} | "
            f"{w.get('parse_s', 0) / n:.3f} | {f['parse_events_per_s']:,.0f} | "
            f"{w.get('spill_put_s', 0):.1f} + {w.get('spill_take_s', 0):.1f} | "
            f"{w.get('match_s', 0):.1f} + {w.get('align_s', 0):.1f} | {w['write_phase_s']:.1f} | "
            f"{wr:.1f} | {wr / n:.3f} | {f['writer_events_per_s']:,.0f} | "
            f"{w['store_bytes'] / 2**20 / max(wr, 1e-9):.0f} | {100 * f['writer_share']:.0f} % | "
            f"{f['crossover_workers']:.1f} workers | {gb(m.max_proc_bytes)} |"
        )
    n = max(probes)
    f = out[str(n)]
    print(
        f"writer at {n} ranks: {f['writer_events_per_s']:,.0f} events/s (the whole write phase, "
        f"spill reads and clock shifts included: {f['write_phase_events_per_s']:,.0f} events/s); "
        f"one parse worker: {f['parse_events_per_s']:,.0f} events/s. The write phase follows the "
        f"parse, so the writer limits the merge once w ≥ W/P = {f['crossover_workers']:.1f} "
        "parse workers run in parallel; with this machine's one parse worker it is "
        + ("THE BOTTLENECK" if f["crossover_workers"] < 1.0 else "not the bottleneck")
        + f" ({100 * f['writer_share']:.0f} % of the in-process merge)."
    )
    return out


def as_json(row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in row.items():
        if isinstance(v, Measured):
            v = {
                key: getattr(v, key)
                for key in (
                    "wall_s",
                    "cpu_s",
                    "rc",
                    "max_proc_bytes",
                    "max_proc_label",
                    "sum_peak_bytes",
                    "processes",
                    "load",
                    "killed",
                    "labels",
                )
            }
        elif isinstance(v, dict):
            v = as_json({str(a): b for a, b in v.items()})
        out[k] = v
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ranks", default="8,64,256,1024", help="comma list of world sizes")
    p.add_argument("--events-per-rank", type=int, default=50_000)
    p.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="model layers (synth)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/rs-many"))
    p.add_argument(
        "--keep", action="store_true", help="keep every job folder (the largest is always kept)"
    )
    p.add_argument("--hta", action="store_true", help="also try HTA 0.5.0 (8, 64, 256 ranks)")
    p.add_argument("--hta-python", type=Path, default=DEFAULT_HTA_PYTHON)
    p.add_argument("--hta-minutes", type=float, default=15.0)
    p.add_argument("--hta-max-gb", type=float, default=16.0)
    p.add_argument("--no-writer", action="store_true", help="skip the single-writer probe")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--writer-probe", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.writer_probe:
        print(json.dumps(writer_probe(*args.writer_probe)))
        return 0
    sizes = sorted({int(x) for x in re.split(r"[,\s]+", args.ranks.strip()) if x})
    args.workdir.mkdir(parents=True, exist_ok=True)
    steps, expect = steps_for(args.events_per_rank, args.layers)
    import psutil
    from rankscope import __version__

    head = subprocess.run(
        ["git", "-C", str(Path(__file__).resolve().parent), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"rankscope {__version__}, commit {head or 'unknown'}")
    print(
        f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / GB:.1f} GB, "
        f"load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}; "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    )
    print(
        f"jobs: {sizes} ranks, {args.layers} layers x {steps} steps ≈ {expect:,.0f} events per "
        f"rank (asked {args.events_per_rank:,}), {RANKS_PER_HOST} GPUs per host, stragglers "
        + ", ".join(f"rank {share:.2f}·N +{ms} ms" for share, ms in STRAGGLERS)
        + f"; workdir {args.workdir}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    hta_ok: dict[int, bool] = {}
    probes: dict[int, dict[str, Any]] = {}
    for n in sizes:
        largest = n == sizes[-1]
        row = one(args, n, steps, expect)
        if args.hta:
            if not args.hta_python.exists():
                row["hta"] = {"text": f"no {args.hta_python}"}
            elif n <= 64 or (n <= 256 and hta_ok.get(64)):
                row["hta"] = hta_try(args, n)
                hta_ok[n] = bool(row["hta"]["ok"])
            else:
                why = "not tried at 1024" if n > 256 else "not tried (64 ranks did not finish)"
                row["hta"] = {"text": why}
        rows.append(row)
        if not args.no_writer:
            probes[n] = writer_row(args, n)
        if not (largest or args.keep):
            shutil.rmtree(args.workdir / f"r{n}", ignore_errors=True)
    print()
    print(HEAD)
    print("|---" * (HEAD.count("|") - 1) + "|")
    for row in rows:
        print(row_text(row))
    figures: dict[str, Any] = {"steps": steps, "layers": args.layers, "rows": rows}
    if probes:
        figures["writer"] = print_writer(probes)
    print(f"kept: {args.workdir / f'r{sizes[-1]}'} (traces, truth.json, trace.h5)")
    if args.json:
        figures["rows"] = [as_json(r) for r in rows]
        args.json.write_text(json.dumps(as_json(figures), indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
