"""Key performance indicators of one run: the figures ``rankscope compare`` tests, run against run.

A pure function of an :class:`~rankscope.analysis.engine.driver.Analysis` (:func:`kpis`) gives a
:class:`Kpis`: a summary row per (KPI, rank) — p50/p90/p99 and mean — and the per-step
**samples** behind it, which the comparison (:mod:`rankscope.analysis.conclude.compare`) tests step by
step. Rank ``JOB_RANK`` (-1) is the job: its per-step sample is the mean over ranks of that step
(ranks of one step are tied together by the step's collectives, so they are one observation, not
``world_size`` independent ones); its percentiles are over every (rank, step) of the profiled
steps. Definitions in docs/compare.md ("KPIs").

Units are in :data:`UNITS` (SI: seconds, bytes, samples/s, FLOP/s, a fraction for MFU), values
float64. This module imports nothing heavy at module level.

Why one module of ~540 lines: the KPI definitions and the one function that turns them and what
each rank recorded about its steps (samples, FLOPs, device: :func:`rank_facts`, in
``rank_facts.py``, re-exported here) into per-step samples are read together; summary.json's
rendering is 40 of those lines.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from rankscope.analysis.compute.step_series import job_samples
from rankscope.analysis.conclude.rank_facts import DEVICE_NAME_KEY as DEVICE_NAME_KEY
from rankscope.analysis.conclude.rank_facts import FLOPS_KEY as FLOPS_KEY
from rankscope.analysis.conclude.rank_facts import SAMPLES_KEY as SAMPLES_KEY
from rankscope.analysis.conclude.rank_facts import STEP_FLOPS_KEY as STEP_FLOPS_KEY
from rankscope.analysis.conclude.rank_facts import STEP_SAMPLES_KEY as STEP_SAMPLES_KEY
from rankscope.analysis.conclude.rank_facts import RankFacts as RankFacts
from rankscope.analysis.conclude.rank_facts import _number as _number
from rankscope.analysis.conclude.rank_facts import rank_facts as rank_facts

if TYPE_CHECKING:
    from rankscope.analysis.engine.driver import Analysis

#: The rank of the job-level rows (every rank together).
JOB_RANK = -1


class Kpi(enum.StrEnum):
    """One key performance indicator (``Kpis.summary`` ``kpi``; summary.json ``kpis[].kpi``)."""

    STEP_TIME = "step_time"
    """Wall time of a profiled step (the breakdown's step window), s."""
    THROUGHPUT = "throughput"
    """Samples (or tokens) per second: samples per step / step time; only when known."""
    COMPUTE = "compute"
    """Compute time per step (breakdown ``compute_ns``), s."""
    EXPOSED_COMM = "exposed_comm"
    """Communication nothing hides, per step (``comm_exposed_ns``), s."""
    WAIT = "wait"
    """Time spent in collectives waiting for the last rank, per step (collectives' ``wait_ns`` of
    the collectives that start in the step), s."""
    TRANSFER = "transfer"
    """Time collectives spent moving data once all ranks arrived, per step, s."""
    INPUT = "input"
    """DataLoader time per step (``input_ns``), s."""
    IDLE = "idle"
    """Nothing recorded, per step (``idle_ns``), s."""
    MEMORY_COPY = "memory_copy"
    """GPU memcpy/memset alone, per step (``memory_ns``; 0 on CPU), s."""
    PEAK_MEMORY = "peak_memory"
    """Peak allocated bytes per step (only with ``--profile-memory``)."""
    FLOPS = "flops"
    """Achieved FLOP/s: FLOPs per step / step time (only when the run recorded FLOP counts)."""
    MFU = "mfu"
    """Model FLOP utilisation: achieved FLOP/s / the device's peak (GPU only, peak known)."""
    RUN_STEP_TIME = "run_step_time"
    """The job's step time at EVERY step of the whole run, windows or not (the ranks' step
    logs: ``compute/step_series.py``), s; the job's row only (its sample is the job's step)."""


#: Unit of each KPI's values.
UNITS: dict[Kpi, str] = {
    Kpi.STEP_TIME: "s",
    Kpi.THROUGHPUT: "samples/s",
    Kpi.COMPUTE: "s",
    Kpi.EXPOSED_COMM: "s",
    Kpi.WAIT: "s",
    Kpi.TRANSFER: "s",
    Kpi.INPUT: "s",
    Kpi.IDLE: "s",
    Kpi.MEMORY_COPY: "s",
    Kpi.PEAK_MEMORY: "bytes",
    Kpi.FLOPS: "FLOP/s",
    Kpi.MFU: "share",
    Kpi.RUN_STEP_TIME: "s",
}

#: KPIs where a larger value is better (every other one: smaller is better).
HIGHER_IS_BETTER = frozenset({Kpi.THROUGHPUT, Kpi.FLOPS, Kpi.MFU})

#: KPIs that are a part of the step time (their changes are also judged against the step).
TIME_CATEGORIES = (
    Kpi.COMPUTE,
    Kpi.EXPOSED_COMM,
    Kpi.WAIT,
    Kpi.TRANSFER,
    Kpi.INPUT,
    Kpi.IDLE,
    Kpi.MEMORY_COPY,
)

#: Breakdown column of each time category measured by the breakdown.
_BREAKDOWN_COLUMN: dict[Kpi, str] = {
    Kpi.COMPUTE: "compute_ns",
    Kpi.EXPOSED_COMM: "comm_exposed_ns",
    Kpi.INPUT: "input_ns",
    Kpi.IDLE: "idle_ns",
    Kpi.MEMORY_COPY: "memory_ns",
}

#: Peak dense FLOP/s of known accelerators (16-bit tensor cores, no sparsity; vendor data sheets).
#: Matched by substring, case-insensitive, longest key first, against the device name.
PEAK_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 PCIe": 756e12,
    "H100": 756e12,
    "GH200": 989e12,
    "A100": 312e12,
    "A10G": 70e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "V100": 125e12,
    "T4": 65e12,
    "MI300X": 1307e12,
    "MI250X": 383e12,
}

