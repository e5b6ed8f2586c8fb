"""Discovery: which files are rank traces, which rank each holds, and how they group into ranks.

A merge is given a run directory (``ranks/NNNNN/window-*.json.gz`` + ``meta.json``), any folder
of Kineto traces (searched recursively), or trace files. This module turns those paths into
:class:`RankSource` s — the files of one rank, in window order — plus the :class:`Problem` s found
on the way, and owns the naming rules that decide it: trace names, rank numbers in names and
folders, and the sniffing of a file's first bytes that tells a trace from other JSON lying beside
it (rankscope's own summary.json and Perfetto exports, the user's files).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from rankscope.analysis.render.perfetto import GENERATOR as PERFETTO_GENERATOR
from rankscope.launchers import rundir

#: Trace files found in a folder (torch.profiler / tensorboard_trace_handler / rankscope names).
TRACE_SUFFIXES = (".json", ".json.gz")
#: Names of JSON files beside traces that are not traces (skipped without a problem).
NOT_TRACE_PATTERNS = (re.compile(r"(^|\.)meta\.json$"), re.compile(r"^run\.json$"))
#: Names that are traces whatever their content, so a broken one is reported, never skipped:
#: torch.profiler's ``tensorboard_trace_handler`` (``*.pt.trace.json[.gz]``) and rankscope's
#: windows (names carrying a rank count too, see :func:`is_trace_file_name`).
TRACE_NAME_PATTERNS = (
    re.compile(r"\.pt\.trace\.json(\.gz)?$"),
    re.compile(r"^window-\d+\.json\.gz$"),
)
#: JSON text read from the start of a file to tell a Kineto trace from other JSON. Kineto writes
#: ``traceEvents`` after a small header (schemaVersion, deviceProperties, distributedInfo).
SNIFF_BYTES = 1 << 18
#: Most JSON text gunzipped per step while sniffing: the head usually decides within the first
#: few KB, and gunzipping a whole 1 MiB piece of every trace of a folder to read them cost
#: ~1.8 ms a file (113 ms for the 64 files of ``pp64``, before the merge could start).
SNIFF_PIECE_BYTES = 1 << 14
_TRACE_KEY = re.compile(rb'"traceEvents"\s*:')
#: The trace event format's other form, a bare JSON array of events (Composer's merger writes it).
_ARRAY_HEAD = re.compile(rb'^\s*\[\s*\{[^{}]*"ph"\s*:')
#: rankscope's own Perfetto export: ``{"otherData": {"generator": "rankscope export …"`` first.
_EXPORT_HEAD = re.compile(
    rb'^\s*\{\s*"otherData"\s*:\s*\{\s*"generator"\s*:\s*"' + re.escape(PERFETTO_GENERATOR.encode())
)
#: Rank in a file or folder name: rank-3, rank3, rank_3, worker3, ranks/00003/.
RANK_NAME_PATTERNS = (
    re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:^|[^a-z])worker[-_]?(\d+)", re.IGNORECASE),
)
RANK_DIR_PATTERN = re.compile(r"^\d{5}$")
#: Window index in a run directory's window file name.
WINDOW_INDEX = re.compile(r"window-(\d+)")


@dataclass
class RankSource:
    """The files of one rank (several profiler windows in a run directory, else one file)."""

    files: list[tuple[int, Path]]
    """(window index, path) in window order"""
    rank_hint: int | None
    """rank from the run-directory layout or the file name (None when unknown)"""
    from_run_dir: bool = False
    """True when the rank comes from ``ranks/NNNNN`` (authoritative)"""
    meta: dict[str, Any] = field(default_factory=dict)
    """the rank's meta.json (run directories), else empty"""
    origin: str | None = None
    """what to call the files when they are a part the merge cut out of a merged file
    (``merged.json.gz [rank 3]``; ``multirank.py``), else None"""

    @property
    def label(self) -> str:
        """The file name to print (the first file, or the rank folder)."""
        if self.origin is not None:
            return self.origin
        if len(self.files) == 1:
            return str(self.files[0][1])
        return str(self.files[0][1].parent) if self.files else "?"


@dataclass
class Problem:
    """One thing that could not be ingested."""

    file: str
    rank: int
    problem: str


