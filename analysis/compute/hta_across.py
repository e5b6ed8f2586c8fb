"""HTA's per-rank analyses (idle time, kernel launches, queue length, kernel sequences) joined
across ranks, and which ranks differ from the rest.

The per-rank halves are ``kernel_launches.py`` and ``kernel_sequences.py``; this module is the
small cross-rank step the driver runs on their results. "Which ranks differ" is one general
rule for every figure (:func:`kernel_launches.differing_ranks`: outside Tukey's fences of the
ranks' values), never a threshold tuned to a trace.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd
from rankscope.analysis.compute import kernel_launches as kl
from rankscope.analysis.compute.host_feed import BLOCKING_COPY_COLUMNS, HOST_WAIT_COLUMNS
from rankscope.analysis.compute.kernel_sequences import SEQUENCE_COLUMNS
from rankscope.analysis.store.frames import empty

#: How many sequences per rank the summaries keep (the most frequent).
TOP_SEQUENCES = 5


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return empty(columns)


@dataclasses.dataclass
class HtaAnalyses:
    """HTA's analyses of every GPU rank (frames empty on CPU-only jobs; ns)."""

    idle_time: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty(kl.IDLE_COLUMNS))
    """Per rank and stream: kernel_launches.IDLE_COLUMNS."""
    launches: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty(kl.LAUNCH_COLUMNS))
    """Per launched GPU event: kernel_launches.LAUNCH_COLUMNS."""
    launch_summary: pd.DataFrame = dataclasses.field(
        default_factory=lambda: _empty(kl.LAUNCH_SUMMARY_COLUMNS)
    )
    """Per rank: kernel_launches.LAUNCH_SUMMARY_COLUMNS."""
    queue: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty(kl.QUEUE_COLUMNS))
    """The queue length time series of every stream: kernel_launches.QUEUE_COLUMNS."""
    queue_summary: pd.DataFrame = dataclasses.field(
        default_factory=lambda: _empty(kl.QUEUE_SUMMARY_COLUMNS)
    )
    """Per rank and stream: kernel_launches.QUEUE_SUMMARY_COLUMNS."""
    sequences: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty(SEQUENCE_COLUMNS))
    """Per rank and kernel sequence: kernel_sequences.SEQUENCE_COLUMNS."""
    host_wait: pd.DataFrame = dataclasses.field(default_factory=lambda: _empty(HOST_WAIT_COLUMNS))
    """Per rank, the whole GPU idle waiting for the host in the profiled steps (rankscope's
    own, not HTA's: host_feed.HOST_WAIT_COLUMNS)."""
    blocking_copies: pd.DataFrame = dataclasses.field(
        default_factory=lambda: _empty(BLOCKING_COPY_COLUMNS)
    )
    """Pinned host-to-device copies the host waited for: host_feed.BLOCKING_COPY_COLUMNS."""

    def idle_per_rank(self) -> pd.DataFrame:
        """Idle time per rank summed over its streams (host wait, kernel wait, other, idle; ns)."""
        cols = ["host_wait_ns", "kernel_wait_ns", "other_ns", "idle_ns"]
        if not len(self.idle_time):
            return pd.DataFrame(columns=["rank", *cols])
        return self.idle_time.groupby("rank", as_index=False)[cols].sum()

    def differing(self) -> dict[str, list[int]]:
        """Ranks whose figure lies outside the others' (Tukey's fences), per figure: host wait,
        total launch delay, mean launch delay, deepest queue."""
        out: dict[str, list[int]] = {}
        idle = self.idle_per_rank().set_index("rank")
        if len(idle):
            out["host_wait"] = kl.differing_ranks(idle["host_wait_ns"])
        ls = self.launch_summary.set_index("rank")
        if len(ls):
            out["launch_delay"] = kl.differing_ranks(ls["delay_ns"])
            out["launch_delay_mean"] = kl.differing_ranks(ls["delay_mean_ns"])
        q = self.queue_summary
        if len(q):
            out["queue_max"] = kl.differing_ranks(q.groupby("rank")["max"].max())
        return out


def join(results: list[Any]) -> HtaAnalyses:
    """The per-rank results (``rank_task.RankResult``) joined; ranks without them left out."""

    def cat(key: str, columns: dict[str, str]) -> pd.DataFrame:
        frames = [f for r in results if (f := getattr(r, key)) is not None and len(f)]
        return pd.concat(frames, ignore_index=True) if frames else _empty(columns)

    queue = cat("queue", kl.QUEUE_COLUMNS)
    return HtaAnalyses(
        idle_time=cat("idle_time", kl.IDLE_COLUMNS),
        launches=cat("launches", kl.LAUNCH_COLUMNS),
        launch_summary=cat("launch_summary", kl.LAUNCH_SUMMARY_COLUMNS),
        queue=queue,
        queue_summary=kl.queue_summary(queue) if len(queue) else _empty(kl.QUEUE_SUMMARY_COLUMNS),
        sequences=cat("sequences", SEQUENCE_COLUMNS),
        host_wait=cat("host_wait", HOST_WAIT_COLUMNS),
        blocking_copies=cat("blocking_copies", BLOCKING_COPY_COLUMNS),
    )
