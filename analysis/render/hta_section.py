"""HTA's analyses (idle time, kernel launches, queue length, kernel sequences) in summary.json's
``hta_analyses`` (docs/summary.md), the HTML report's tables and the terminal's few lines.

Renders only: the figures are ``hta_across.HtaAnalyses``' (definitions: docs/analysis.md,
"HTA's analyses"). summary.json times are µs like its ``hta`` key (HTA's unit), rounded to the
ns; the terminal shows only what a user acts on — where the GPU sat idle waiting for the host,
and how late kernels started after their launch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from rankscope.analysis.compute.hta_across import HtaAnalyses

#: Kernel sequences per rank in summary.json and the report (the most frequent).
TOP_SEQUENCES = 5


def _us(ns: Any) -> float:
    return round(float(ns) / 1e3, 3)


def _num(x: Any) -> float | None:
    v = float(x)
    return None if v != v else round(v, 3)


def hta_analyses_summary(h: HtaAnalyses | None) -> dict[str, Any] | None:
    """summary.json's ``hta_analyses``; None without GPU ranks (the key is then left out)."""
    if h is None or (not len(h.idle_time) and not len(h.launch_summary)):
        return None
    seq = h.sequences.groupby("rank", sort=True).head(TOP_SEQUENCES)
    return {
        "idle_time": [
            {
                "rank": int(r.rank),
                "stream": int(r.stream),
                "host_wait_us": _us(r.host_wait_ns),
                "kernel_wait_us": _us(r.kernel_wait_ns),
                "other_us": _us(r.other_ns),
                "idle_us": _us(r.idle_ns),
                "gaps": int(r.gaps),
                "unlaunched_us": _us(r.unlaunched_ns),
            }
            for r in h.idle_time.itertuples(index=False)
        ],
        "launches": [
            {
                "rank": int(r.rank),
                "launches": int(r.launches),
                "cpu_us": _us(r.cpu_ns),
                "gpu_us": _us(r.gpu_ns),
                "delay_us": _us(r.delay_ns),
                "delay_mean_us": _num(r.delay_mean_ns / 1e3),
                "delay_p50_us": _num(r.delay_p50_ns / 1e3),
                "delay_max_us": _us(r.delay_max_ns),
                "short_kernels": int(r.short_kernels),
                "runtime_outliers": int(r.runtime_outliers),
                "delay_outliers": int(r.delay_outliers),
            }
            for r in h.launch_summary.itertuples(index=False)
        ],
        "queue_length": [
            {
                "rank": int(r.rank),
                "stream": int(r.stream),
                "changes": int(r.changes),
                "mean": round(float(r.mean), 4),
                "mean_in_time": round(float(r.mean_in_time), 4),
                "max": int(r.max),
            }
            for r in h.queue_summary.itertuples(index=False)
        ],
        "kernel_sequences": [
            {
                "rank": int(r.rank),
                "operator": str(r.operator),
                "pattern": str(r.pattern),
                "count": int(r.count),
                "kernels": int(r.kernels),
                "gpu_us": _us(r.gpu_ns),
                "cpu_us": _us(r.cpu_ns),
            }
            for r in seq.itertuples(index=False)
        ],
        "differing_ranks": h.differing(),
    }