def rank_from_path(path: Path) -> int | None:
    """Rank from a file name (rank-3, rank3, worker3) or a run-dir folder (ranks/00003/)."""
    for pattern in RANK_NAME_PATTERNS:
        m = pattern.search(path.name)
        if m:
            return int(m.group(1))
    if RANK_DIR_PATTERN.match(path.parent.name) and path.parent.parent.name == "ranks":
        return int(path.parent.name)
    return None


def is_trace_name(path: Path) -> bool:
    """True for names that may hold a trace (.json / .json.gz, not meta.json / run.json)."""
    name = path.name
    if not name.endswith(TRACE_SUFFIXES):
        return False
    return not any(p.search(name) for p in NOT_TRACE_PATTERNS)


def is_trace_file_name(path: Path) -> bool:
    """True for names that say "trace" on their own: a rank in the name, a profiler trace name.

    Such a file found in a folder is always taken, so a broken one is reported as a problem.
    """
    if not is_trace_name(path):
        return False
    return rank_from_path(path) is not None or any(p.search(path.name) for p in TRACE_NAME_PATTERNS)


class TraceHead(enum.Enum):
    """What the first bytes of a JSON file say it is (:func:`sniff`)."""

    TRACE = "a Kineto trace (traceEvents)"
    EXPORT = "a Perfetto export written by rankscope"
    OTHER = "JSON that is not a trace"
    UNREADABLE = "unreadable"


def sniff(path: Path, limit: int = SNIFF_BYTES) -> TraceHead:
    """Tell what ``path`` holds from its first ``limit`` bytes of JSON text (gunzipped).

    Why: a folder is searched recursively, and beside the traces lie other JSON files —
    rankscope's own outputs (summary.json, a Perfetto export) and the user's. Reading the head
    of each is cheap and tells them apart without parsing the whole file.

    The text is read in small pieces (:data:`SNIFF_PIECE_BYTES`) and the reading stops as soon as
    what is read decides (:func:`head_says`): the answer is the one the first ``limit`` bytes
    give, without gunzipping them all. A file whose text cannot be read before it has decided
    (a corrupt or truncated gzip) is UNREADABLE: taken, so that the parse reports it.
    """
    from rankscope.orchestrator.ingest.kineto_json import TraceReadError, text_pieces

    head = bytearray()
    pieces = cast(
        "Generator[bytes, None, None]", text_pieces(path, piece_bytes=SNIFF_PIECE_BYTES)
    )  # a generator
    try:
        for piece in pieces:
            head += piece
            said = head_says(bytes(head[:limit]), complete=len(head) >= limit)
            if said is not None:
                return said
    except TraceReadError:
        return TraceHead.UNREADABLE
    finally:
        pieces.close()  # closes the file now, not when the generator is collected
    return cast("TraceHead", head_says(bytes(head[:limit]), complete=True))


def head_says(text: bytes, *, complete: bool) -> TraceHead | None:
    """What the head ``text`` of a file says it is; None when more text could change the answer.

    ``complete``: ``text`` is all the head there is to read (the first :data:`SNIFF_BYTES`, or
    the whole file). Rules, on the complete head: the first ``"traceEvents":`` key, with
    rankscope's export marker before it, is an EXPORT, without it a TRACE; no key: the export
    marker at the start is an EXPORT, a bare JSON array of events a TRACE, anything else OTHER.
    A part of the head decides as soon as one of them matches in it, since each answer then
    stays: a key found is the first one of the whole head (none can start earlier and end
    later: ``"`` is neither blank nor ``:``), and the export marker or an array's start cannot
    be undone by what follows (nor hold a key's start).
    """
    events = _TRACE_KEY.search(text)
    if events is not None:
        return TraceHead.EXPORT if _EXPORT_HEAD.match(text[: events.start()]) else TraceHead.TRACE
    if _EXPORT_HEAD.match(text):
        return TraceHead.EXPORT
    if _ARRAY_HEAD.match(text):
        return TraceHead.TRACE
    return TraceHead.OTHER if complete else None


