"""Small hand-built frames and stores in the store's format, with answers known by hand.

Shared by the analysis tests (breakdown, collectives, stragglers, CLI). Stores are real HDF5
files written through ``rankscope.analysis.store.reader.StoreWriter``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rankscope.analysis.store import schema
from rankscope.analysis.store.schema import EventKind as K
from rankscope.analysis.store.schema import LaneKind

#: (ts, dur, name, kind, lane[, step[, corr[, coll]]])
Row = tuple[Any, ...]


def events(rows: list[Row]) -> pd.DataFrame:
    """An events frame (schema.EVENT_COLUMNS), sorted by ts, from short rows."""
    full = [tuple(r) + (-1,) * (8 - len(r)) for r in rows]
    df = pd.DataFrame(full, columns=["ts", "dur", "name", "kind", "lane", "step", "corr", "coll"])
    df["kind"] = [int(k) for k in df["kind"]]
    df["cat"] = "test"
    df["window"] = 0
    df = df.sort_values("ts", kind="stable").reset_index(drop=True)
    out = df[list(schema.EVENT_COLUMNS)].astype(
        {k: v for k, v in schema.EVENT_COLUMNS.items() if v != "category"}
    )
    out["name"] = out["name"].astype("category")
    out["cat"] = out["cat"].astype("category")
    return out


def lanes(spec: list[tuple[LaneKind, str]]) -> pd.DataFrame:
    """Lanes frame: one (kind, name) per lane; GPU lane names are "stream N"."""
    return pd.DataFrame(
        {
            "lane": np.arange(len(spec), dtype=np.int32),
            "kind": np.array([int(k) for k, _ in spec], dtype=np.int8),
            "pid": ["1"] * len(spec),
            "tid": [
                n if k == LaneKind.GPU_STREAM else str(100 + i) for i, (k, n) in enumerate(spec)
            ],
            "name": [n for _, n in spec],
        }
    )


GPU_LANES = [
    (LaneKind.THREAD, "python3"),
    (LaneKind.GPU_STREAM, "stream 7"),
    (LaneKind.GPU_STREAM, "stream 20"),
]
CPU_LANES = [
    (LaneKind.THREAD, "thread 1 (python3)"),
    (LaneKind.THREAD, "thread 2 (pt_gloo_runloop)"),
]
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def gpu_rank() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two steps; compute A [100,300), NCCL [250,450), memcpy [500,600) in step 1; compute B
    [1200,1300) launched in step 2 (the last step: HTA drops it). Times in µs (stored in ns)."""
    ev = events(
        [
            (0, 1000000, "ProfilerStep#1", K.PROFILER_STEP, 0, 1),
            (1000000, 1000000, "ProfilerStep#2", K.PROFILER_STEP, 0, 2),
            (10000, 5000, "cudaLaunchKernel", K.RUNTIME, 0, 1, 1),
            (20000, 5000, "cudaLaunchKernel", K.RUNTIME, 0, 1, 2),
            (30000, 5000, "cudaMemcpyAsync", K.RUNTIME, 0, 1, 3),
            (1100000, 5000, "cudaLaunchKernel", K.RUNTIME, 0, 2, 4),
            (100000, 200000, "void gemm_kernel<float>(float*)", K.KERNEL_COMPUTE, 1, 1, 1),
            (
                250000,
                200000,
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                K.KERNEL_COMM,
                2,
                1,
                2,
            ),
            (500000, 100000, "Memcpy HtoD (Pageable -> Device)", K.MEMCPY, 1, 1, 3),
            (1200000, 100000, "void relu_kernel<float>(float*)", K.KERNEL_COMPUTE, 1, 2, 4),
        ]
    )
    return ev, lanes(GPU_LANES)