def hta_tables(doc: dict[str, Any]) -> list[tuple[str, list[str], list[list[Any]]]]:
    """The report's tables from summary.json's ``hta_analyses``: (title, header, rows)."""
    out = _critical_table(doc)
    h = doc.get("hta_analyses")
    if not h:
        return out
    diff = h["differing_ranks"]

    def note(key: str) -> str:
        return f" — ranks that differ: {', '.join(map(str, diff[key]))}" if diff.get(key) else ""

    return [
        *out,
        (
            "GPU idle time per stream (µs; HTA's idle-time breakdown)" + note("host_wait"),
            ["rank", "stream", "host wait", "kernel wait", "other", "idle", "gaps"],
            [
                [
                    r["rank"],
                    r["stream"],
                    r["host_wait_us"],
                    r["kernel_wait_us"],
                    r["other_us"],
                    r["idle_us"],
                    r["gaps"],
                ]
                for r in h["idle_time"]
            ],
        ),
        (
            "Kernel launches (µs; HTA's launch statistics)" + note("launch_delay"),
            [
                "rank",
                "launches",
                "launch delay",
                "mean",
                "median",
                "max",
                "short kernels",
                "runtime outliers",
                "delay outliers",
            ],
            [
                [
                    r["rank"],
                    r["launches"],
                    r["delay_us"],
                    r["delay_mean_us"],
                    r["delay_p50_us"],
                    r["delay_max_us"],
                    r["short_kernels"],
                    r["runtime_outliers"],
                    r["delay_outliers"],
                ]
                for r in h["launches"]
            ],
        ),
        (
            "CUDA stream queue length (launched, not started)" + note("queue_max"),
            ["rank", "stream", "changes", "mean per change", "mean in time", "max"],
            [
                [r["rank"], r["stream"], r["changes"], r["mean"], r["mean_in_time"], r["max"]]
                for r in h["queue_length"]
            ],
        ),
        (
            f"Frequent kernel sequences (top {TOP_SEQUENCES} per rank: fusion candidates)",
            ["rank", "count", "kernels", "GPU µs", "sequence"],
            [
                [r["rank"], r["count"], r["kernels"], r["gpu_us"], r["pattern"]]
                for r in h["kernel_sequences"]
            ],
        ),
    ]


def _critical_table(doc: dict[str, Any]) -> list[tuple[str, list[str], list[list[Any]]]]:
    c = doc.get("critical_path")
    if not c:
        return []
    return [
        (
            f"Critical path across ranks ({c['steps']} steps, {c['path_s'] * 1e3:.3f} ms)",
            ["rank", "own work ms", "transfer ms", "share of the path"],
            [
                [
                    r["rank"],
                    round(r["own_work_s"] * 1e3, 3),
                    round(r["transfer_s"] * 1e3, 3),
                    r["share"],
                ]
                for r in c["by_rank"]
            ],
        )
    ]


def hta_terminal_lines(doc: dict[str, Any]) -> list[str]:
    """Two lines at most: idle time waiting for the host, and launch delay, over all GPU ranks."""
    h = doc.get("hta_analyses")
    if not h:
        return []
    lines = []
    idle = sum(r["idle_us"] for r in h["idle_time"])
    host = sum(r["host_wait_us"] for r in h["idle_time"])
    if idle > 0:
        share = host / idle
        ranks = h["differing_ranks"].get("host_wait") or []
        odd = f"; ranks that differ: {', '.join(map(str, ranks))}" if ranks else ""
        lines.append(
            f"GPU idle between kernels: {idle / 1e3:.1f} ms summed over streams and ranks, "
            f"{share:.0%} of it waiting for the host to launch{odd}"
        )
    n = sum(r["launches"] for r in h["launches"])
    if n:
        delay = sum(r["delay_us"] for r in h["launches"])
        late = sum(r["delay_outliers"] for r in h["launches"])
        ranks = h["differing_ranks"].get("launch_delay") or []
        odd = f"; ranks that differ: {', '.join(map(str, ranks))}" if ranks else ""
        lines.append(
            f"Kernel launch delay: {delay / n:.1f} µs mean over {n} launches, "
            f"{late} started > 100 µs after their launch call{odd}"
        )
    return lines


def critical_path_summary(path: pd.DataFrame | None) -> dict[str, Any] | None:
    """summary.json's ``critical_path``: over the profiled steps, each rank's own work and the
    transfers on the steps' critical paths (s) and their share of the paths' length; None
    without a what-if graph (the key is then left out)."""
    from rankscope.analysis.compute.whatif_graph import EARLY, OWN_EDGES, TRANSFER

    if path is None or not len(path):
        return None
    length = int(path.drop_duplicates("step")["step_ns"].sum())
    by_rank = []
    for rank, g in path.groupby("rank", sort=True):
        own = int(g[g["kind"].isin(OWN_EDGES)]["ns"].sum())
        xfer = int(g[g["kind"].isin((TRANSFER, EARLY))]["ns"].sum())
        by_rank.append(
            {
                "rank": int(rank),
                "own_work_s": round(own / 1e9, 6),
                "transfer_s": round(xfer / 1e9, 6),
                "share": round((own + xfer) / length, 4) if length > 0 else None,
            }
        )
    by_rank.sort(key=lambda r: -(r["share"] or 0.0))
    return {
        "steps": int(path["step"].nunique()),
        "path_s": round(length / 1e9, 6),
        "by_rank": by_rank,
    }
