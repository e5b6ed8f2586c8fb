"""The advice rules (docs/advice.md): each a pure function of tables the analysis computed,
returning :class:`~rankscope.analysis.conclude.advice.Advice` items (none when its problem is
absent or immaterial). Times in the tables are ns; the items say ms per profiled step.

"Per step" is the rank's time over its profiled steps divided by their number (the breakdown's
step rows), averaged over the ranks concerned; "of the step" is the time summed over those ranks
divided by their profiled step time summed the same way — a part of the same whole, never more.

Why one module of ~520 lines: every rule measures its problem with the same two helpers (each
rank's profiled steps, :func:`_steps`; the per-step and of-the-step figures, :func:`_per_step`)
and words its item the same way; reading the rules side by side keeps them alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from rankscope.analysis.compute.finding import Cause, FindingKind
from rankscope.analysis.conclude.advice_model import (
    MATERIAL_SHARE,
    Advice,
    BottleneckClass,
    Rule,
)

if TYPE_CHECKING:
    from rankscope.analysis.compute.finding import Finding


def _steps(breakdown: pd.DataFrame) -> pd.DataFrame:
    """Per rank: ``steps`` (profiled steps) and ``total_ns`` (their summed time), indexed by rank."""
    if not len(breakdown):
        return pd.DataFrame(
            {"steps": pd.Series(dtype="int64"), "total_ns": pd.Series(dtype="int64")}
        )
    rows = breakdown[breakdown["step"] >= 0]
    if not len(rows) or rows["total_ns"].dtype.kind not in "iu":  # pandas' sum of floats
        g = rows.groupby("rank")["total_ns"]
        return pd.DataFrame({"steps": g.size(), "total_ns": g.sum()})
    # what groupby("rank")'s size and sum give, from one sort (each rule asks: ~1 ms a call)
    rank = rows["rank"].to_numpy()
    total = rows["total_ns"].to_numpy()
    order = np.argsort(rank, kind="stable")
    starts = np.flatnonzero(np.r_[True, rank[order][1:] != rank[order][:-1]])
    index = pd.Index(rank[order][starts], dtype=rank.dtype, name="rank")
    return pd.DataFrame(
        {
            "steps": np.diff(np.r_[starts, len(order)]).astype(np.int64),
            "total_ns": np.add.reduceat(total[order], starts),
        },
        index=index,
    )


def _per_step(ns_by_rank: Mapping[int, float], steps: pd.DataFrame) -> tuple[float, float]:
    """(ms per profiled step, mean over the ranks; share of those ranks' summed step time)."""
    # plain dicts: a pandas lookup per rank cost more than the arithmetic (5 rules ask)
    counts = dict(zip(steps.index.tolist(), steps["steps"].tolist(), strict=True))
    ranks = [r for r in ns_by_rank if counts.get(r, 0) > 0]
    if not ranks:
        return 0.0, 0.0
    per_step = [ns_by_rank[r] / float(counts[r]) for r in ranks]
    if steps["total_ns"].dtype.kind in "iu":  # integers: the same sum in any order
        totals = dict(zip(steps.index.tolist(), steps["total_ns"].tolist(), strict=True))
        whole = float(sum(totals[r] for r in ranks))
    else:
        whole = float(steps.loc[ranks, "total_ns"].sum())
    part = float(sum(ns_by_rank[r] for r in ranks))
    return sum(per_step) / len(per_step) / 1e6, (min(part / whole, 1.0) if whole > 0 else 0.0)


def _what_if(whatif: pd.DataFrame | None, scenario: str) -> tuple[float | None, float | None]:
    """(saving ms per step, saving share) of a job-wide what-if scenario; (None, None) without it."""
    if whatif is None or not len(whatif):
        return None, None
    rows = whatif[(whatif["scenario"] == scenario) & (whatif["rank"] < 0)]
    if not len(rows):
        return None, None
    row = rows.iloc[0]
    saving = float(row["saving_ns"]) / 1e6
    pct = float(row["saving_pct"])
    return saving, (pct / 100.0 if pct == pct else None)


def _ranks_text(ranks: list[int]) -> str:
    from rankscope.rank_ranges import rank_ranges

    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"


# -- compute ---------------------------------------------------------------------------------

#: The fix per tensor-core generation (compute capability major at least the key).
_FP32_FIX = {
    8: (
        "allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True and "
        "torch.backends.cudnn.allow_tf32 = True, or torch.set_float32_matmul_precision('high')), "
        "or train under torch.autocast('cuda', dtype=torch.bfloat16)"
    ),
    7: (
        "train under torch.autocast('cuda', dtype=torch.float16) with a "
        "torch.amp.GradScaler('cuda') (this GPU has FP16 tensor cores, no TF32)"
    ),
}


def _generation(major: int) -> int | None:
    """The key of ``_FP32_FIX`` for a compute capability major: TF32 from 8, FP16 from 7, else
    None (no tensor cores: FP32 on the CUDA cores is all there is)."""
    from rankscope.analysis.compute.kernel_names import (
        TENSOR_CORES_FP16_MAJOR,
        TENSOR_CORES_TF32_MAJOR,
    )

    if major >= TENSOR_CORES_TF32_MAJOR:
        return TENSOR_CORES_TF32_MAJOR
    return TENSOR_CORES_FP16_MAJOR if major >= TENSOR_CORES_FP16_MAJOR else None


def fp32_matmul(
    op_stats: pd.DataFrame, capability: Mapping[int, tuple[int, int]], breakdown: pd.DataFrame
) -> list[Advice]:
    """FP32 GEMM / convolution kernels on the CUDA cores of a GPU with tensor cores
    (kernel_names.py): their time, when material, with the fix of the GPU's generation."""
    from rankscope.analysis.compute.kernel_names import Precision, precision

    if not len(op_stats) or not capability:
        return []
    kernels = op_stats[op_stats["kind"] == "KERNEL_COMPUTE"]
    steps = _steps(breakdown)
    out = []
    for gen in sorted(_FP32_FIX, reverse=True):  # each rank under its GPU's generation
        ranks = [r for r, cc in capability.items() if _generation(cc[0]) == gen]
        mine = kernels[kernels["rank"].isin(ranks)]
        fp32 = mine[[precision(str(n)) is Precision.FP32_SIMT for n in mine["name"]]]
        if not len(fp32):
            continue
        by_rank = {int(r): float(v) for r, v in fp32.groupby("rank")["total_ns"].sum().items()}
        ms, share = _per_step(by_rank, steps)
        if share < MATERIAL_SHARE:
            continue
        found = sorted(by_rank)
        top = fp32.groupby("name")["total_ns"].sum().sort_values(ascending=False)
        names = ", ".join(str(n)[:60] for n in top.index[:3])
        cc = max(capability[r] for r in found)
        out.append(
            Advice(
                rule=Rule.FP32_MATMUL,
                bottleneck=BottleneckClass.COMPUTE,
                headline="FP32 matrix math on the CUDA cores of a GPU with tensor cores",
                seen=(
                    f"{int(fp32['count'].sum())} FP32 GEMM/convolution kernel calls "
                    f"({fp32['name'].nunique()} kernels, e.g. {names}) took {ms:.2f} ms per step "
                    f"({share:.1%} of the profiled step time of {_ranks_text(found)}); the GPU "
                    f"has compute capability {cc[0]}.{cc[1]}"
                ),
                fix=_FP32_FIX[gen],
                ranks=tuple(found),
                size_ms=ms,
                figures={
                    "fp32_kernel_ms_per_step": round(ms, 6),
                    "fp32_kernel_share": round(share, 4),
                    "fp32_kernel_calls": int(fp32["count"].sum()),
                    "compute_major": cc[0],
                    "compute_minor": cc[1],
                },
            )
        )
    return out


# -- input -----------------------------------------------------------------------------------


def dataloader_stall(breakdown: pd.DataFrame, whatif: pd.DataFrame | None) -> list[Advice]:
    """The time the training loop spent in ``enumerate(DataLoader)#…`` (the breakdown's
    ``input_ns``), when material; its gain is the what-if "no input stall"."""
    from rankscope.analysis.compute.whatif_scenarios import NO_INPUT_STALL

    if not len(breakdown):
        return []
    rows = breakdown[breakdown["step"] >= 0]
    by_rank = {int(r): float(v) for r, v in rows.groupby("rank")["input_ns"].sum().items() if v > 0}
    ms, share = _per_step(by_rank, _steps(breakdown))
    if share < MATERIAL_SHARE:
        return []
    gain, gain_share = _what_if(whatif, NO_INPUT_STALL)
    steps = _steps(breakdown)
    worst = max(by_rank, key=lambda r: by_rank[r] / max(int(steps.at[r, "steps"]), 1))
    worst_ms = by_rank[worst] / max(int(steps.at[worst, "steps"]), 1) / 1e6
    return [
        Advice(
            rule=Rule.DATALOADER_STALL,
            bottleneck=BottleneckClass.INPUT,
            headline="The training loop waits for the DataLoader",
            seen=(
                f"{ms:.2f} ms per step in the DataLoader's __next__ (mean over "
                f"{_ranks_text(sorted(by_rank))}: {share:.1%} of their profiled step time); "
                f"rank {worst} the most, {worst_ms:.2f} ms per step — a step waits for its "
                "slowest rank"
            ),
            fix=(
                "DataLoader(..., num_workers=N (up to the CPU cores per rank), pin_memory=True, "
                "prefetch_factor=4, persistent_workers=True); move decoding and augmentation "
                "out of __getitem__'s main-process path (or onto the GPU)"
            ),
            ranks=tuple(sorted(by_rank)),
            size_ms=ms,
            gain_ms=gain if gain is not None and gain > 0 else None,
            gain_share=gain_share if gain is not None and gain > 0 else None,
            gain_source=NO_INPUT_STALL if gain is not None and gain > 0 else "not estimated",
            figures={
                "input_ms_per_step": round(ms, 6),
                "input_share": round(share, 4),
                "worst_rank": worst,
                "worst_rank_input_ms_per_step": round(worst_ms, 6),
            },
        )
    ]


def pageable_copies(op_stats: pd.DataFrame, breakdown: pd.DataFrame) -> list[Advice]:
    """Host-to-device copies from pageable memory. Each one synchronises the host with the GPU
    (kernel_names.py): its cost is the wait for the GPU's queue, not the copy's own duration,
    so the rule fires on any such copy in the profiled steps, and its gain is not estimated."""
    from rankscope.analysis.compute.kernel_names import is_pageable_htod

    if not len(op_stats):
        return []
    copies = op_stats[op_stats["kind"] == "MEMCPY"]
    paged = copies[[is_pageable_htod(str(n)) for n in copies["name"]]]
    if not len(paged):
        return []
    by_rank = {int(r): float(v) for r, v in paged.groupby("rank")["total_ns"].sum().items()}
    steps = _steps(breakdown)
    ms, share = _per_step(by_rank, steps)
    calls = int(paged["count"].sum())
    ranks = sorted(by_rank)
    n_steps = int(steps.loc[[r for r in ranks if r in steps.index], "steps"].sum()) or 1
    return [
        Advice(
            rule=Rule.PAGEABLE_COPY,
            bottleneck=BottleneckClass.INPUT,
            headline="Host-to-device copies from pageable memory block the host",
            seen=(
                f"{calls} 'Memcpy HtoD (Pageable -> Device)' copies on {_ranks_text(ranks)} "
                f"({calls / n_steps:.1f} per rank and profiled step, {ms:.3f} ms per step of "
                "copying); each waits for the GPU's queue to drain first"
            ),
            fix=(
                "pin the host tensors (DataLoader(..., pin_memory=True), or tensor.pin_memory() "
                "once for tensors you reuse) and copy with .to(device, non_blocking=True)"
            ),
            ranks=tuple(ranks),
            size_ms=ms,
            figures={
                "pageable_htod_copies": calls,
                "copy_ms_per_step": round(ms, 6),
                "copy_share": round(share, 4),
            },
        )
    ]


# -- framework / software --------------------------------------------------------------------


def gc_pauses(gc: pd.DataFrame, breakdown: pd.DataFrame) -> list[Advice]:
    """Python garbage collections inside the profiled steps (gc_pauses.py), when material."""
    if gc is None or not len(gc):
        return []
    by_rank = {int(r): float(v) for r, v in gc.groupby("rank")["gc_ns"].sum().items()}
    ms, share = _per_step(by_rank, _steps(breakdown))
    if share < MATERIAL_SHARE:
        return []
    ranks = sorted(by_rank)
    return [
        Advice(
            rule=Rule.GC_PAUSES,
            bottleneck=BottleneckClass.FRAMEWORK,
            headline="Python garbage collections pause the training loop",
            seen=(
                f"{int(gc['collections'].sum())} collections took {ms:.2f} ms per step (mean "
                f"over {_ranks_text(ranks)}: {share:.1%} of their profiled step time)"
            ),
            fix=(
                "call gc.freeze() once the model, optimizer and DataLoader are built, then "
                "gc.disable() before the training loop and gc.collect() every N steps at the "
                "same step on every rank (so that no rank pauses between two collectives)"
            ),
            ranks=tuple(ranks),
            size_ms=ms,
            figures={
                "gc_ms_per_step": round(ms, 6),
                "gc_share": round(share, 4),
                "collections": int(gc["collections"].sum()),
            },
        )
    ]


def sdpa_math(items: list[Finding], breakdown: pd.DataFrame) -> list[Advice]:
    """The SDPA math fallback findings (attention.py found them), with their fix."""
    found = [f for f in items if f.kind == FindingKind.SDPA_MATH_FALLBACK and f.rank is not None]
    if not found:
        return []
    by_rank = {int(f.rank or 0): f.figures.get("math_total_ms", 0.0) * 1e6 for f in found}
    ms, share = _per_step(by_rank, _steps(breakdown))
    ranks = sorted(by_rank)
    first = found[0]
    return [
        Advice(
            rule=Rule.SDPA_MATH,
            bottleneck=BottleneckClass.FRAMEWORK,
            headline="Attention ran PyTorch's math fallback, not a fused kernel",
            seen=f"{_ranks_text(ranks)}: {first.evidence.rstrip('.')}",
            fix=(
                "do not restrict scaled_dot_product_attention to the math backend "
                "(sdpa_kernel([SDPBackend.MATH])); give it inputs a fused kernel accepts: fp16/bf16 on "
                "the GPU (torch.autocast), (batch, heads, length, head_dim) tensors with a head "
                "dim a multiple of 8, is_causal=True or no mask instead of a dense float mask; "
                "run once under torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION) to "
                "see the reason a fused kernel refuses them"
            ),
            ranks=tuple(ranks),
            size_ms=ms,
            figures={"math_ms_per_step": round(ms, 6), "math_share": round(share, 4)},
        )
    ]


# -- memory ----------------------------------------------------------------------------------


def low_headroom(items: list[Finding]) -> list[Advice]:
    """The low-memory-headroom findings (memory_peaks.HEADROOM_LOW_SHARE of the device left),
    as one item with the fixes that free memory."""
    found = [f for f in items if f.kind == FindingKind.LOW_MEMORY_HEADROOM and f.rank is not None]
    if not found:
        return []
    least = min(found, key=lambda f: f.figures.get("headroom_share", 1.0))
    ranks = sorted({int(f.rank or 0) for f in found})
    return [
        Advice(
            rule=Rule.LOW_HEADROOM,
            bottleneck=BottleneckClass.MEMORY,
            headline="GPU memory is nearly full",
            seen=f"{_ranks_text(ranks)}; least left on rank {least.rank}: {least.evidence}",
            fix=(
                "lower the batch size per GPU (keep the global batch with gradient "
                "accumulation), checkpoint the activations of the largest blocks "
                "(torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)), or train "
                "in mixed precision; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against "
                "fragmentation"
            ),
            ranks=tuple(ranks),
            figures={"headroom_share": float(least.figures.get("headroom_share", 0.0))},
        )
    ]


# -- system ----------------------------------------------------------------------------------


def exposed_communication(
    breakdown: pd.DataFrame,
    comm_totals: pd.DataFrame | None,
    whatif: pd.DataFrame | None,
    gpu: bool = True,
) -> list[Advice]:
    """Transfers that no computation hides: the breakdown's ``comm_exposed_ns`` (only
    communication running) less the wall time the rank's collectives waited for a later rank
    (``comm_totals.comm_wait_ns``: waiting is no transfer, and overlap cannot remove it — the
    straggler's fix does), when material; its gain is the what-if "communication fully
    overlapped" (an upper bound: the barriers stay, the transfers become free), capped at the
    largest exposed transfer time per step of a rank. ``gpu``: the job ran on GPUs (the fix
    names CUDA calls only then)."""
    from rankscope.analysis.compute.whatif_scenarios import COMM_OVERLAPPED

    if not len(breakdown):
        return []
    rows = breakdown[breakdown["step"] >= 0]
    exposed = rows.groupby("rank")["comm_exposed_ns"].sum()
    waited = (
        comm_totals.set_index("rank")["comm_wait_ns"]
        if comm_totals is not None and len(comm_totals)
        else pd.Series(dtype="int64")
    )
    by_rank: dict[int, float] = {}
    waits: dict[int, float] = {}
    for r, v in exposed.items():
        wait = min(float(waited.get(r, 0.0)), float(v))
        if float(v) - wait > 0:
            by_rank[int(str(r))] = float(v) - wait
            waits[int(str(r))] = wait
    steps = _steps(breakdown)
    ms, share = _per_step(by_rank, steps)
    if share < MATERIAL_SHARE:
        return []
    wait_ms, _ = _per_step(waits, steps)
    gain, gain_share = _what_if(whatif, COMM_OVERLAPPED)
    # the replay also frees the transfers of the collectives that waited (their barrier stays,
    # but waiting ranks' step ends move): hiding transfers saves at most the largest exposed
    # transfer time of a rank per step (a part never exceeds its whole)
    most_ms = max(
        (v / float(steps.at[r, "steps"]) / 1e6 for r, v in by_rank.items() if r in steps.index),
        default=0.0,
    )
    if gain is not None and gain > most_ms:
        if gain_share is not None:
            gain_share *= most_ms / gain
        gain = most_ms
    ok = gain is not None and gain > 0
    return [
        Advice(
            rule=Rule.EXPOSED_COMM,
            bottleneck=BottleneckClass.SYSTEM,
            headline="Communication that no computation hides",
            seen=(
                f"{ms:.2f} ms per step of transfers with nothing else running (mean over "
                f"{_ranks_text(sorted(by_rank))}: {share:.1%} of their profiled step time; "
                f"besides {wait_ms:.2f} ms per step waiting for a later rank, which overlap "
                "does not remove)"
            ),
            fix=(
                "let it overlap the backward pass: DDP(..., bucket_cap_mb=…) (smaller buckets "
                "start reducing earlier; larger ones cost fewer launches), "
                "gradient_as_bucket_view=True; FSDP(..., backward_prefetch=BackwardPrefetch."
                "BACKWARD_PRE, forward_prefetch=True); no synchronising call (loss.item()"
                + (", torch.cuda.synchronize()" if gpu else "")
                + ") between backward and optimizer.step()"
            ),
            ranks=tuple(sorted(by_rank)),
            size_ms=ms,
            gain_ms=gain if ok else None,
            gain_share=gain_share if ok else None,
            gain_source=f"{COMM_OVERLAPPED} (upper bound)" if ok else "not estimated",
            figures={
                "exposed_transfer_ms_per_step": round(ms, 6),
                "exposed_transfer_share": round(share, 4),
                "wait_ms_per_step": round(wait_ms, 6),
                "exposed_transfer_ms_per_step_max": round(most_ms, 6),
            },
        )
    ]


# -- a rank that holds the others back ------------------------------------------------------

#: Per straggler cause (finding.Cause): the class of the bottleneck and what to look at.
_STRAGGLER_FIX: dict[str, tuple[BottleneckClass, str]] = {
    Cause.OWN_COMPUTE: (
        BottleneckClass.COMPUTE,
        "find what that rank computes more than the others: rank-specific code (logging, "
        "metrics or checkpointing under `if rank == 0`), larger batches or longer sequences on "
        "it (balance the sampler), {device}",
    ),
    Cause.INPUT: (
        BottleneckClass.INPUT,
        "feed that rank faster: more DataLoader workers, its data on local or faster storage, "
        "the same sample sizes on every rank",
    ),
    Cause.HOST: (
        BottleneckClass.FRAMEWORK,
        "look for host work only that rank does between GPU launches (Python under "
        "`if rank == …`, synchronous logging, .item() calls); bind each rank to its own "
        "cores (numactl / taskset)",
    ),
    Cause.GC: (
        BottleneckClass.FRAMEWORK,
        "gc.freeze() after setup, gc.disable() in the loop and gc.collect() every N steps at "
        "the same step on every rank",
    ),
    Cause.CPU_CONTENTION: (
        BottleneckClass.SYSTEM,
        "give that rank its cores: stop other processes on its node, bind ranks to cores "
        "(numactl / taskset), fewer ranks or DataLoader workers per node than cores",
    ),
}


#: What a slower device looks like, per kind of job (the ``{device}`` of a straggler's fix).
_SLOW_DEVICE = {
    True: "a slower or throttled GPU (nvidia-smi -q -d CLOCK)",
    False: "slower or busier CPU cores on its node (lscpu, top)",
}


def stragglers(items: list[Finding], gpu: bool = True) -> list[Advice]:
    """Each straggler finding (stragglers.py, or a layered job's slow worker) whose cause has a
    fix, with the gain of its what-if ("if rank N ran like the median rank / its peers").
    ``gpu``: the job ran on GPUs (the fix names a throttled GPU only then)."""
    out = []
    for f in items:
        if f.kind != FindingKind.STRAGGLER or f.rank is None or f.cause not in _STRAGGLER_FIX:
            continue
        what_if = next(
            (w for w in items if w.kind == FindingKind.WHAT_IF and w.rank == f.rank), None
        )
        saving = what_if.figures.get("saving_s") if what_if is not None else None
        ok = saving is not None and saving > 0
        bottleneck, fix = _STRAGGLER_FIX[f.cause]
        fix = fix.replace("{device}", _SLOW_DEVICE[gpu])
        late_ms = 1e3 * float(f.figures.get("late_s", f.figures.get("typical_s", 0.0)))
        out.append(
            Advice(
                rule=Rule.STRAGGLER,
                bottleneck=bottleneck,
                headline=f"Rank {f.rank} holds the others back ({f.cause})",
                seen=f.evidence,
                fix=fix,
                ranks=(f.rank,),
                size_ms=late_ms,
                gain_ms=1e3 * float(saving or 0.0) if ok else None,
                gain_share=float(what_if.figures.get("saving_share", 0.0))
                if ok and what_if
                else None,
                gain_source=what_if.headline if ok and what_if else "not estimated",
                figures={k: v for k, v in f.figures.items() if k.endswith(("_s", "_share"))},
            )
        )
    return out
