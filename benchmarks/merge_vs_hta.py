"""Merge benchmark: rankscope merge vs Holistic Trace Analysis' load, on the same files.

    python benchmarks/merge_vs_hta.py                 # all parts, figures printed
    python benchmarks/merge_vs_hta.py --skip-scaling  # faster

Parts (one run each; this is a figure-printing script, never a test):

1. **Ingest throughput** on ``tests/data/hta/df_index_resolver`` (54 MB of JSON, one rank):
   ``rankscope merge`` end to end (read + align + write the store; in-process and on a
   LocalCluster) against ``hta.trace_analysis.TraceAnalysis(trace_dir=...)`` from PyPI
   ``HolisticTraceAnalysis==0.5.0``, which runs in its own venv (``--hta-python``, default
   /tmp/hta-venv/bin/python; create it with ``--setup-hta``: ``python -m venv
   --system-site-packages`` + pip, so the main environment is never touched).
2. **Peak RSS** of a merge process (``VmHWM`` of a child running the in-process merge),
   also minus the same process's RSS after its imports, against the largest rank's JSON size:
   on that rank and on the same rank's events tiled 8x (430 MB of JSON), where the fixed
   interpreter + library baseline no longer dominates.
3. **Compression** of the store's event columns: gzip / lzf / none, size and write/read time.
4. **Scaling**: the df_index_resolver rank replicated to 1, 2, 4, 8 ranks (``distributedInfo``
   rank rewritten per copy, Kineto's own layout kept so the streaming reader is what is timed), merge time per rank count, in-process and on one LocalCluster
   started beforehand (so its start-up is not counted).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DF_INDEX = ROOT / "tests" / "data" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"
HTA_VENV = Path("/tmp/hta-venv")
HTA_PACKAGE = "HolisticTraceAnalysis==0.5.0"
RANK_COUNTS = (1, 2, 4, 8)
#: Tilings of the df_index_resolver events for the peak-RSS part (1 = the file as it is).
RSS_TILES = (1, 8)
#: A step annotation's name and number in the JSON text (renumbered per copy by kineto_text).
STEP_NUMBER = re.compile(rb"ProfilerStep#(\d+)")
#: Step numbers of copy k are the original's + k * this.
STEP_STRIDE = 1_000_000

HTA_SCRIPT = """
import sys, time, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
TraceAnalysis(trace_dir=sys.argv[1])
print(time.perf_counter() - t)
"""

# VmHWM (the process's own RSS high-water mark), not ru_maxrss: on Linux ru_maxrss survives
# execve, so a child would report the benchmark parent's RSS.
RSS_SCRIPT = """
import sys
from pathlib import Path
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
import h5py, msgspec, numpy, pandas  # the merge's imports, loaded before the baseline
from rankscope.orchestrator.ingest import comm_links
from rankscope.orchestrator.ingest import merge
from rankscope.orchestrator.ingest import decode
from rankscope.orchestrator.ingest import discovery
from rankscope.orchestrator.ingest import rank_columns
from rankscope.orchestrator.ingest import clock
import rankscope.analysis.store.reader
base = hwm()
merge.merge_run_dir(Path(sys.argv[1]), output=Path(sys.argv[2]), scheduler="synchronous", quiet=True)
print(base, hwm())
"""


def json_bytes(path: Path) -> int:
    """Size of the JSON text (gunzipped)."""
    return (
        len(gzip.decompress(path.read_bytes()))
        if path.name.endswith(".gz")
        else path.stat().st_size
    )


def setup_hta(venv: Path) -> None:
    """Create the separate HTA venv (system site packages visible, nothing installed into them)."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    # HTA 0.5.0 imports psutil without declaring it (absent from a bare interpreter's site)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", HTA_PACKAGE, "psutil"], check=True)


def time_merge(folder: Path, out: Path, scheduler: str | None) -> float:
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    t = time.perf_counter()
    merge_run_dir(folder, output=out, scheduler=scheduler, quiet=True)
    return time.perf_counter() - t