#: Columns of :attr:`Kpis.summary` (one row per KPI and rank; ``rank`` JOB_RANK: the job).
KPI_COLUMNS: dict[str, str] = {
    "kpi": "str",  # Kpi
    "rank": "int32",
    "unit": "str",  # UNITS
    "steps": "int64",  # samples behind the row
    "mean": "float64",
    "p50": "float64",
    "p90": "float64",
    "p99": "float64",
}

#: Columns of :attr:`Kpis.samples` (one value per KPI, rank and profiled step).
SAMPLE_COLUMNS: dict[str, str] = {
    "kpi": "str",
    "rank": "int32",
    "step": "int32",
    "value": "float64",
}


@dataclasses.dataclass(frozen=True)
class KpiConfig:
    """What the trace cannot say about a run, given by the user (all optional)."""

    samples_per_step: float | None = None
    """Samples (or tokens) one rank processes per step; None: read from the store if recorded,
    else no throughput."""
    sample_unit: str = "samples"
    """What a sample is ("samples", "tokens"): the throughput's unit is ``<unit>/s``."""
    flops_per_step: float | None = None
    """FLOPs one rank executes per step; None: read from the store if recorded, else no FLOP/s."""
    device_name: str | None = None
    """The accelerator's name ("H100 SXM") for the peak FLOP/s; None: the store's, if any."""
    peak_flops: float | None = None
    """The device's peak FLOP/s, overriding :data:`PEAK_FLOPS`."""


