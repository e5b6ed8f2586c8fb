"""Which parsed ranks the merge keeps, and which rank a trace without one gets.

Decided before anything is written to the store: of two files claiming a rank the first by name
wins; ranks from another job (world size, or a clock :data:`FOREIGN_TIME_NS` away from the
others) are left out; traces that hold no rank (no ``distributedInfo``) get one from their file
name (``--rank-from``) or the lowest free ranks, in the order given, and the merge says which.
Separate from the driver (``orchestrator/ingest/merge.py``) because these rules are what a reader of
"why is rank N missing" looks for, apart from the parsing, aligning and writing around them.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.errors import UsageError
from rankscope.orchestrator.ingest.column_tables import median as column_median
from rankscope.orchestrator.ingest.discovery import Problem, RankSource
from rankscope.orchestrator.ingest.merge_progress import _say
from rankscope.orchestrator.ingest.step_logs import park as park_step_log

if TYPE_CHECKING:
    from rankscope.orchestrator.ingest.rank_columns import RankResult
    from rankscope.orchestrator.ingest.staging import Spill

#: A rank whose trace starts this far (ns) from the others' median start is from another job.
FOREIGN_TIME_NS = 24 * 3600 * 10**9
#: Ranks 0..MAX_RANKS-1 are merged; a trace claiming another rank, or a world size beyond it, is
#: a problem (a hostile 2**70 would list that many missing ranks: docs/reliability.md).
MAX_RANKS = 1 << 20


def rank_pattern(text: str | None) -> re.Pattern[str] | None:
    """``--rank-from``'s regular expression, compiled; one-line UsageError when invalid."""
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as exc:
        raise UsageError(f"--rank-from {text!r}: not a regular expression ({exc})") from None


def rank_in_name(rx: re.Pattern[str], path: Path) -> int | None:
    """The rank ``rx`` finds in ``path``'s file name: its first group, else the whole match."""
    m = rx.search(path.name)
    if m is None:
        return None
    text = m.group(1) if rx.groups else m.group(0)
    return int(text) if text is not None and text.isdigit() else None


def hint_ranks(sources: list[RankSource], rx: re.Pattern[str] | None) -> None:
    """``--rank-from``: each source outside a run directory takes the rank ``rx`` finds in its
    file's name as its hint (None where it finds none), in place; nothing without ``rx``."""
    if rx is None:
        return
    for src in sources:
        if not src.from_run_dir:
            src.rank_hint = rank_in_name(rx, src.files[0][1])


def rank_rankless(
    rankless: list[RankResult], taken: set[int], rank_from: re.Pattern[str] | None
) -> list[tuple[RankResult, str]]:
    """Give ranks to the parsed traces that hold no rank (no ``distributedInfo``, none in the
    name), in the order given (command line, or name order inside a folder): the lowest ranks not
    taken by the others — one such trace alone is rank 0. Never a silent guess: the caller says
    which file got which rank (:func:`rankless_note`). With ``--rank-from``, the user's rule is
    the only one: a file it does not match stays unranked (a problem naming the rule).
    """
    out: list[tuple[RankResult, str]] = []
    free = (r for r in itertools.count() if r not in taken)
    for res in rankless:
        if rank_from is not None:
            out.append(
                (
                    res,
                    f"rank unknown (--rank-from {rank_from.pattern!r} finds no rank number in the file name)",
                )
            )
            continue
        res.rank = next(free)
        out.append((res, ""))
    return out


def rankless_note(ranked: list[RankResult]) -> str:
    """One line naming the rank each rank-less trace got and how to choose otherwise."""
    if len(ranked) == 1:
        res = ranked[0]
        return (
            f"{res.source.label}: no rank in the trace (no distributedInfo) or its name; "
            f"merged as rank {res.rank}"
        )
    shown = ", ".join(f"{Path(r.source.label).name} → {r.rank}" for r in ranked[:6])
    more = f", … ({len(ranked)} in all)" if len(ranked) > 6 else ""
    return (
        f"{len(ranked)} traces hold no rank; ranked in the order given: {shown}{more} "
        "(--rank-from REGEX takes the rank from the file names)"
    )


def _accept(
    result: RankResult,
    parked: dict[int, RankResult],
    spill: Spill,
    problems: list[Problem],
    quiet: bool,
    progress: Any,
    claims: dict[int, list[str]],
) -> None:
    """Park one parsed rank (duplicates: the first file in name order wins, deterministically;
    every file claiming a rank already parked is noted in ``claims``, said once all are in by
    :func:`duplicate_claims`)."""
    rank = int(result.rank)  # type: ignore[arg-type]
    if not 0 <= rank < MAX_RANKS:  # found by tests/test_fuzz.py: 2**70 ranks were "missing"
        p = Problem(result.source.label, -1, f"rank {rank} out of range (0..{MAX_RANKS - 1})")
        problems.append(p)
        _say(p, quiet, progress)
        return
    if rank in parked:
        old = parked[rank]
        claims.setdefault(rank, [old.source.label]).append(result.source.label)
        if old.source.label <= result.source.label:
            return
    assert result.columns is not None
    spill.put(rank, result.columns)
    result.columns = None  # only the small tables stay in memory
    if result.memory is not None:
        spill.put(rank, result.memory, part="memory")
        result.memory = None
    park_step_log(spill, rank, result)
    parked[rank] = result


def duplicate_claims(
    claims: dict[int, list[str]],
    parked: dict[int, RankResult],
    problems: list[Problem],
    quiet: bool,
    progress: Any,
) -> None:
    """One problem per file whose rank another file also claimed, naming the file kept (the
    first in name order), in rank and then file-name order. Said once every rank is in: worker
    processes hand results over as they finish, and a problem said on arrival named whichever
    claimant had come first (not always the one kept) in that order."""
    for rank in sorted(claims):
        winner = parked[rank].source.label
        losers = sorted(claims[rank])
        losers.remove(winner)
        for label in losers:
            p = Problem(label, rank, f"rank {rank} also claimed by {winner}; ignored")
            problems.append(p)
            _say(p, quiet, progress)


def _world_claim(value: Any) -> int:
    """A claimed world size if it is a plausible one (1..MAX_RANKS), else 0 (unknown)."""
    return value if type(value) is int and 0 < value <= MAX_RANKS else 0


def _reject_foreign(
    run: dict[str, Any],
    parked: dict[int, RankResult],
    spill: Spill,
    problems: list[Problem],
    quiet: bool,
) -> None:
    """Leave out ranks from another job (world size disagreeing with the run, far-apart times).

    Runs before any rank is written, so a foreign rank never takes space in the store.
    """
    expected = run.get("world_size") or _common(r.world_size for r in parked.values())
    first = {r: res.t_first for r, res in parked.items()}
    known = list(first.values())
    median = column_median(known) if known else None
    for r, res in sorted(parked.items()):
        why = None
        if expected and res.world_size and res.world_size != expected:
            why = f"trace from another job: world size {res.world_size}, this run has {expected}"
        elif median is not None and abs(first[r] - median) > FOREIGN_TIME_NS:
            hours = abs(first[r] - median) / 3.6e12
            why = f"trace from another job: recorded {hours:.0f} h apart from the other ranks"
        if why:
            p = Problem(res.source.label, r, why + "; rank left out")
            problems.append(p)
            _say(p, quiet)
            spill.drop(r)
            del parked[r]


def _common(values: Any) -> Any:
    vals = [v for v in values if v]
    if not vals:
        return None
    from collections import Counter

    return Counter(vals).most_common(1)[0][0]