def is_folder_trace(path: Path) -> bool:
    """Whether a file found in a recursive folder search is merged (else skipped silently).

    Taken: files whose head shows ``traceEvents``, and files named like traces
    (:func:`is_trace_file_name`) whatever they hold — a truncated ``rank-3.json.gz`` must be
    reported, not lost. Skipped: hidden files (temporaries, lock files), meta.json / run.json,
    rankscope's own Perfetto exports (by their marker), and any other JSON (summary.json …).
    """
    if path.name.startswith(".") or not is_trace_name(path):
        return False
    head = sniff(path)
    if head is TraceHead.EXPORT:
        return False
    return head in (TraceHead.TRACE, TraceHead.UNREADABLE) or is_trace_file_name(path)


def discover(paths: list[Path]) -> tuple[list[RankSource], dict[str, Any], list[Problem]]:
    """Rank sources from the given paths; returns (sources, run.json or {}, problems)."""
    sources: list[RankSource] = []
    run: dict[str, Any] = {}
    problems: list[Problem] = []
    for path in paths:
        if path.is_dir() and (path / rundir.RANKS_DIR).is_dir():
            run_json = path / rundir.RUN_JSON
            if run_json.is_file():
                try:
                    run = rundir.read_json(run_json)
                except (OSError, ValueError) as exc:
                    problems.append(Problem(str(run_json), -1, f"unreadable run.json ({exc})"))
            for rdir in sorted((path / rundir.RANKS_DIR).iterdir()):
                if not rdir.is_dir() or not rdir.name.isdigit():
                    continue
                rank = int(rdir.name)
                meta: dict[str, Any] = {}
                meta_path = rdir / rundir.META_JSON
                if meta_path.is_file():
                    try:
                        meta = rundir.read_json(meta_path)
                    except (OSError, ValueError) as exc:
                        problems.append(
                            Problem(str(meta_path), rank, f"unreadable meta.json ({exc})")
                        )
                files: list[tuple[int, Path]] = []
                for f in sorted(rdir.glob(rundir.WINDOW_GLOB)):
                    m = WINDOW_INDEX.search(f.name)
                    files.append((int(m.group(1)) if m else len(files), f))
                if not files:
                    problems.append(Problem(str(rdir), rank, "no trace windows (rank wrote none)"))
                    continue
                sources.append(RankSource(files, rank, from_run_dir=True, meta=meta))
        elif path.is_dir():
            found = folder_traces(path)
            if not found:
                problems.append(Problem(str(path), -1, "no Kineto trace files (*.json, *.json.gz)"))
            sources.extend(RankSource([(0, p)], rank_from_path(p)) for p in found)
        else:
            sources.append(RankSource([(0, path)], rank_from_path(path)))
    return sources, run, problems


def folder_traces(folder: Path) -> list[Path]:
    """The trace files of a folder searched recursively, in name order.

    rankscope writes its own files into the folders it merges (``report/`` with summary.json
    and report.html, Perfetto exports, the store, its lock and temporaries): none of them is an
    input, so re-merging after ``analyze`` / ``export`` finds the same traces and no problem.
    The report folder is left out whole; every other file must look like a trace
    (:func:`is_folder_trace`).
    """
    skipped = [d for d in (folder / rundir.REPORT_DIR,) if is_report_dir(d)]
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(p.is_relative_to(d) for d in skipped) and is_folder_trace(p)
    )


def is_report_dir(path: Path) -> bool:
    """True for a report folder written by ``rankscope analyze`` (summary.json / report.html)."""
    return path.is_dir() and any(
        (path / name).is_file() for name in (rundir.SUMMARY_JSON, rundir.REPORT_HTML)
    )


def nothing_to_merge(first_input: Path, problems: list[Problem]) -> str:
    """The one-line error when discovery found no trace at all (its problems say why)."""
    if not problems:
        return f"{first_input}: no trace files to merge"
    first = problems[0]
    text = f"{first.file}: {first.problem}"
    if first.file != str(first_input):
        text = f"{first_input}: no trace files to merge ({text}"
        text += f"; {len(problems) - 1} more problem(s))" if len(problems) > 1 else ")"
    elif len(problems) > 1:
        text += f" ({len(problems) - 1} more problem(s))"
    return text
