"""What the terminal summary and the HTML report share: name shortening, the many-rank digest
(:func:`many_rank_rows`, :func:`clock_digest`) and the wording both print.

Separate from ``report_terminal.py`` and ``report_html.py`` so that both renderers take these from
one place (neither imports the other) and say the same thing; summary.json needs none of it. Times
in the rank rows are seconds (summary.json's ``*_s`` fields); clock offsets and uncertainties ns.
"""

from __future__ import annotations

from typing import Any

#: Where "how to read this output" lives (printed under the terminal summary).
READING_DOC = "docs/reading-output.md"
#: Longest op / range name shown in tables before it is shortened.
NAME_WIDTH = 60

#: Title of the what-if block (terminal, HTML report, app).
#: The title of the advice section, first in every report (docs/advice.md).
ADVICE_TITLE = "What to do"
WHAT_IF_TITLE = "What if (per step, mean over profiled steps)"

#: Above this many ranks the terminal summarises per-rank tables (distribution, flagged ranks,
#: hosts) instead of listing every rank; ``--all-ranks`` and summary.json keep every row.
MANY_RANKS = 16


def _disagree_hint(doc: dict[str, Any]) -> str:
    """What the clock-check disagreements mean here, and what to do about them.

    With all offsets exact (uncertainty 0: one host, one clock), a disagreement cannot be a clock
    error: it is ranks leaving the collective at different times (gloo on oversubscribed CPUs),
    which the check's "everybody ends together" assumption does not cover. Otherwise it may be
    either; where the clock cannot settle who arrived last, the analysis orders by durations.
    """
    clock = doc.get("clock") or []
    if not doc.get("collectives", {}).get("clock_disagreements"):
        return ""
    if clock and all(int(c["uncertainty_ns"]) == 0 for c in clock):
        return (
            " (every rank reads one exact clock here: these are ranks leaving a collective at "
            "different times, not clock error; nothing to do)"
        )
    return (
        " (the aligned-clock wait and the clock-free check differ by more than the clock "
        "uncertainty; where that leaves the order of arrivals open, stragglers were judged by "
        f"durations instead. Many of them: see {READING_DOC}, 'Clock check')"
    )


def short_name(name: str, width: int = NAME_WIDTH, tail: int | None = None) -> str:
    """A long kernel/op name cut to ``width`` characters: its head, "…", and its last ``tail``
    characters (default: its last ``: ``/``::`` part up to half the width, else a third), because
    names that share a long prefix — ``autograd::engine::evaluate_function: AddmmBackward0`` —
    differ at the end."""
    if len(name) <= width:
        return name
    keep = width - 1
    if tail is None:
        # the last ": " / "::" part names the thing (evaluate_function: X, aten::X), up to half
        last = max(name.rfind(": ") + 2, name.rfind("::") + 2, 0)
        tail = min(len(name) - last, keep // 2) if last > 1 else keep // 3
    tail = max(0, min(keep, tail))
    return name[: keep - tail] + "…" + (name[-tail:] if tail else "")


def short_names(names: list[str], width: int = NAME_WIDTH) -> list[str]:
    """:func:`short_name` of each, keeping more of the end until shortened names are distinct."""
    keep = width - 1
    out = [short_name(n, width) for n in names]
    for tail in range(keep // 3, keep + 1):
        seen: dict[str, int] = {}
        for short in out:
            seen[short] = seen.get(short, 0) + 1
        clash = [i for i, short in enumerate(out) if seen[short] > 1 and len(names[i]) > width]
        if not clash:
            break
        for i in clash:
            out[i] = short_name(names[i], width, tail)
    return out


_SUMMED_COLUMNS = (
    "total_s",
    "compute_s",
    "comm_exposed_s",
    "comm_overlapped_s",
    "comm_wait_s",
    "comm_transfer_s",
    "memory_s",
    "input_s",
    "idle_s",
)


def many_rank_rows(
    ranks: list[dict[str, Any]], flagged: list[int]
) -> list[tuple[str, dict[str, Any]]]:
    """The rows of a summarised per-rank table: (label, row) for the median, p90 and max of every
    column (each over all ranks, separately), then each flagged rank and the ranks with the most
    total time and the most wait (each once). Aggregate, not drop: every rank counts in the first
    three rows."""
    import numpy as np

    def stat_row(label: str, q: float) -> tuple[str, dict[str, Any]]:
        row: dict[str, Any] = {"rank": -1, "host": ""}
        for key in _SUMMED_COLUMNS:
            row[key] = float(np.quantile([r[key] for r in ranks], q))
        verdicts = [r["verdict"] for r in ranks]
        row["verdict"] = max(set(verdicts), key=verdicts.count) if q == 0.5 else ""
        return label, row

    out = [stat_row("median", 0.5), stat_row("p90", 0.9), stat_row("max", 1.0)]
    by_rank = {int(r["rank"]): r for r in ranks}
    shown: list[int] = []
    for rank in flagged:
        if rank in by_rank and rank not in shown:
            shown.append(rank)
            out.append((f"{rank} flagged", by_rank[rank]))
    for key, what in (("total_s", "most time"), ("comm_wait_s", "most wait")):
        worst = max(ranks, key=lambda r: r[key])
        if int(worst["rank"]) not in shown:
            shown.append(int(worst["rank"]))
            out.append((f"{worst['rank']} {what}", worst))
    return out


def clock_digest(clock: list[dict[str, Any]]) -> str:
    """One paragraph for many ranks' clocks: hosts, methods, offset range, worst uncertainty."""
    from collections import Counter

    hosts = len({c["host"] for c in clock})
    methods = Counter(str(c["method"]) for c in clock)
    offsets = [c["offset_ns"] / 1e6 for c in clock]
    worst = max(clock, key=lambda c: c["uncertainty_ns"])
    method_text = ", ".join(f"{m} {n}" for m, n in methods.most_common())
    return (
        f"Clock alignment: {len(clock)} ranks on {hosts} host(s); methods: {method_text}; "
        f"offsets {min(offsets):+.3f} … {max(offsets):+.3f} ms; largest uncertainty "
        f"±{worst['uncertainty_ns'] / 1e3:.1f} µs (rank {worst['rank']}, {worst['host']}). "
        "--all-ranks lists every rank."
    )
