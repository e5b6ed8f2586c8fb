"""A rank source's trace files read: here, or ahead in a process forked before the heavy imports.

``rank_reads.read_source`` is the one loop that reads a rank's files (``decode.read_trace``, one
string table for all its windows): ``rank_columns.parse_source`` builds the rank from what it
returns.

:class:`ReadAhead` parses early. A small job's merge (``rankscope merge``, ``rankscope analyze
FOLDER``) spent ~0.3 s importing pandas and h5py before its first read, then read on one core
while the other idled. Neither the reader nor the rank's build needs them (``file_trace.py``,
``rank_columns.py``), so the command forks one process before those imports, which parses every
source in turn (``parse_source``: reads, then the rank's columns and tables) while this one
imports; the merge then takes each rank's parse instead of doing it again (docs/performance.md,
tenth pass: the reads; thirteenth: the rank's build too).

When (:meth:`ReadAhead.start`): only where the merge itself would parse in this process
(``scheduler.choose`` with the merge's own rates, :func:`parse_choice`, ``"auto"`` asked), on
Linux (a fork) with two cores or more. A job worth worker processes gets them as before, forked
after the imports; a user who asked for one process (``--scheduler synchronous``) gets one.

What is taken (:meth:`ReadAhead.take`): a source's parse only when the source (its files, rank
hint -- ``--rank-from`` is applied ahead too --, folder and meta) and the comm kernels in force
are the ones parsed ahead (a merged file split into ranks, say, is parsed as usual). A parse not
begun yet when the merge reaches its rank is cancelled and done here, so both
cores read from then on; one begun is waited for, at most :data:`READ_AHEAD_WAIT_S` beyond the
job's estimated parse time; a read-ahead process that died (killed for memory) or took too long
is ended and its ranks read here, as if there had been none. The process ends with this one
(``forked_workers``), and :meth:`ReadAhead.close` ends it at once (terminate, then kill, bounded).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from rankscope.orchestrator.ingest.comm_kernels import CommVocabulary
from rankscope.orchestrator.ingest.discovery import RankSource

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor

    from rankscope.analysis.engine.scheduler import Choice, ClusterSpec
    from rankscope.analysis.engine.shared_results import SharedResults
    from rankscope.orchestrator.ingest.rank_columns import RankResult

#: Bytes of Kineto JSON per event, to size a merge before parsing it (:func:`estimate_events`).
#: Measured on tests/data: 367-409 bytes per event (mean 380) over 21 plain traces.
JSON_BYTES_PER_EVENT = 380
#: The same for gzip-compressed traces: 24-30 bytes per event (mean 25) over 16 ``.json.gz``.
GZIP_BYTES_PER_EVENT = 25
#: Estimated events (:func:`estimate_events`) one core parses per second, and the fixed seconds
#: of one rank's parse (open, inflate set-up, the rank's tables), for the scheduler's choice
#: (``scheduler.choose``: forked workers pay on 2 cores above ~1 s of parsing). Refitted when the
#: compiled scanner made the reader ~3x faster (issue 31, twelfth pass) to the parse CPU
#: (``parse_source``, in-process, ``--scheduler synchronous``) of three jobs on this project's
#: 2-core machine: ``param_dlrm_8rank`` (8 ranks, 19,352 estimated events, 0.19 s), the 54 MB
#: ``df_index_resolver`` (1 rank, 119,686, 0.19-0.22 s) and a synth job of 8 ranks x 50k
#: events (370,559, 0.35-0.39 s; 1.15 s before the scanner). Real Kineto events are larger
#: than synth's (435 against 244 bytes of JSON each, alike in gzip), so no one rate fits both:
#: 0.02 s per rank and 1.25 µs per event lie between them (DLRM +-5 %, the big rank -17 %,
#: the synth job +68 %, which keeps it in-process: 0.78 s there, 1.1 s on 2 forked workers).
PARSE_EVENTS_PER_S = 800_000
PARSE_RANK_S = 0.02
#: Seconds a take waits for a read begun ahead, beyond the whole job's estimated parse time
#: (:func:`estimate_events` at :data:`PARSE_EVENTS_PER_S`): past it the read-ahead process is
#: ended and the rank read here.
READ_AHEAD_WAIT_S = 30.0
#: Bytes of freed memory the read-ahead process keeps for its next allocations instead of giving
#: them back (``forked_workers._pad_heap``): more than one large rank's text block and columns.
READ_AHEAD_HEAP_PAD = 64 << 20
#: Bytes of shared memory reserved per estimated event for the parses handed over
#: (``_shared_results``): a parse takes ~65 (the 54 MB ``df_index_resolver``: 8 MB of columns
#: for 123k events); what does not fit comes through the pipe. Address space only until used.
RESULT_BYTES_PER_EVENT = 256
#: ... and at least this many, at most that many.
RESULT_BYTES_MIN = 1 << 20
RESULT_BYTES_MAX = 1 << 30


def estimate_events(sources: list[RankSource]) -> int:
    """Events the sources hold, estimated from their size on disk (nothing is read).

    Enough to choose where to parse (:func:`rankscope.analysis.engine.scheduler.choose` weighs it
    against what worker processes cost, at the parse's own rate: :data:`PARSE_EVENTS_PER_S`).
    """
    total = 0
    for source in sources:
        for _, path in source.files:
            try:
                size = path.stat().st_size
            except OSError:
                continue
            per_event = GZIP_BYTES_PER_EVENT if path.name.endswith(".gz") else JSON_BYTES_PER_EVENT
            total += size // per_event
    return total


def parse_choice(spec: ClusterSpec, sources: list[RankSource]) -> Choice:
    """Where ``sources`` are parsed (``scheduler.choose`` at the parse's own rates)."""
    from rankscope.analysis.engine.scheduler import choose

    return choose(spec, len(sources), estimate_events(sources), PARSE_RANK_S, PARSE_EVENTS_PER_S)


def _shared_results(sources: list[RankSource]) -> SharedResults | None:
    """Where the read-ahead process hands its parses over (``analysis/engine/shared_results.py``):
    :data:`RESULT_BYTES_PER_EVENT` per estimated event, at most :data:`RESULT_BYTES_MAX`; None
    where the system refuses the mapping (the parses then come through the pipe)."""
    from rankscope.analysis.engine.shared_results import SharedResults

    nbytes = min(
        RESULT_BYTES_MAX, RESULT_BYTES_MIN + estimate_events(sources) * RESULT_BYTES_PER_EVENT
    )
    try:
        return SharedResults(nbytes)
    except (OSError, ValueError):
        return None


def _files(source: RankSource) -> tuple[tuple[int, Path], ...]:
    """What a source's reads depend on, besides the comm kernels: its files, in order."""
    return tuple(source.files)


class ReadAhead:
    """Sources parsed in one forked process while this one goes on (module docstring); scoped by
    ``orchestrator.merge.read_ahead``, which closes it (``contextlib.closing`` elsewhere)."""

    def __init__(
        self,
        sources: list[RankSource],
        vocabulary: CommVocabulary,
        wait_s: float,
        run_dir: bool = False,
    ) -> None:
        from rankscope.analysis.engine.forked_workers import forked_pool, shared_call
        from rankscope.orchestrator.ingest.rank_columns import parse_source

        self.vocabulary = vocabulary
        self.wait_s = wait_s
        """seconds a take waits for a parse begun (:data:`READ_AHEAD_WAIT_S` and the estimate)"""
        self._pool: ProcessPoolExecutor | None
        self._shared = _shared_results(sources)
        self._pool, self._before = forked_pool(1, heap_pad=READ_AHEAD_HEAP_PAD, shared=self._shared)
        #: a source's files → the source as parsed ahead, and its parse
        self._parses: dict[tuple[tuple[int, Path], ...], tuple[RankSource, Future[RankResult]]]
        self._parses = {}
        for source in sources:
            if _files(source) not in self._parses:
                # the only parse running (the scanner may take the second core: beside)
                parse = self._pool.submit(shared_call, parse_source, source, vocabulary, None, True)
                self._parses[_files(source)] = (dataclasses.replace(source), parse)
        self.taken = 0
        """sources whose parses were taken (the rest were parsed here)"""
        self.run_dir = run_dir
        """the inputs are a ``rankscope run`` folder (``run.json``: its clock samples and step
        changes are read with pandas; ``orchestrator/merge.py``)"""

    @classmethod
    def start(
        cls,
        inputs: list[Path],
        spec: ClusterSpec,
        vocabulary: CommVocabulary,
        rank_from: str | None = None,
    ) -> ReadAhead | None:
        """Begin parsing the sources of ``inputs`` in a forked process, where that pays (module
        docstring); None where it does not, or where there is nothing to read. ``rank_from``:
        ``--rank-from``'s expression, applied as the merge applies it."""
        from rankscope.analysis.engine.scheduler import AUTO, SYNCHRONOUS, can_fork, cores
        from rankscope.errors import UsageError
        from rankscope.orchestrator.ingest.discovery import discover
        from rankscope.orchestrator.ingest.rank_selection import hint_ranks, rank_pattern

        if spec.scheduler != AUTO or spec.slurm_workers is not None:
            return None
        if cores() < 2 or not can_fork() or not all(p.exists() for p in inputs):
            return None
        try:
            sources, run, _ = discover(inputs)
            hint_ranks(sources, rank_pattern(rank_from))
        except (OSError, ValueError, UsageError):
            return None  # the merge says what is wrong, in its words
        if not sources or parse_choice(spec, sources).scheduler != SYNCHRONOUS:
            return None
        # the parse's modules before the fork: the process parses at once, and this one needs
        # them (a parse taken is a RankResult)
        import rankscope.orchestrator.ingest.comm_links
        import rankscope.orchestrator.ingest.decode  # noqa: F401

        wait_s = READ_AHEAD_WAIT_S + estimate_events(sources) / PARSE_EVENTS_PER_S
        return cls(sources, vocabulary, wait_s, run_dir=bool(run))

    def take(self, source: RankSource, vocabulary: CommVocabulary) -> RankResult | None:
        """The parse of ``source``, or None: parse it here (not parsed ahead, parsed as another
        source or with other comm kernels, not begun yet (cancelled now), the read-ahead process
        failed (ended now), or the parse raised what a parse here raises again, with this
        process' own traceback)."""
        from concurrent.futures import CancelledError
        from concurrent.futures import TimeoutError as FutureTimeout
        from concurrent.futures.process import BrokenProcessPool

        ahead = self._parses.pop(_files(source), None)
        if ahead is None or ahead[0] != source or vocabulary != self.vocabulary:
            return None
        fut = ahead[1]
        if fut.cancel():
            return None
        try:
            parsed = fut.result(timeout=self.wait_s)
        except (BrokenProcessPool, FutureTimeout, CancelledError):
            self.close()
            return None
        except Exception:  # parsed here: the same error, raised where it belongs
            return None
        if self._shared is not None:
            parsed = self._shared.unpack(parsed)
        self.taken += 1
        if not self._parses and self._pool is not None:
            # every parse taken: the process ends (its memory freed) beside the merge's writes,
            # not in close()'s wait (~5 ms of the 54 MB rank's merge, measured)
            from rankscope.analysis.engine.forked_workers import signal_workers

            signal_workers(self._before)
        return dataclasses.replace(parsed, source=source)  # the merge's own, not a copy

    @property
    def note(self) -> str:
        """The words the merge adds to its line about where it parses."""
        return "; its reads begun by a process forked at start-up"

    def close(self) -> None:
        """End the read-ahead process now (parses not taken are dropped)."""
        from rankscope.analysis.engine.forked_workers import stop_pool

        if self._pool is not None:
            pool, self._pool = self._pool, None
            self._parses.clear()
            stop_pool(pool, self._before)