@dataclasses.dataclass
class Kpis:
    """The KPIs of one run."""

    summary: pd.DataFrame
    """One row per KPI and rank: KPI_COLUMNS."""
    samples: pd.DataFrame
    """One value per KPI, rank and profiled step: SAMPLE_COLUMNS."""
    run_id: str
    """The run's id (the store's)."""
    world_size: int
    """World size of the job."""
    ranks: list[int]
    """Ranks with profiled steps."""
    steps: list[int]
    """Profiled step numbers (over every rank)."""
    device: str
    """``gpu``, ``cpu`` or ``mixed`` (the breakdown's device per rank)."""
    notes: list[str] = dataclasses.field(default_factory=list)
    """Why a KPI is missing (one line each): no sample count, no FLOP counts, no peak, ..."""

    def row(self, kpi: Kpi | str, rank: int = JOB_RANK) -> dict[str, Any] | None:
        """The summary row of ``kpi`` for ``rank`` as a dict, or None."""
        s = self.summary
        hit = s[(s["kpi"] == str(kpi)) & (s["rank"] == rank)]
        return None if hit.empty else hit.iloc[0].to_dict()

    def values(self, kpi: Kpi | str, rank: int = JOB_RANK) -> Any:
        """The per-step samples of ``kpi`` for ``rank`` (numpy float64, in step order)."""
        s = self.samples
        hit = s[(s["kpi"] == str(kpi)) & (s["rank"] == rank)].sort_values("step")
        return hit["value"].to_numpy(dtype="float64")


def peak_flops_of(device_name: str | None) -> float | None:
    """The peak FLOP/s of ``device_name`` from :data:`PEAK_FLOPS` (None: unknown)."""
    if not device_name:
        return None
    name = device_name.lower()
    for key in sorted(PEAK_FLOPS, key=len, reverse=True):
        if key.lower() in name:
            return PEAK_FLOPS[key]
    return None


def _recorded(a: Analysis, key: str) -> Any:
    """``key`` from the store's root attributes or its run record (its profiler settings)."""
    run = a.meta.get("run")
    run = run if isinstance(run, dict) else {}
    profiler = run.get("profiler")
    wheres: list[dict[str, Any]] = [
        a.meta,
        run,
        profiler if isinstance(profiler, dict) else {},
    ]
    for where in wheres:
        if where.get(key) is not None:
            return where[key]
    return None


def _per_row(
    ranks: Any,
    steps: Any,
    given: float | None,
    per_step: dict[int, dict[int, float]],
    constant: dict[int, float | None],
    fallback: float | None,
) -> Any:
    """One value per (rank, step) row: ``given`` (the user's), else the rank's value for the step,
    else the rank's constant, else ``fallback``; NaN where none is known."""
    if given is not None:
        return np.full(len(ranks), given, dtype=np.float64)
    out = np.full(len(ranks), np.nan, dtype=np.float64)
    for i, (rank, step) in enumerate(zip(ranks.tolist(), steps.tolist(), strict=True)):
        value = per_step.get(rank, {}).get(step)
        if value is None:
            value = constant.get(rank) or fallback
        if value is not None:
            out[i] = value
    return out


def _step_comm(a: Analysis, steps: pd.DataFrame) -> pd.DataFrame:
    """Wait and transfer (ns) per (rank, step): the collectives whose arrival lies in the step."""
    # per rank in numpy, one frame at the end (a frame per rank and their concat cost more than
    # the sums)
    w = a.waits
    rank_of = steps["rank"].to_numpy()
    step_all = steps["step"].to_numpy()
    start_all = steps["start"].to_numpy(np.int64)
    end_all = steps["end"].to_numpy(np.int64)
    w_rank = w["rank"].to_numpy() if len(w) else np.zeros(0, np.int64)
    w_arrival = w["arrival"].to_numpy(np.int64) if len(w) else np.zeros(0, np.int64)
    w_wait = w["wait_ns"].to_numpy(np.float64) if len(w) else np.zeros(0)
    w_transfer = w["transfer_ns"].to_numpy(np.float64) if len(w) else np.zeros(0)
    ranks, steps_out, waits, transfers = [], [], [], []
    for rank in np.unique(rank_of):
        at = np.flatnonzero(rank_of == rank)
        at = at[np.argsort(start_all[at])]  # as sort_values("start") orders them
        starts, ends = start_all[at], end_all[at]
        wait = np.zeros(len(at))
        transfer = np.zeros(len(at))
        mine = w_rank == rank
        if mine.any():
            arrival = w_arrival[mine]
            i = np.searchsorted(starts, arrival, side="right") - 1
            ok = (i >= 0) & (arrival < ends[np.clip(i, 0, None)])
            np.add.at(wait, i[ok], w_wait[mine][ok])
            np.add.at(transfer, i[ok], w_transfer[mine][ok])
        ranks.append(np.full(len(at), rank))
        steps_out.append(step_all[at])
        waits.append(wait)
        transfers.append(transfer)
    if not ranks:
        return pd.DataFrame(columns=["rank", "step", "wait_ns", "transfer_ns"])
    return pd.DataFrame(
        {
            "rank": np.concatenate(ranks),
            "step": np.concatenate(steps_out),
            "wait_ns": np.concatenate(waits),
            "transfer_ns": np.concatenate(transfers),
        }
    )


