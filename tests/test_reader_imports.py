"""The trace reader and a rank's build import neither pandas nor h5py
(``orchestrator/ingest/file_trace.py``, ``rank_columns.py``).

What they make of a rank's files is numpy columns and plain rows, so ranks can be parsed where
those ~0.3 s of imports have not happened yet; the small tables become DataFrames where wanted.
Nor does a rank's build or a merge without pandas import ``numpy.ma`` (which ``np.unique``
imports at its first call: 6-7 ms per process; ``column_tables.distinct``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from rankscope.analysis.store.schema import LaneKind
from rankscope.orchestrator.ingest.decode import read_trace

DATA = Path(__file__).parent / "data"
#: A real NCCL trace whose ``record_param_comms`` ops name their collectives (enqueue rows).
NCCL = DATA / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
#: A real 54 MB rank with ``[memory]`` events and NCCL kernels.
BIG = DATA / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"
#: The start of a child interpreter's code that makes the ``{refused}`` packages (and modules,
#: named in full) unimportable.
REFUSE = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name in {refused!r} or name.split(".")[0] in {refused!r}:
            raise ImportError("refused: " + name)
sys.meta_path.insert(0, Refuse())
"""


def test_the_reader_imports_neither_pandas_nor_h5py() -> None:
    """Reading traces with comm rows, enqueue ops and memory events, with pandas and h5py made
    unimportable: a read that needed either would fail here."""
    code = REFUSE.format(refused=("pandas", "h5py")) + textwrap.dedent(
        f"""
        from pathlib import Path
        from rankscope.orchestrator.ingest.decode import read_trace
        rows = enqueued = memory = lanes = 0
        for path in ({str(NCCL)!r}, {str(BIG)!r}):
            ft = read_trace(Path(path), sort=False)
            rows += len(ft.comm_records.records)
            enqueued += sum(r[-1] for r in ft.comm_records.records)
            memory += 0 if ft.memory is None else len(ft.memory["ts"])
            lanes += len(ft.lane_rows)
        print(rows, enqueued, memory, lanes)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows, enqueued, memory, lanes = map(int, out.stdout.split())
    assert rows > enqueued > 0 and memory > 0 and lanes > 0


def test_a_ranks_build_imports_neither_pandas_nor_h5py() -> None:
    """``rank_columns.parse_source`` (what the read-ahead process runs before this process'
    imports: ``source_reads.ReadAhead``) on ranks with comm kernels linked to their
    ``record_param_comms`` (DLRM), enqueue ops and memory events, pandas and h5py refused."""
    code = REFUSE.format(refused=("pandas", "h5py", "numpy.ma")) + textwrap.dedent(
        f"""
        from pathlib import Path
        from rankscope.orchestrator.ingest.discovery import RankSource, discover
        from rankscope.orchestrator.ingest.rank_columns import parse_source
        sources = discover([Path({str(DATA / "param_dlrm_8rank")!r})])[0]
        sources += [RankSource([(0, Path(p))], None) for p in ({str(NCCL)!r}, {str(BIG)!r})]
        comm = steps = memory = 0
        for source in sources:
            res = parse_source(source)
            comm += len(res.comm["event"])
            steps += len(res.steps["step"])
            memory += 0 if res.memory is None else len(res.memory["ts"])
        print(comm, steps, memory)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    comm, steps, memory = map(int, out.stdout.split())
    assert comm > 0 and steps > 0 and memory > 0


def _merge_importing(args: list[str], refuse: bool) -> tuple[str, str]:
    """``rankscope merge ARGS`` in a fresh interpreter (pandas made unimportable when
    ``refuse``, and ``numpy.ma``); returns (stdout: whether pandas was imported, stderr)."""
    code = REFUSE.format(refused=("pandas", "numpy.ma") if refuse else ()) + textwrap.dedent(
        f"""
        from rankscope.orchestrator.cli import main
        try:
            main({args!r})
        finally:
            print("pandas" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip(), out.stderr


def test_a_merge_of_other_tools_traces_imports_no_pandas(tmp_path: Path) -> None:
    """``rankscope merge`` of foreign traces writes its store without pandas: one rank (a trace
    file; a folder of one rank's, which the read-ahead parses) and DLRM's 8 ranks, whose clocks
    are fitted to their collectives (``clock_graph.py``). A ``rankscope run`` folder imports it
    while the traces are read: its clock samples are fitted with it."""
    from rankscope.analysis.store.reader import open_store

    one = tmp_path / "one"
    one.mkdir()
    (one / NCCL.name).symlink_to(NCCL)
    for source in (NCCL, one, DATA / "param_dlrm_8rank"):
        out = tmp_path / f"{source.name}.h5"
        imported, _ = _merge_importing(["merge", str(source), "-o", str(out), "-q"], True)
        assert imported == "False"
        with open_store(out) as store:
            assert len(store.collectives()) > 0
            methods = set(store.clock()["method"])
            assert methods == (
                {"reference", "collectives"} if len(store.ranks) > 1 else {"reference"}
            )
    run = tmp_path / "run.h5"
    imported, _ = _merge_importing(
        ["merge", str(DATA / "cpu_gloo_4rank_ddp_buckets"), "-o", str(run), "-q"], False
    )
    assert imported == "True"


def test_the_tables_are_the_rows() -> None:
    """``lanes``, ``comm`` and ``enqueue`` are the plain rows as tables: every row once, the
    records split by ``enqueue``, each event's row and lane as the columns say (sorted read)."""
    ft = read_trace(NCCL)
    assert ft.lanes.values.tolist() == [list(r) for r in ft.lane_rows]
    assert set(ft.lanes["kind"]) <= {int(k) for k in LaneKind}
    records = ft.comm_records
    on_cpu = np.array([r[-1] for r in records.records], dtype=bool)
    assert len(ft.comm) == int((~on_cpu).sum()) and len(ft.enqueue) == int(on_cpu.sum()) > 0
    for table, mask in ((ft.comm, ~on_cpu), (ft.enqueue, on_cpu)):
        assert list(table.columns) == ["event", "op", "group", "seq", "bytes", "peer", "lane"]
        assert table["event"].dtype == np.int64 and table["lane"].dtype == np.int32
        assert np.array_equal(table["event"].to_numpy(), records.event[mask])
        assert np.array_equal(table["lane"].to_numpy(), ft.columns["lane"][records.event[mask]])
        kept = [r[1:6] for r, m in zip(records.records, mask, strict=True) if m]
        assert table[["op", "group", "seq", "bytes", "peer"]].values.tolist() == [
            list(r) for r in kept
        ]
    assert ft.comm is ft.comm  # built once
