"""Analysis at scale, and side by side with HTA (prints figures; not a test).

    python benchmarks/analysis_scale.py                  # both parts
    python benchmarks/analysis_scale.py --part scale     # 64 ranks x ~200k events
    python benchmarks/analysis_scale.py --part hta       # vs HTA 0.5.0 on param_dlrm_8rank

**scale**: replicates the real 1-rank GPU trace ``tests/data/hta/df_index_resolver`` (216k events,
1,616 NCCL kernels) into a 64-rank store with the store writer — each rank shifted by a few µs of
jitter, the collectives table replicated so every collective has 64 ranks — then runs the whole
analysis (``rankscope.analysis.analyze``) on a LocalCluster sized to the machine and in-process,
reporting wall time and the peak RSS of this process plus its Dask workers (sampled every 50 ms).

**hta**: the 8-rank ``param_dlrm_8rank`` set: HTA 0.5.0 (load + temporal breakdown + comm/compute
overlap + potential stragglers), run in its own venv through a subprocess (``--hta-python``,
default ``/tmp/hta-venv/bin/python``; create it with ``python -m venv --system-site-packages
/tmp/hta-venv && /tmp/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0``), against rankscope
(merge from the same JSON + the whole analysis).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SOURCE_SET = DATA / "hta" / "df_index_resolver"
HTA_SET = DATA / "param_dlrm_8rank"
DEFAULT_HTA_PYTHON = Path("/tmp/hta-venv/bin/python")
RANKS = 64
#: events per rank wanted: the source trace is tiled (repeated back to back) up to this many
EVENTS_PER_RANK = 200_000
#: where the replicated store is cached between runs
CACHE = Path(tempfile.gettempdir()) / "rankscope-bench"
SAMPLE_S = 0.05

HTA_SCRIPT = """
import json, sys, time, logging, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
t1 = time.perf_counter()
ta.get_temporal_breakdown(visualize=False)
t2 = time.perf_counter()
ta.get_comm_comp_overlap(visualize=False)
t3 = time.perf_counter()
s = ta.get_potential_stragglers(num_candidates=2)
t4 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "temporal_s": t2 - t1, "overlap_s": t3 - t2,
                  "stragglers_s": t4 - t3, "total_s": t4 - t0, "stragglers": [int(r) for r in s]}))