def _summary_row(kpi: Kpi, rank: int, values: Any) -> dict[str, Any]:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    p = np.percentile(v, [50, 90, 99]) if len(v) else [math.nan] * 3
    return {
        "kpi": str(kpi),
        "rank": rank,
        "unit": UNITS[kpi],
        "steps": len(v),
        "mean": float(v.mean()) if len(v) else math.nan,
        "p50": float(p[0]),
        "p90": float(p[1]),
        "p99": float(p[2]),
    }


def _job_means(per_step: dict[Kpi, pd.DataFrame], present: list[Kpi]) -> dict[Kpi, tuple[Any, Any]]:
    """The job's sample of each KPI averaged over ranks (all but peak memory and the run's step
    time): ``(steps ascending, mean over the step's ranks)``.

    Why one groupby over every KPI's rows instead of one per KPI: the same means (pandas sums
    each group's values in their order, whatever the other keys), ~8 fewer groupbys per
    report."""
    averaged = [k for k in present if k not in (Kpi.PEAK_MEMORY, Kpi.RUN_STEP_TIME)]
    if not averaged:
        return {}
    frames = [per_step[k] for k in averaged]
    long = pd.DataFrame(
        {
            "kpi": np.repeat(np.arange(len(averaged)), [len(f) for f in frames]),
            "step": np.concatenate([f["step"].to_numpy() for f in frames]),
            "value": np.concatenate([f["value"].to_numpy(np.float64) for f in frames]),
        }
    )
    means = long.groupby(["kpi", "step"], sort=True)["value"].mean()
    codes = means.index.get_level_values("kpi").to_numpy()
    steps = means.index.get_level_values("step").to_numpy()
    values = means.to_numpy()
    return {k: (steps[codes == i], values[codes == i]) for i, k in enumerate(averaged)}


