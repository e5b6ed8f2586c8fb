"""Time to answer: rankscope vs Holistic Trace Analysis, whole processes, side by side.

    python benchmarks/time_to_answer.py                # 5 interleaved rounds, table printed
    python benchmarks/time_to_answer.py --rounds 1 --sets dlrm   # quick look

What a user feels is the wall time from typing the command to reading the answer, so every
figure here is a **whole process** (interpreter start, imports, work, exit), timed from this
script with ``time.perf_counter`` around ``subprocess.run``. The two tools run on the same files,
interleaved A B A B for ``--rounds`` rounds so that load swings on a shared machine hit both
alike; the table gives the median over rounds (and the spread, min–max).

Sets (each a row of the table):

* ``dlrm``: ``tests/data/param_dlrm_8rank`` (8 small NCCL ranks, 7 MB of JSON). rankscope:
  ``rankscope merge`` then ``rankscope analyze --json`` (two processes, times summed: that is
  what a user types); and ``rankscope analyze FOLDER`` (one process that merges and analyses).
  HTA 0.5.0: one process that loads the folder and runs the analyses that
  answer the same questions — temporal breakdown, comm/comp overlap, potential stragglers.
* ``big``: ``tests/data/hta/df_index_resolver`` (one rank, 54 MB of JSON). ``rankscope merge``
  vs ``TraceAnalysis(trace_dir=...)`` (HTA's load, which parses the trace).
* ``end-of-run``: what ``rankscope run`` does after its last rank exits (merge, analyse, print
  the summary, write report/), on a copy of the example's real 4-rank run folder
  (``tests/data/cpu_gloo_4rank_ddp_buckets``): a fresh process calling ``workflow.after_run``, so the
  figure also counts an interpreter start that the real ``rankscope run`` has already paid.
* ``reader``: rankscope's trace reader alone, in this process, on the big rank: MB of JSON per
  second, on one core (``read_trace(beside=False)``: what each of a merge's worker processes
  gets) and as a lone read runs it, its scanner reading ahead on a second core (the default;
  no HTA peer: it has no reader separate from its load).
* ``pp64``: a large-model job beside the DDP ones (issue 31): ``rankscope synth`` makes 64 ranks
  of tensor × pipeline × data parallel (TP 2 × PP 8 × DP 4, ``--microbatches``), whose pipeline
  sends and receives are thousands of point-to-point ops per step across the job (the count is
  printed). Made once, outside the timing. ``rankscope analyze FOLDER`` (one process) vs HTA's
  load + breakdown + overlap + stragglers on the same 64 files; an HTA failure is said in its
  cell (its exit status and last line), never hidden.
* ``pp256`` (not in the default sets: ~10 s a round): the same at 256 ranks (TP 2 × PP 8 ×
  DP 16), where the analysis' serial cross-rank phase is seconds (issue 31, eleventh pass).

rankscope's own modules are byte-compiled first (:func:`compile_rankscope`, outside the timing), as
``pip install`` of its wheel does and as HTA's were when it was installed: a machine that sets
``PYTHONDONTWRITEBYTECODE`` (this project's does) would otherwise make every rankscope process
compile its ~100 modules from source again (~0.05-0.1 s of CPU per process, measured).

HTA runs from its own venv (``--hta-python``, default /tmp/hta-venv/bin/python; create it with
``python benchmarks/merge_vs_hta.py --setup-hta``). A smoke test (tests/test_benchmarks.py)
runs this script with ``--rounds 1 --no-hta`` so it keeps working; it asserts no time.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from timing import whole_process_s

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT / "tests" / "data" / "param_dlrm_8rank"
BIG = ROOT / "tests" / "data" / "hta" / "df_index_resolver"
RUN = ROOT / "tests" / "data" / "cpu_gloo_4rank_ddp_buckets"
HTA_PYTHON = Path("/tmp/hta-venv/bin/python")
SETS = ("dlrm", "big", "reader", "end-of-run", "pp64", "pp256")
#: The sets run when ``--sets`` is not given.
DEFAULT_SETS = ("dlrm", "big", "reader", "end-of-run", "pp64")
#: The large-model job of ``pp64``: ``rankscope synth`` arguments (64 ranks, TP 2 × PP 8 × DP 4).
PP64_SYNTH = ("--ranks", "64", "--ranks-per-host", "8", "--tp", "2", "--pp", "8", "--dp", "4",
              "--layers", "8", "--steps", "3", "--seed", "1")  # fmt: skip
#: The same job at 256 ranks (TP 2 × PP 8 × DP 16): the ``pp256`` set.
PP256_SYNTH = ("--ranks", "256", "--ranks-per-host", "8", "--tp", "2", "--pp", "8", "--dp", "16",
               "--layers", "8", "--steps", "3", "--seed", "1")  # fmt: skip
#: Each large-model set: its ``rankscope synth`` arguments.
LAYERED_SETS = {"pp64": PP64_SYNTH, "pp256": PP256_SYNTH}
#: Microbatches per step of ``pp64`` (each one a send and a receive per stage boundary, twice).
PP64_MICROBATCHES = 16

#: HTA's answer to "where does the time go and who is the straggler" on a multi-rank folder.
HTA_ANALYSE = """
import sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
a.get_comm_comp_overlap(visualize=False)
a.get_potential_stragglers()
"""

#: HTA's load alone (it parses every rank's trace).
HTA_LOAD = """
import sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1])
"""


def rankscope_argv(*args: str) -> list[str]:
    """The ``rankscope`` command as a user runs it (the venv's console script when present)."""
    exe = Path(sys.executable).with_name("rankscope")
    if exe.exists():
        return [str(exe), *args]
    return [sys.executable, "-m", "rankscope", *args]


#: rankscope's source folders (the top-level folders the package is installed from).
PACKAGE_FOLDERS = ("package", "orchestrator", "launchers", "analysis", "slurm")


def compile_rankscope() -> None:
    """Byte-compile rankscope's modules in place (``__pycache__``, ignored by git), as a wheel's
    install does; Python reads them even where it writes none (``PYTHONDONTWRITEBYTECODE``)."""
    import compileall

    for folder in PACKAGE_FOLDERS:
        compileall.compile_dir(ROOT / folder, quiet=2)


def traces_only(src: Path, dest: Path) -> Path:
    """A folder holding only ``src``'s trace files (HTA takes every *.json of its folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name.endswith((".json", ".json.gz")):
            shutil.copy2(f, dest / f.name)
    return dest


def rankscope_dlrm(work: Path) -> float:
    store = work / "dlrm.h5"
    store.unlink(missing_ok=True)
    merge = whole_process_s(rankscope_argv("merge", str(DLRM), "-o", str(store), "-q"))
    analyze = whole_process_s(
        rankscope_argv("analyze", str(store), "--json", str(work / "dlrm.json"))
    )
    return merge + analyze


def rankscope_dlrm_one(folder: Path) -> float:
    """``rankscope analyze FOLDER``: one command that merges and analyses (store in the folder)."""
    (folder / "trace.h5").unlink(missing_ok=True)
    shutil.rmtree(folder / "report", ignore_errors=True)
    return whole_process_s(
        rankscope_argv("analyze", str(folder), "--json", str(folder.parent / "one.json"))
    )


def rankscope_big(work: Path) -> float:
    store = work / "big.h5"
    store.unlink(missing_ok=True)
    return whole_process_s(rankscope_argv("merge", str(BIG), "-o", str(store), "-q"))


END_OF_RUN = """
import sys
from pathlib import Path
from rankscope.orchestrator.workflow import after_run
after_run(Path(sys.argv[1]), merge_traces=True, analyse=True)
"""


def end_of_run(work: Path) -> float:
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(RUN, run)
    return whole_process_s([sys.executable, "-c", END_OF_RUN, str(run)])


def reader_mb_per_s(beside: bool) -> tuple[float, float]:
    """(seconds, MB of JSON per second) of the in-process reader on the big rank, best of 3;
    ``beside``: its scanner may read ahead on a second core (``decode.read_trace``)."""
    import gzip

    from rankscope.orchestrator.ingest import decode

    trace = next(BIG.glob("*.json*"))
    raw_mb = (
        len(gzip.decompress(trace.read_bytes())) / 1e6
        if trace.suffix == ".gz"
        else trace.stat().st_size / 1e6
    )
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        decode.read_trace(trace, beside=beside)
        best = min(best, time.perf_counter() - t)
    return best, raw_mb / best


def make_layered(work: Path, name: str, microbatches: int) -> tuple[Path, int, int]:
    """The large-model job of set ``name`` (made once, :data:`LAYERED_SETS`): (folder,
    point-to-point ops per step over all ranks, MB of gzip on disk). The p2p count is read from
    the traces (``send``/``recv`` kernels)."""
    import gzip
    import re
    import subprocess

    job = work / name
    synth = LAYERED_SETS[name]
    subprocess.run(
        rankscope_argv("synth", str(job), *synth, "--microbatches", str(microbatches)),
        check=True,
        capture_output=True,
        timeout=3600,
    )
    kernel = re.compile(rb'"name": "ncclDevKernel_(?:Send|Recv)[^"]*"')
    p2p = sum(len(kernel.findall(gzip.decompress(f.read_bytes()))) for f in job.glob("*.json.gz"))
    steps = int(synth[synth.index("--steps") + 1])
    size = sum(f.stat().st_size for f in job.glob("*.json.gz")) // 10**6
    (job / "truth.json").unlink(missing_ok=True)  # HTA takes every *.json of its folder
    return job, p2p // steps, size


def hta_or_failure(argv: list[str]) -> tuple[float, str]:
    """(wall s, '' or why HTA failed: its exit status and last line)."""
    import subprocess

    t = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    dt = time.perf_counter() - t
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["?"])[-1][:120]
        return dt, f"failed (exit {res.returncode}: {last})"
    return dt, ""


def interleave(
    rounds: int, a: Callable[[], float], b: Callable[[], float] | None
) -> tuple[list[float], list[float]]:
    """A B A B …: ``rounds`` wall times of each (B skipped when None)."""
    ta: list[float] = []
    tb: list[float] = []
    for _ in range(rounds):
        ta.append(a())
        if b is not None:
            tb.append(b())
    return ta, tb


def cell(times: list[float]) -> str:
    if not times:
        return "—"
    med = statistics.median(times)
    if len(times) == 1:
        return f"{med:.2f} s"
    return f"{med:.2f} s ({min(times):.2f}–{max(times):.2f})"


def ratio(rs: list[float], hta: list[float]) -> str:
    if not rs or not hta:
        return "—"
    r = statistics.median(hta) / statistics.median(rs)
    return f"rankscope {r:.1f}× faster" if r >= 1 else f"rankscope {1 / r:.1f}× slower"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    ap.add_argument("--sets", nargs="+", choices=SETS, default=list(DEFAULT_SETS))
    ap.add_argument("--hta-python", type=Path, default=HTA_PYTHON)
    ap.add_argument("--no-hta", action="store_true", help="rankscope only (the smoke test)")
    ap.add_argument(
        "--microbatches",
        type=int,
        default=PP64_MICROBATCHES,
        help=f"microbatches per step of the pp64 and pp256 jobs (default {PP64_MICROBATCHES})",
    )
    args = ap.parse_args(argv)
    hta_py = None if args.no_hta else args.hta_python
    if hta_py is not None and not hta_py.exists():
        print(f"no {hta_py}: HTA columns skipped (python benchmarks/merge_vs_hta.py --setup-hta)")
        hta_py = None

    compile_rankscope()
    load = os.getloadavg()
    print(
        f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min)"
    )
    print(f"whole processes, interleaved A B, median of {args.rounds} (min–max)\n")
    rows: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="rankscope-tta-") as tmp:
        work = Path(tmp)
        if "dlrm" in args.sets:
            hta_dir = traces_only(DLRM, work / "hta-dlrm")
            hta = (
                None
                if hta_py is None
                else (lambda: whole_process_s([str(hta_py), "-c", HTA_ANALYSE, str(hta_dir)]))
            )
            rs, ht = interleave(args.rounds, lambda: rankscope_dlrm(work), hta)
            rows.append(
                (
                    "param_dlrm_8rank: merge + analyze --json vs HTA load + breakdown + overlap + stragglers",
                    cell(rs),
                    cell(ht),
                    ratio(rs, ht),
                )
            )
            one_dir = traces_only(DLRM, work / "rs-dlrm")
            rs, ht = interleave(args.rounds, lambda: rankscope_dlrm_one(one_dir), hta)
            rows.append(
                (
                    "param_dlrm_8rank: one command, `analyze FOLDER --json` (merges too) vs the same HTA process",
                    cell(rs),
                    cell(ht),
                    ratio(rs, ht),
                )
            )
        if "big" in args.sets:
            hta_dir = traces_only(BIG, work / "hta-big")
            hta = (
                None
                if hta_py is None
                else (lambda: whole_process_s([str(hta_py), "-c", HTA_LOAD, str(hta_dir)]))
            )
            rs, ht = interleave(args.rounds, lambda: rankscope_big(work), hta)
            rows.append(
                (
                    "df_index_resolver (one 54 MB rank): merge vs HTA load",
                    cell(rs),
                    cell(ht),
                    ratio(rs, ht),
                )
            )
        if "end-of-run" in args.sets:
            rs, _ = interleave(args.rounds, lambda: end_of_run(work), None)
            rows.append(
                (
                    "end of `rankscope run` (4-rank example): last rank exit → summary printed",
                    cell(rs),
                    "—",
                    "—",
                )
            )
        for name in (n for n in LAYERED_SETS if n in args.sets):
            job, p2p, size = make_layered(work, name, args.microbatches)
            failed: list[str] = []

            def hta_layered(job: Path = job, failed: list[str] = failed) -> float:
                dt, why = hta_or_failure([str(hta_py), "-c", HTA_ANALYSE, str(job)])
                if why:
                    failed.append(why)
                return dt

            def rankscope_layered(job: Path = job) -> float:
                return rankscope_dlrm_one(job)

            rs, ht = interleave(
                args.rounds, rankscope_layered, None if hta_py is None else hta_layered
            )
            synth = LAYERED_SETS[name]
            ranks, tp, pp, dp = (
                synth[synth.index(f) + 1] for f in ("--ranks", "--tp", "--pp", "--dp")
            )
            rows.append(
                (
                    f"synth {ranks} ranks TP{tp}×PP{pp}×DP{dp}, {args.microbatches} microbatches "
                    f"({p2p:,} point-to-point ops per step, {size} MB gzip): "
                    "`analyze FOLDER` vs HTA load + breakdown + overlap + stragglers",
                    cell(rs),
                    failed[0] if failed else cell(ht),
                    "—" if failed else ratio(rs, ht),
                )
            )
    if "reader" in args.sets:
        for beside, how in ((False, "one core"), (True, "its scanner ahead on a second core")):
            secs, rate = reader_mb_per_s(beside)
            rows.append(
                (
                    f"reader alone, in-process, {how} (best of 3)",
                    f"{secs:.3f} s = {rate:.0f} MB/s",
                    "—",
                    "—",
                )
            )

    print("| work | rankscope | HTA 0.5.0 | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