def cpu_rank(
    shift: int = 0, extra_compute: int = 0, extra_input: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One gloo DDP step [0,1000) (see test_breakdown for the hand-computed answer)."""
    s = shift
    ev = events(
        [
            (s + 0, 1000, "ProfilerStep#3", K.PROFILER_STEP, 0, 3),
            (s + 0, 100 + extra_input, LOADER, K.USER_ANNOTATION, 0, 3),
            (s + 100, 300, "forward", K.USER_ANNOTATION, 0, 3),
            (s + 120, 260, "aten::mm", K.CPU_OP, 0, 3),
            (s + 400, 500, "backward", K.USER_ANNOTATION, 0, 3),
            (s + 400, 100 + extra_compute, "aten::mm", K.CPU_OP, 0, 3),
            (s + 500, 20, "c10d::allreduce_", K.COMM_ENQUEUE, 0, 3),
            (s + 530, 260, "gloo:all_reduce", K.COMM_CPU, 1, 3, -1, 0),
            (s + 800, 20, "torch.distributed.ddp.reducer::copy_bucket_to_grad", K.CPU_OP, 0, 3),
            (s + 900, 50, "Optimizer.step#SGD.step", K.CPU_OP, 0, 3),
        ]
    )
    return ev, lanes(CPU_LANES)


def write_store(
    path: Path,
    ranks: dict[int, tuple[pd.DataFrame, pd.DataFrame]],
    collectives: pd.DataFrame | None = None,
    clock: pd.DataFrame | None = None,
    hosts: dict[int, str] | None = None,
) -> Path:
    """A real HDF5 store holding ``ranks`` (events frames as from :func:`events`)."""
    from rankscope.analysis.store.reader import StoreWriter

    with StoreWriter(path, attrs={"world_size": len(ranks), "run_id": "test"}) as w:
        steps = []
        for rank, (ev, ln) in ranks.items():
            cols = {c: ev[c].to_numpy() for c in schema.EVENT_COLUMNS if c not in ("name", "cat")}
            cols["name"] = w.intern([str(x) for x in ev["name"]])
            cols["cat"] = w.intern([str(x) for x in ev["cat"]])
            w.write_rank(rank, cols, ln, {"host": (hosts or {}).get(rank, "node0")})
            st = ev[ev["kind"] == int(K.PROFILER_STEP)]
            for r in st.itertuples():
                steps.append({"rank": rank, "step": r.step, "start": r.ts, "end": r.ts + r.dur})
        tables: dict[str, pd.DataFrame] = {
            "steps": pd.DataFrame(steps, columns=list(schema.STEP_COLUMNS)),
            "clock": clock
            if clock is not None
            else pd.DataFrame(
                {
                    "rank": list(ranks),
                    "host": [(hosts or {}).get(r, "node0") for r in ranks],
                    "offset_ns": 0,
                    "drift_ppb": 0.0,
                    "t_ref_ns": 0,
                    "uncertainty_ns": 1000,
                    "method": "reference",
                    "violations_before": 0,
                    "violations_after": 0,
                }
            ),
        }
        if collectives is not None:
            tables["collectives"] = collectives
        w.write_tables(tables)
    return path


def collectives(
    arrivals: dict[int, list[int]], ends: dict[int, list[int]], op: str = "allreduce"
) -> pd.DataFrame:
    """Long collectives table: ``arrivals[rank][k]`` / ``ends[rank][k]`` of collective k."""
    rows = []
    for rank, starts in arrivals.items():
        for k, (a, e) in enumerate(zip(starts, ends[rank], strict=True)):
            rows.append(
                {
                    "coll": k,
                    "group": "0",
                    "seq": k,
                    "op": op,
                    "bytes": 4096,
                    "rank": rank,
                    "start": a,
                    "end": e,
                    "event": -1,
                }
            )
    return pd.DataFrame(rows, columns=list(schema.COLLECTIVE_COLUMNS)).astype(
        {k: v for k, v in schema.COLLECTIVE_COLUMNS.items() if v != "str"}
    )


def merged(data_dir: Path, name: str, out_dir: Path) -> Path:
    """Merge ``tests/data/<name>`` with the real merge into ``out_dir`` (once per path)."""
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    out = out_dir / (name.replace("/", "_") + ".h5")
    if not out.exists():
        merge_run_dir(data_dir / name, output=out, scheduler="synchronous", quiet=True)
    return out


def synthetic_store(
    folder: Path,
    *,
    ranks: int,
    stragglers: list[tuple[int, float, float]],
    seed: int,
    steps: int = 3,
    ranks_per_host: int = 8,
) -> Path:
    """A ``rankscope synth`` job in ``folder`` (truth.json beside it), merged in-process; returns
    the store. ``stragglers``: (rank, extra ms, fraction of steps)."""
    from rankscope.analysis.engine.scheduler import SYNCHRONOUS
    from rankscope.orchestrator.ingest.merge import merge_run_dir
    from rankscope.orchestrator.synth import SynthConfig, generate

    generate(
        SynthConfig(
            ranks=ranks,
            ranks_per_host=ranks_per_host,
            steps=steps,
            seed=seed,
            stragglers=stragglers,
        ),
        folder,
    )
    return Path(merge_run_dir(folder, quiet=True, scheduler=SYNCHRONOUS))