def kpis(a: Analysis, config: KpiConfig | None = None) -> Kpis:
    """The KPIs of the analysed run ``a`` (see the module docstring and docs/compare.md)."""
    config = config or KpiConfig()
    notes: list[str] = []
    bd = a.breakdown
    stepped = bd[bd["step"] >= 0].copy() if len(bd) else bd
    devices = sorted(set(stepped["device"].astype(str))) if len(stepped) else []
    device = devices[0] if len(devices) == 1 else ("mixed" if devices else "none")
    per_step: dict[Kpi, pd.DataFrame] = {}  # kpi -> (rank, step, value)
    if len(stepped):
        base = stepped[["rank", "step"]].astype({"rank": "int32", "step": "int32"})
        stepped = stepped.reset_index(drop=True)
        base = base.reset_index(drop=True)

        def frame(values: Any) -> pd.DataFrame:
            return base.assign(value=np.asarray(values, dtype=np.float64))

        step_s = stepped["total_ns"].to_numpy(np.float64) / 1e9
        per_step[Kpi.STEP_TIME] = frame(step_s)
        for kpi, col in _BREAKDOWN_COLUMN.items():
            per_step[kpi] = frame(stepped[col].to_numpy(np.float64) / 1e9)
        comm = _step_comm(a, stepped[["rank", "step", "start", "end"]])
        merged = base.merge(comm, on=["rank", "step"], how="left").fillna(0.0)
        per_step[Kpi.WAIT] = frame(merged["wait_ns"].to_numpy(np.float64) / 1e9)
        per_step[Kpi.TRANSFER] = frame(merged["transfer_ns"].to_numpy(np.float64) / 1e9)
        facts = rank_facts(a)
        ranks_v = base["rank"].to_numpy(np.int64)
        steps_v = base["step"].to_numpy(np.int64)

        def known(values: Any, label: str, hint: str, none: str) -> pd.DataFrame | None:
            """The rows whose value is known; a note for the rows (or all: ``none``) that are
            not."""
            ok = np.isfinite(values)
            if not ok.any():
                notes.append(none)
                return None
            if not ok.all():
                missing = int((~ok).sum())
                notes.append(f"{label} unknown for {missing} of {len(ok)} rank-steps ({hint})")
            return frame(values)[ok].reset_index(drop=True)

        samples = _per_row(
            ranks_v,
            steps_v,
            _number(config.samples_per_step),
            {r: f.step_samples for r, f in facts.items()},
            {r: f.samples_per_step for r, f in facts.items()},
            _number(_recorded(a, SAMPLES_KEY)),
        )
        got = known(
            samples / step_s,
            "throughput: samples per step",
            "give --samples-per-step or call rankscope.step(samples=N)",
            "throughput: samples per step unknown (give --samples-per-step or call "
            "rankscope.step(samples=N))",
        )
        if got is not None:
            per_step[Kpi.THROUGHPUT] = got
        flops = _per_row(
            ranks_v,
            steps_v,
            _number(config.flops_per_step),
            {r: f.step_flops for r, f in facts.items()},
            {r: f.flops_per_step for r, f in facts.items()},
            _number(_recorded(a, FLOPS_KEY)),
        )
        achieved = flops / step_s
        got = known(
            achieved,
            "FLOP/s and MFU: FLOPs per step",
            "run with --with-flops",
            "FLOP/s and MFU: the trace has no FLOP counts (run with --with-flops)",
        )
        if got is not None:
            per_step[Kpi.FLOPS] = got
            gpu = stepped["device"].astype(str).to_numpy() == "gpu"
            given_name = config.device_name or _recorded(a, DEVICE_NAME_KEY)
            peak = np.full(len(ranks_v), np.nan)
            for i, rank in enumerate(ranks_v.tolist()):
                f = facts.get(rank)
                value = _number(config.peak_flops) or peak_flops_of(
                    given_name or (f.device_name if f else None)
                )
                peak[i] = value if value is not None and gpu[i] else np.nan
            mfu = achieved / peak
            if np.isfinite(mfu).any():
                per_step[Kpi.MFU] = frame(mfu)[np.isfinite(mfu)].reset_index(drop=True)
            elif gpu.any():
                notes.append("MFU: the device's peak FLOP/s is unknown (see PEAK_FLOPS)")
            else:
                notes.append("MFU: not for CPU runs (no peak FLOP/s); FLOP/s only")
    else:
        notes.append("no profiled steps: no per-step KPIs")
    sp = a.memory.step_peaks
    if len(sp) and "peak_allocated" in sp:
        mem = (
            sp[sp["step"] >= 0]
            .groupby(["rank", "step"], as_index=False)["peak_allocated"]
            .max()
            .rename(columns={"peak_allocated": "value"})
        )
        if len(mem):
            per_step[Kpi.PEAK_MEMORY] = mem.astype({"rank": "int32", "step": "int32"})
    elif not a.memory.requested:
        notes.append("peak memory: not recorded (run with --profile-memory)")

    if a.run_steps.present:  # every step of the run, from the step logs
        per_step[Kpi.RUN_STEP_TIME] = job_samples(a.run_steps).assign(rank=JOB_RANK)
    present = [kpi for kpi in Kpi if kpi in per_step]
    job_means = _job_means(per_step, present)
    kinds: list[str] = []  # SAMPLE_COLUMNS, one list or array per KPI and part (job, ranks)
    sample_ranks: list[Any] = []
    sample_steps: list[Any] = []
    sample_values: list[Any] = []
    rows: list[dict[str, Any]] = []

    def add_samples(kpi: Kpi, rank: Any, step: Any, value: Any) -> None:
        kinds.extend([str(kpi)] * len(value))
        sample_ranks.append(np.broadcast_to(np.asarray(rank, np.int64), len(value)))
        sample_steps.append(np.asarray(step, np.int64))
        sample_values.append(np.asarray(value))

    for kpi in present:
        df = per_step[kpi]
        rank_v = df["rank"].to_numpy()
        step_v = df["step"].to_numpy()
        pooled = df["value"].to_numpy()
        if kpi is Kpi.RUN_STEP_TIME:  # already the job's series: no per-rank rows
            add_samples(kpi, rank_v, step_v, pooled)
            rows.append(_summary_row(kpi, JOB_RANK, pooled))
            continue
        if kpi is Kpi.PEAK_MEMORY:  # the job's peak per step is the largest rank's
            job = df.groupby("step", as_index=False)["value"].max()
            add_samples(kpi, JOB_RANK, job["step"].to_numpy(), job["value"].to_numpy())
        else:
            add_samples(kpi, JOB_RANK, *job_means[kpi])
        add_samples(kpi, rank_v, step_v, pooled)
        rows.append(_summary_row(kpi, JOB_RANK, pooled))
        if kpi is Kpi.PEAK_MEMORY:
            rows[-1].update(p99=float(np.max(pooled)) if len(pooled) else math.nan)
        # each rank's values in their order (as groupby("rank", sort=True) gives them)
        order = np.argsort(rank_v, kind="stable")
        ranks_sorted = rank_v[order]
        cuts = np.flatnonzero(ranks_sorted[1:] != ranks_sorted[:-1]) + 1
        for at, values in zip(
            np.concatenate(([0], cuts)).tolist() if len(order) else [],
            np.split(pooled[order], cuts),
            strict=False,
        ):
            rows.append(_summary_row(kpi, int(ranks_sorted[at]), values))
    summary = pd.DataFrame(rows, columns=list(KPI_COLUMNS)).astype(
        {k: v for k, v in KPI_COLUMNS.items() if v != "str"}
    )
    samples_df = (
        pd.DataFrame(
            {
                "kpi": kinds,
                "rank": np.concatenate(sample_ranks),
                "step": np.concatenate(sample_steps),
                "value": np.concatenate(sample_values),
            }
        )
        if kinds
        else pd.DataFrame(columns=list(SAMPLE_COLUMNS))
    ).astype({k: v for k, v in SAMPLE_COLUMNS.items() if v != "str"})
    if Kpi.THROUGHPUT in per_step and config.sample_unit != "samples":
        unit = f"{config.sample_unit}/s"
        summary.loc[summary["kpi"] == str(Kpi.THROUGHPUT), "unit"] = unit
    return Kpis(
        summary=summary,
        samples=samples_df,
        run_id=str(a.meta.get("run_id") or a.path),
        world_size=int(a.world_size),
        ranks=sorted(int(r) for r in stepped["rank"].unique()) if len(stepped) else [],
        steps=sorted(int(s) for s in stepped["step"].unique()) if len(stepped) else [],
        device=device,
        notes=notes,
    )


def _json_number(x: float) -> float | None:
    return None if not math.isfinite(x) else float(f"{x:.6g}")


def to_json(k: Kpis) -> dict[str, Any]:
    """summary.json's ``kpis`` object (docs/compare.md, "summary.json"): the job's KPIs, then
    the per-rank ones, values in each KPI's ``unit`` (6 significant digits)."""

    def entry(r: Any) -> dict[str, Any]:
        return {
            "kpi": r.kpi,
            "rank": None if r.rank == JOB_RANK else int(r.rank),
            "unit": r.unit,
            "steps": int(r.steps),
            "mean": _json_number(r.mean),
            "p50": _json_number(r.p50),
            "p90": _json_number(r.p90),
            "p99": _json_number(r.p99),
        }

    s = k.summary
    return {
        "device": k.device,
        "world_size": k.world_size,
        "steps": len(k.steps),
        "job": [entry(r) for r in s[s["rank"] == JOB_RANK].itertuples()],
        "ranks": [entry(r) for r in s[s["rank"] != JOB_RANK].itertuples()],
        "notes": list(k.notes),
    }
