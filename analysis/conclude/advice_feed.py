"""The advice rules about how the host feeds the GPU (docs/advice.md): launch-bound ranks and
pinned host-to-device copies the host waited for. Pure functions of the tables the analysis
computed (``Analysis.gpu_feed``: ``host_feed.py``'s and HTA's launch statistics); kept apart from
``advice_rules.py`` (whose helpers they share) to keep each module one screenful of rules.
"""

from __future__ import annotations

import pandas as pd
from rankscope.analysis.conclude.advice_model import (
    MATERIAL_SHARE,
    Advice,
    BottleneckClass,
    Rule,
)
from rankscope.analysis.conclude.advice_rules import _per_step, _ranks_text, _steps

#: A rank is launch-bound only when MOST of its launches (more than half) are of GPU work
#: shorter than the host's call that launched it (HTA's "short kernel": GPU duration < the
#: runtime call's duration). A host that did nothing but launch issues one such piece of work per
#: call, and the GPU finishes it before the next arrives: the queue drains and the GPU waits.
#: When most launches are like that, the GPU's rate is the host's launch rate; when most GPU
#: work outlasts its launch, the host runs ahead and idle time has another cause (a sync, the
#: input, Python between steps) — the rules for those say so.
SHORT_LAUNCH_SHARE = 0.5

#: The gain's source: no what-if scenario replays launches, so the gain is the host-wait time
#: itself, the most a rank's step can lose by it.
LAUNCH_GAIN_SOURCE = "no host wait (upper bound)"


def launch_bound(
    host_wait: pd.DataFrame, launch_summary: pd.DataFrame, breakdown: pd.DataFrame
) -> list[Advice]:
    """GPU ranks whose whole GPU sat idle waiting for the host (``host_feed.host_wait``, less
    the DataLoader's part) for a material share of the profiled step time, while more than
    :data:`SHORT_LAUNCH_SHARE` of their launches were of work shorter than the launch call.

    The gain is an upper bound: every such gap closed (CUDA graphs replay the kernels with no
    host in between), never more than the largest host wait of a rank per step — a step waits
    for its slowest rank, and a gap is a part of the step it lies in. Its share is of the mean
    profiled step of the ranks concerned."""
    if not len(host_wait) or not len(launch_summary):
        return []
    ls = launch_summary.set_index("rank")
    hw = host_wait.set_index("rank")
    short_share: dict[int, float] = {}
    waits: dict[int, float] = {}
    for r in hw.index:
        rank = int(str(r))
        launches = int(ls.at[r, "launches"]) if r in ls.index else 0
        wait = float(hw.at[r, "host_wait_ns"] - hw.at[r, "input_wait_ns"])
        if launches <= 0 or wait <= 0:
            continue
        share = float(ls.at[r, "short_kernels"]) / launches
        if share > SHORT_LAUNCH_SHARE:
            short_share[rank] = share
            waits[rank] = wait
    steps = _steps(breakdown)
    ms, share = _per_step(waits, steps)
    if share < MATERIAL_SHARE:
        return []
    ranks = sorted(waits)
    launches = int(ls.loc[ranks, "launches"].sum())
    short = int(ls.loc[ranks, "short_kernels"].sum())
    per_rank = {r: waits[r] / float(steps.at[r, "steps"]) / 1e6 for r in ranks if r in steps.index}
    most = max(per_rank.values(), default=0.0)
    step_ms = float(steps.loc[ranks, "total_ns"].sum()) / float(steps.loc[ranks, "steps"].sum())
    step_ms /= 1e6
    gain_share = most / step_ms if step_ms > 0 else None
    return [
        Advice(
            rule=Rule.LAUNCH_BOUND,
            bottleneck=BottleneckClass.FRAMEWORK,
            headline="The GPU idles between short kernels the host launches",
            seen=(
                f"the whole GPU sat idle waiting for the host's next launch {ms:.2f} ms per step "
                f"(mean over {_ranks_text(ranks)}: {share:.1%} of their profiled step time, the "
                f"DataLoader's waits left out); {short} of their {launches} launches "
                f"({short / launches:.0%}) ran shorter on the GPU than the host's call that "
                "launched them"
            ),
            fix=(
                "launch fewer, larger pieces of work: capture the step in a CUDA graph "
                "(torch.compile(model, mode='reduce-overhead'), or torch.cuda.graphs / "
                "torch.cuda.make_graphed_callables), let torch.compile fuse the small "
                "elementwise ops, or give each kernel more work with a larger batch per GPU"
            ),
            ranks=tuple(ranks),
            size_ms=ms,
            gain_ms=most if most > 0 else None,
            gain_share=gain_share if most > 0 else None,
            gain_source=LAUNCH_GAIN_SOURCE if most > 0 else "not estimated",
            figures={
                "host_wait_ms_per_step": round(ms, 6),
                "host_wait_share": round(share, 4),
                "host_wait_ms_per_step_max": round(most, 6),
                "short_launches": short,
                "launches": launches,
                "short_launch_share": round(short / launches, 4),
            },
        )
    ]


def blocking_pinned_copies(copies: pd.DataFrame, breakdown: pd.DataFrame) -> list[Advice]:
    """Host-to-device copies from pinned memory that the host waited for
    (``host_feed.blocking_copies``): a yes/no fact like the pageable copies (advice_rules.py's
    ``pageable_copies``) — pinned memory exists to let the copy run while the host goes on, and a
    synchronised copy throws that away for nothing — so the rule fires on any, and says the
    wait. Its gain is not estimated (the replay does not model the host's wait)."""
    if not len(copies):
        return []
    by_rank = {int(r): float(v) for r, v in copies.groupby("rank")["wait_ns"].sum().items()}
    steps = _steps(breakdown)
    ms, share = _per_step(by_rank, steps)
    ranks = sorted(by_rank)
    n_steps = int(steps.loc[[r for r in ranks if r in steps.index], "steps"].sum()) or 1
    calls = len(copies)
    syncs = sorted(
        {str(s) for s in copies["sync"] if s}
        | {str(c) for c, s in zip(copies["call"], copies["sync"], strict=True) if not s}
    )
    return [
        Advice(
            rule=Rule.BLOCKING_PINNED_COPY,
            bottleneck=BottleneckClass.INPUT,
            headline="Copies from pinned memory block the host (no non_blocking=True)",
            seen=(
                f"{calls} 'Memcpy HtoD (Pinned -> Device)' copies on {_ranks_text(ranks)} "
                f"({calls / n_steps:.1f} per rank and profiled step) were each followed by "
                f"{' / '.join(syncs)}: the host waited {ms:.3f} ms per step for them "
                f"({share:.1%} of the profiled step time) instead of queuing the next kernels"
            ),
            fix=(
                "the memory is pinned already: copy with .to(device, non_blocking=True) (and "
                "DataLoader(..., pin_memory=True) keeps it pinned); do not call .item(), "
                ".cpu() or torch.cuda.synchronize() on the copied batch before the GPU uses it"
            ),
            ranks=tuple(ranks),
            size_ms=ms,
            figures={
                "blocking_pinned_copies": calls,
                "wait_ms_per_step": round(ms, 6),
                "wait_share": round(share, 4),
            },
        )
    ]