def time_hta(folder: Path, python: Path) -> float | None:
    if not python.exists():
        return None
    proc = subprocess.run(
        [str(python), "-c", HTA_SCRIPT, str(folder)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        print(f"  HTA failed: {proc.stderr.strip().splitlines()[-1:]}")
        return None
    return float(proc.stdout.strip().splitlines()[-1])


def ingest(tmp: Path, hta_python: Path) -> dict[str, float]:
    from rankscope.orchestrator.ingest.decode import read_trace

    folder = tmp / "one"
    folder.mkdir()
    shutil.copy2(DF_INDEX, folder / DF_INDEX.name)
    mb = json_bytes(DF_INDEX) / 1e6
    read_trace(DF_INDEX)  # warm the imports and the page cache
    t = time.perf_counter()
    read_trace(DF_INDEX)
    t_read = time.perf_counter() - t
    t_sync = time_merge(folder, tmp / "sync.h5", "synchronous")
    from distributed import LocalCluster

    t = time.perf_counter()
    with LocalCluster(
        n_workers=1, threads_per_worker=1, dashboard_address=":0", silence_logs=40
    ) as cluster:
        t_cluster = time_merge(folder, tmp / "cluster.h5", cluster.scheduler_address)
        t_start = time.perf_counter() - t - t_cluster
    t_hta = time_hta(folder, hta_python)
    fig = {
        "json_mb": mb,
        "reader_s": t_read,
        "merge_sync_s": t_sync,
        "merge_cluster_s": t_cluster,
        "cluster_start_s": t_start,
        "hta_s": t_hta or float("nan"),
    }
    print(f"ingest: {DF_INDEX.name}, {mb:.1f} MB of JSON")
    print(f"  reader only (decode.read_trace)      {t_read:6.2f} s  {mb / t_read:7.1f} MB/s")
    print(f"  rankscope merge, in-process          {t_sync:6.2f} s  {mb / t_sync:7.1f} MB/s")
    print(f"  rankscope merge, on a LocalCluster   {t_cluster:6.2f} s  {mb / t_cluster:7.1f} MB/s")
    print(f"    (+ starting that cluster            {t_start:6.2f} s)")
    if t_hta:
        print(f"  HTA 0.5.0 TraceAnalysis load         {t_hta:6.2f} s  {mb / t_hta:7.1f} MB/s")
        print(
            f"  speed-up vs HTA: merge in-process {t_hta / t_sync:.1f}x, "
            f"on a running cluster {t_hta / t_cluster:.1f}x, reader {t_hta / t_read:.1f}x"
        )
    else:
        print(f"  HTA: not available ({hta_python}; run with --setup-hta)")
    return fig


def _renumbered(events: bytes, add: int) -> bytes:
    """``events`` with ``add`` added to every ProfilerStep number."""
    return STEP_NUMBER.sub(lambda m: b"ProfilerStep#%d" % (int(m[1]) + add), events)


def kineto_text(tiles: int = 1, rank: int | None = None, world: int = 1) -> bytes:
    """df_index_resolver's JSON text in Kineto's own layout, its events repeated ``tiles`` times.

    Text surgery rather than ``json.dumps``: the streaming reader relies on Kineto's layout (one
    event per indented block), and a re-serialised file would silently take the whole-file path.
    ``rank`` rewrites ``distributedInfo`` (for replicated ranks).
    """
    text = gzip.decompress(DF_INDEX.read_bytes())
    start = text.index(b"[", text.index(b'"traceEvents"')) + 1
    end = text.rindex(b"]")
    events = text[start:end].rstrip()  # "\n  {...\n  }"
    # Each copy gets its own step numbers: one rank records each step once, and a file with a
    # step recorded several times is taken for several ranks in one file (multirank.py).
    body = b",".join(_renumbered(events, k * STEP_STRIDE) for k in range(tiles))
    out = text[:start] + body + b"\n  " + text[end:]
    if rank is not None:
        info = json.dumps({"backend": "nccl", "rank": rank, "world_size": world}).encode()
        key = b'"distributedInfo": '
        i = out.index(key) + len(key)
        out = out[:i] + info + out[out.index(b"}", i) + 1 :]
    return out


def peak_rss(tmp: Path) -> list[dict[str, float]]:
    figures = []
    for tiles in RSS_TILES:
        folder = tmp / f"rss{tiles}"
        folder.mkdir()
        if tiles == 1:
            shutil.copy2(DF_INDEX, folder / DF_INDEX.name)
            size = json_bytes(DF_INDEX)
        else:
            text = kineto_text(tiles)
            size = len(text)
            (folder / "rank-0.json.gz").write_bytes(gzip.compress(text, compresslevel=1))
            del text
        proc = subprocess.run(
            [sys.executable, "-c", RSS_SCRIPT, str(folder), str(tmp / f"rss{tiles}.h5")],
            capture_output=True,
            text=True,
            check=True,
        )
        base, peak = (int(x) for x in proc.stdout.split())
        shutil.rmtree(folder)
        print(
            f"peak RSS of one merge process (largest rank: df_index_resolver x{tiles}, "
            f"{size / 1e6:.1f} MB JSON, gzipped on disk)"
        )
        print(f"  after imports {base / 1e6:6.1f} MB, peak {peak / 1e6:6.1f} MB")
        print(f"  peak / JSON size             {peak / size:4.2f}x  (target <= 1.5x)")
        print(f"  (peak - imports) / JSON size {(peak - base) / size:4.2f}x")
        figures.append(
            {
                "tiles": tiles,
                "rss_base_mb": base / 1e6,
                "rss_peak_mb": peak / 1e6,
                "json_mb": size / 1e6,
            }
        )
    return figures


def compression(tmp: Path) -> None:
    import h5py
    import numpy as np
    from rankscope.orchestrator.ingest.decode import read_trace

    ft = read_trace(DF_INDEX)
    cols = {k: v for k, v in ft.columns.items()}
    raw = sum(v.nbytes for v in cols.values())
    print(f"compression of {len(cols['ts'])} events x {len(cols)} columns ({raw / 1e6:.1f} MB raw)")
    for name, kw in [
        ("none", {}),
        ("lzf+shuffle", {"compression": "lzf", "shuffle": True}),
        ("gzip-1+shuffle", {"compression": "gzip", "compression_opts": 1, "shuffle": True}),
        ("gzip-4+shuffle", {"compression": "gzip", "compression_opts": 4, "shuffle": True}),
    ]:
        path = tmp / f"c-{name}.h5"
        t = time.perf_counter()
        with h5py.File(path, "w") as f:
            for k, v in cols.items():
                f.create_dataset(k, data=v, chunks=(min(len(v), 1 << 16),), **kw)
        tw = time.perf_counter() - t
        t = time.perf_counter()
        with h5py.File(path, "r") as f:
            total = sum(int(np.asarray(f[k][()]).size) for k in cols)
        tr = time.perf_counter() - t
        assert total == len(cols["ts"]) * len(cols)
        print(
            f"  {name:15s} {path.stat().st_size / 1e6:6.2f} MB  write {tw * 1e3:6.1f} ms  "
            f"read {tr * 1e3:6.1f} ms"
        )


def scaling(tmp: Path) -> None:
    """Merge time vs ranks: in-process (the work itself) and on one running LocalCluster."""
    from distributed import LocalCluster

    cores = os.cpu_count() or 1
    print(f"scaling: df_index_resolver replicated (54 MB JSON per rank), {cores} cores")
    print("  ranks   in-process (s/rank)      LocalCluster, started once (s/rank)")
    with LocalCluster(
        n_workers=cores, threads_per_worker=1, dashboard_address=":0", silence_logs=40
    ) as cluster:
        for n in RANK_COUNTS:
            folder = tmp / f"ranks{n}"
            folder.mkdir()
            for r in range(n):
                (folder / f"rank-{r}.json.gz").write_bytes(
                    gzip.compress(kineto_text(rank=r, world=n), compresslevel=1)
                )
            t_sync = time_merge(folder, tmp / f"s{n}.h5", "synchronous")
            t_cl = time_merge(folder, tmp / f"c{n}.h5", cluster.scheduler_address)
            print(
                f"  {n:5d}   {t_sync:6.2f} s ({t_sync / n:4.2f})        {t_cl:6.2f} s ({t_cl / n:4.2f})"
            )
            shutil.rmtree(folder)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hta-python", type=Path, default=HTA_VENV / "bin" / "python")
    parser.add_argument(
        "--setup-hta", action="store_true", help=f"create {HTA_VENV} with {HTA_PACKAGE}"
    )
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()
    if args.setup_hta and not args.hta_python.exists():
        setup_hta(HTA_VENV)
    print(
        f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} (other work skews times)"
    )
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as d:
        tmp = Path(d)
        ingest(tmp, args.hta_python)
        peak_rss(tmp)
        compression(tmp)
        if not args.skip_scaling:
            scaling(tmp)
    print(
        f"(this process: max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB)"
    )


if __name__ == "__main__":
    main()
