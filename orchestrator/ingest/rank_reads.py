"""One rank source's trace files read into one string table (:func:`read_source`).

The one reading loop of the merge: ``rank_columns.parse_source`` builds the rank from what it
returns, in the merge's task or in the process that parses ahead (``source_reads.ReadAhead``).
Like the reader it imports neither pandas nor h5py (``tests/test_reader_imports.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rankscope.orchestrator.ingest.comm_kernels import DEFAULT_VOCABULARY, CommVocabulary
from rankscope.orchestrator.ingest.discovery import RankSource

if TYPE_CHECKING:
    from rankscope.orchestrator.ingest.file_trace import FileTrace


@dataclass
class SourceReads:
    """What :func:`read_source` made of one rank source's files."""

    outcomes: list[tuple[int, Path, FileTrace | str]]
    """per file, in the source's order: window, the name to print, and its trace or the one-line
    problem that made it unreadable"""
    strings: list[str]
    """the rank's string table once every file was read (the traces' codes index it)"""


def read_source(
    source: RankSource, vocabulary: CommVocabulary = DEFAULT_VOCABULARY, beside: bool = False
) -> SourceReads:
    """Read every file of ``source`` into one string table (``decode.read_trace``, unsorted: the
    rank sorts its windows' events once); a file that cannot be read becomes its problem text.
    ``beside``: the scanner may use a second core (``read_trace``'s)."""
    from rankscope.orchestrator.ingest.decode import read_trace
    from rankscope.orchestrator.ingest.event_columns import StringTable
    from rankscope.orchestrator.ingest.kineto_json import TraceReadError

    strings: StringTable = {}  # one table for all windows: codes need no translation
    outcomes: list[tuple[int, Path, FileTrace | str]] = []
    for window, file in source.files:
        path = Path(source.origin) if source.origin is not None else file  # the name to print
        try:
            outcomes.append(
                (
                    window,
                    path,
                    read_trace(file, strings=strings, sort=False, comm=vocabulary, beside=beside),
                )
            )
        except TraceReadError as exc:
            outcomes.append((window, path, str(exc)))
        except MemoryError:
            outcomes.append((window, path, "out of memory while parsing"))
    return SourceReads(outcomes, list(strings))