"""


class PeakRSS:
    """Samples the RSS of this process and all its children; ``peak`` in bytes."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += p.memory_info().rss
            self.peak = max(self.peak, total)
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def build_store(out: Path, ranks: int, target: int = EVENTS_PER_RANK) -> tuple[Path, int]:
    """The replicated store (cached); returns its path and events per rank.

    The source rank's events are tiled back to back until at least ``target`` events, then
    written ``ranks`` times with per-rank arrival jitter.
    """
    import numpy as np
    import pandas as pd
    from rankscope.analysis.store import schema
    from rankscope.analysis.store.reader import StoreWriter, open_store
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    out.mkdir(parents=True, exist_ok=True)
    src = out / "source.h5"
    if not src.exists():
        merge_run_dir(SOURCE_SET, output=src, scheduler="synchronous", quiet=True)
    with open_store(src) as s:
        (rank,) = s.ranks
        events = s.events(rank)
        lanes = s.lanes(rank)
        colls = s.collectives()
        meta = s.rank_meta(rank)
    reps = -(-target // len(events))
    n = reps * len(events)
    store = out / f"replicated-{ranks}x{n}.h5"
    if store.exists():
        return store, n
    rng = np.random.default_rng(0)
    tmp = store.with_suffix(".tmp")
    t0 = time.perf_counter()
    with StoreWriter(tmp, attrs={"world_size": ranks, "run_id": "bench-replicated"}) as w:
        names = np.tile(w.intern([str(x) for x in events["name"]]), reps)
        cats = np.tile(w.intern([str(x) for x in events["cat"]]), reps)
        span = int((events["ts"] + events["dur"]).max() - events["ts"].min()) + 1_000_000
        base = {
            c: np.tile(events[c].to_numpy(), reps)
            for c in schema.EVENT_COLUMNS
            if c not in ("name", "cat")
        }
        base["ts"] = base["ts"] + np.repeat(np.arange(reps, dtype=np.int64) * span, len(events))
        n_colls = int(colls["coll"].max()) + 1 if len(colls) else 0
        tiles = []
        for k in range(reps):
            c = colls.copy()
            c["coll"] = c["coll"] + k * n_colls
            c["start"] = c["start"] + k * span
            c["end"] = c["end"] + k * span
            tiles.append(c)
        colls = pd.concat(tiles, ignore_index=True)
        shifts = rng.integers(0, 50_000, size=ranks)  # up to 50 µs of arrival jitter per rank
        all_colls = []
        for r in range(ranks):
            cols = dict(base, name=names, cat=cats)
            cols["ts"] = base["ts"] + shifts[r]
            w.write_rank(r, cols, lanes, {**meta, "host": f"node{r // 8}", "rank": r})
            c = colls.copy()
            c["rank"] = r
            c["start"] = c["start"] + shifts[r]
            c["end"] = c["end"] + int(shifts.max())
            all_colls.append(c)
        clock = pd.DataFrame(
            {
                "rank": np.arange(ranks),
                "host": [f"node{r // 8}" for r in range(ranks)],
                "offset_ns": 0,
                "drift_ppb": 0.0,
                "t_ref_ns": 0,
                "uncertainty_ns": 1000,
                "method": "runtime",
                "violations_before": 0,
                "violations_after": 0,
            }
        )
        w.write_tables({"collectives": pd.concat(all_colls, ignore_index=True), "clock": clock})
    tmp.rename(store)
    print(f"built {store} ({ranks} ranks x {n:,} events) in {time.perf_counter() - t0:.1f} s")
    return store, n


def part_scale(ranks: int) -> dict[str, Any]:
    from rankscope.analysis.engine.driver import LOCAL, SYNCHRONOUS, ClusterSpec, analyze

    store, n = build_store(CACHE, ranks)
    size = store.stat().st_size
    results: dict[str, Any] = {
        "ranks": ranks,
        "events_per_rank": n,
        "store_mb": round(size / 2**20, 1),
    }
    for label, scheduler in (("local", LOCAL), ("synchronous", SYNCHRONOUS)):
        with PeakRSS() as rss:
            t0 = time.perf_counter()
            a = analyze(store, ClusterSpec(scheduler=scheduler))
            wall = time.perf_counter() - t0
        results[label] = {"wall_s": round(wall, 2), "peak_rss_gb": round(rss.peak / 2**30, 2)}
        print(
            f"{label:12s} {ranks} ranks x {n:,} events: {wall:6.2f} s, peak RSS {rss.peak / 2**30:.2f} GB "
            f"(this process + Dask workers); {len(a.waits):,} collective rows, "
            f"stragglers {a.straggler_ranks()}"
        )
    return results


def part_hta(hta_python: Path) -> dict[str, Any]:
    from rankscope.analysis.engine.driver import LOCAL, SYNCHRONOUS, ClusterSpec, analyze
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    out: dict[str, Any] = {}
    if hta_python.exists():
        runs = []
        for _ in range(3):
            res = subprocess.run(
                [str(hta_python), "-c", HTA_SCRIPT, str(HTA_SET)],
                capture_output=True,
                text=True,
                check=False,
            )
            if res.returncode != 0:
                print("HTA failed:", res.stderr[-2000:])
                break
            runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
        if runs:
            best = min(runs, key=lambda r: r["total_s"])
            out["hta"] = best
            print(
                f"HTA 0.5.0    load {best['load_s']:.2f} s + temporal {best['temporal_s']:.2f} s + overlap "
                f"{best['overlap_s']:.2f} s + stragglers {best['stragglers_s']:.2f} s = {best['total_s']:.2f} s "
                f"(best of {len(runs)}); potential stragglers {best['stragglers']}"
            )
    else:
        print(f"no HTA venv at {hta_python}: skipping HTA (see this file's docstring)")
    with tempfile.TemporaryDirectory() as tmp:
        best_merge, best_sync, best_local = 1e9, 1e9, 1e9
        for i in range(3):
            store = Path(tmp) / f"dlrm-{i}.h5"
            t0 = time.perf_counter()
            merge_run_dir(HTA_SET, output=store, scheduler="synchronous", quiet=True)
            t1 = time.perf_counter()
            a = analyze(store, ClusterSpec(scheduler=SYNCHRONOUS))
            t2 = time.perf_counter()
            best_merge, best_sync = min(best_merge, t1 - t0), min(best_sync, t2 - t1)
        t0 = time.perf_counter()
        analyze(store, ClusterSpec(scheduler=LOCAL))
        best_local = time.perf_counter() - t0
    out["rankscope"] = {
        "merge_s": round(best_merge, 2),
        "analysis_sync_s": round(best_sync, 2),
        "analysis_local_s": round(best_local, 2),
    }
    print(
        f"rankscope    merge {best_merge:.2f} s + analysis {best_sync:.2f} s in-process "
        f"(= {best_merge + best_sync:.2f} s; LocalCluster analysis {best_local:.2f} s incl. start-up); "
        f"stragglers {a.straggler_ranks()}, most often last: rank {int(a.stragglers.iloc[0]['rank'])}"
    )
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--part", choices=("scale", "hta", "all"), default="all")
    p.add_argument("--ranks", type=int, default=RANKS)
    p.add_argument("--hta-python", type=Path, default=DEFAULT_HTA_PYTHON)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    print(f"machine: {os.cpu_count()} CPU(s), Python {sys.version.split()[0]}")
    figures: dict[str, Any] = {}
    if args.part in ("scale", "all"):
        figures["scale"] = part_scale(args.ranks)
    if args.part in ("hta", "all"):
        figures["hta_side_by_side"] = part_hta(args.hta_python)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
