"""Point-to-point ops: each send paired with its recv, never lumped together as a collective.

Real data: ``tests/data/cpu_gloo_4rank_pipeline`` is a ``rankscope run`` of
``examples/train_pipeline.py`` (4 ranks = 4 stages, gloo, 8 steps, 2 micro-batches, profiled
steps 2-4; rank 1 does 10 ms of extra forward work per micro-batch), whose traces carry the
runtime's peer annotations.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rankscope.analysis.compute.bottleneck import p2p_roots
from rankscope.analysis.compute.collectives import collective_waits
from rankscope.analysis.compute.stragglers import Cause, find_stragglers
from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze
from rankscope.analysis.store.reader import open_store
from rankscope.analysis.store.schema import EventKind
from rankscope.launchers.rundir import P2P_ANNOTATION_PATTERN
from rankscope.orchestrator.cli import main as cli
from rankscope.orchestrator.ingest.matching import match
from rankscope.orchestrator.ingest.merge import merge_run_dir
from rankscope.orchestrator.ingest.rank_columns import _p2p_peers

DATA = Path(__file__).parent / "data" / "cpu_gloo_4rank_pipeline"
#: The same job with no slow stage.
BALANCED = Path(__file__).parent / "data" / "cpu_gloo_4rank_pipeline_balanced"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_pipeline.py"
WORLD = 4
PROFILED_STEPS = 3
MICRO_BATCHES = 2
SLOW_STAGE = 1
SLOW_MS = 10


def _merge(folder: Path, tmp_path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    out = merge_run_dir(folder, output=tmp_path / "trace.h5", scheduler="synchronous", quiet=True)
    with open_store(out) as store:
        return store.collectives(), store.clock()


def test_pipeline_sends_are_paired_with_their_recvs(tmp_path: Path) -> None:
    colls, _ = _merge(DATA, tmp_path)
    p2p = colls[colls["op"].isin(["send", "recv"])]
    per = p2p.groupby("coll")
    # every point-to-point collective is exactly one send and one recv, on neighbouring stages
    assert (per.size() == 2).all()
    assert (per["op"].agg(lambda s: tuple(sorted(s))) == ("recv", "send")).all()
    pairs = p2p.pivot(index="coll", columns="op", values="rank")
    assert ((pairs["send"] - pairs["recv"]).abs() == 1).all()
    # forward (s -> s+1) and backward (s -> s-1): one per micro-batch, step and neighbour pair
    expected = PROFILED_STEPS * MICRO_BATCHES
    counts = pairs.value_counts().to_dict()
    for s in range(WORLD - 1):
        assert counts[(s + 1, s)] == expected, counts  # (recv, send): forward
        assert counts[(s, s + 1)] == expected, counts  # backward
    # the all-reduces of all ranks are untouched by the differing numbers of P2P ops per rank
    ar = colls[colls["op"] == "allreduce"]
    assert (ar.groupby("coll").size() == WORLD).all()
    assert ar["coll"].nunique() == PROFILED_STEPS * 2  # weight and bias of the one stage


def test_recv_waits_for_its_sender_and_no_clock_check_on_pairs(tmp_path: Path) -> None:
    colls, clock = _merge(DATA, tmp_path)
    w = collective_waits(colls, clock)
    p2p = w[w["op"].isin(["send", "recv"])]
    assert not p2p["clock_disagree"].any(), "a send may end before its recv: no check"
    both = p2p.pivot(index="coll", columns="op", values=["arrival", "wait_ns", "dur_ns"])
    expected = np.minimum(
        (both["arrival"]["send"] - both["arrival"]["recv"]).clip(lower=0), both["dur_ns"]["recv"]
    )
    assert (both["wait_ns"]["recv"] == expected).all()
    # the stage after the slow one waits for it in its forward recv, most of the slow time
    fwd = p2p[(p2p["op"] == "recv") & (p2p["rank"] == SLOW_STAGE + 1)]
    fwd = fwd[fwd["coll"].isin(colls[(colls["op"] == "send") & (colls["rank"] == SLOW_STAGE)].coll)]
    assert len(fwd) == PROFILED_STEPS * MICRO_BATCHES
    assert fwd["wait_ns"].median() > 0.5 * SLOW_MS * 1e6


def test_pairs_are_no_straggler_evidence(tmp_path: Path) -> None:
    """In a pipeline the earlier stage is 'last' at every recv of the next: not a straggler."""
    colls, clock = _merge(DATA, tmp_path)
    p2p_only = colls[colls["op"].isin(["send", "recv"])]
    w = collective_waits(p2p_only, clock)
    assert w.groupby("coll")["is_last"].sum().eq(1).all()
    assert find_stragglers(w, pd.DataFrame()).empty


def test_without_peer_annotations_sends_stay_unmatched(tmp_path: Path) -> None:
    """Plain torch.profiler traces name no peer: each send / recv is a collective of one rank."""
    bare = tmp_path / "bare"
    shutil.copytree(DATA, bare)
    for path in bare.rglob("window-*.json.gz"):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        doc["traceEvents"] = [
            e for e in doc["traceEvents"] if not P2P_ANNOTATION_PATTERN.fullmatch(e.get("name", ""))
        ]
        path.write_bytes(gzip.compress(json.dumps(doc, indent=2).encode()))
    colls, _ = _merge(bare, tmp_path)
    p2p = colls[colls["op"].isin(["send", "recv"])]
    assert len(p2p) == 2 * 2 * (WORLD - 1) * PROFILED_STEPS * MICRO_BATCHES
    assert (p2p.groupby("coll").size() == 1).all()
    ar = colls[colls["op"] == "allreduce"]
    assert (ar.groupby("coll").size() == WORLD).all() and ar["coll"].nunique() == 6
    # the summary says why there is no pipeline analysis, rather than "no bottleneck"
    from rankscope.analysis.render.report import pipeline_lines, summary

    a = analyze(tmp_path / "trace.h5", ClusterSpec(scheduler=SYNCHRONOUS))
    doc = summary(a)
    assert doc["pipeline"]["pairs"] == 0 and doc["pipeline"]["unmatched"] == len(p2p)
    assert a.bottleneck_ranks() == []
    (line,) = pipeline_lines(a, doc)
    assert "without a known peer" in line and "not paired" in line


def _comm(rows: list[tuple[str, int, int, int, int]]) -> pd.DataFrame:
    """One rank's comm table from (op, seq, peer, step, start)."""
    df = pd.DataFrame(rows, columns=["op", "seq", "peer", "step", "start"])
    df["event"] = np.arange(len(df))
    df["group"] = "pg0"
    df["bytes"] = -1
    df["end"] = df["start"] + 10
    df["gpu"] = True
    return df


def test_p2p_keys_never_collide_with_sequence_numbers() -> None:
    """NCCL-style traces with Seq: a send with seq 0 is not the all-reduce with seq 0."""
    per_rank = {
        0: _comm([("send", 0, 1, 1, 100), ("allreduce", 0, -1, 1, 200)]),
        1: _comm([("recv", 0, 0, 1, 90), ("allreduce", 0, -1, 1, 210)]),
    }
    m = pd.DataFrame(match(per_rank))
    by_coll = m.groupby("coll")["op"].agg(lambda s: tuple(sorted(s)))
    assert sorted(by_coll) == [("allreduce", "allreduce"), ("recv", "send")]


def test_peer_from_the_annotation_around_the_launch_of_a_gpu_kernel() -> None:
    """A NCCL SendRecv kernel runs later than its launch: the launch's annotation names the peer."""
    strings = ["rankscope::p2p send peer=3", "cudaLaunchKernel", "ncclDevKernel_SendRecv"]
    k = EventKind
    # annotation [100, 200], launch at 150 (corr 7) -> kernel at 1000; a second kernel whose
    # launch (corr 8, at 300) lies outside any annotation; a gloo-like CPU op inside [400, 500]
    cols = {
        "ts": np.array([100, 150, 300, 400, 420, 1000, 1100], np.int64),
        "dur": np.array([100, 5, 5, 100, 50, 30, 30], np.int64),
        "name": np.array([0, 1, 1, 0, 2, 2, 2], np.int32),
        "kind": np.array(
            [
                k.USER_ANNOTATION,
                k.RUNTIME,
                k.RUNTIME,
                k.USER_ANNOTATION,
                k.COMM_CPU,
                k.KERNEL_COMM,
                k.KERNEL_COMM,
            ],
            np.int8,
        ),
        "corr": np.array([-1, 7, 8, -1, -1, 7, 8], np.int64),
    }
    ev = np.array([4, 5, 6])
    ops, peers = _p2p_peers(np.array(["send", "sendrecv", "sendrecv"], object), ev, cols, strings)
    assert ops.tolist() == ["send", "send", "sendrecv"]
    assert peers.tolist() == [3, 3, -1]


def test_runtime_wrapper_names_peers_and_keeps_p2pop_working(tmp_path: Path) -> None:
    """In a real (one-rank) gloo group: peers resolved, P2POp accepts the unwrapped isend."""
    script = f"""
import torch, torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
original = dist.isend
dist.init_process_group("gloo", init_method="file://{tmp_path / "store"}", rank=0, world_size=1)
from rankscope.launchers import p2p
assert p2p.install() and p2p.install()
assert dist.isend is c10d.isend and dist.isend is not original and dist.isend._rankscope_wrapped
t = torch.zeros(1)
assert p2p.peer_of("send", (t, 5), {{}}) == 5
assert p2p.peer_of("recv", (t,), {{"src": 2}}) == 2
assert p2p.peer_of("recv", (t,), {{}}) is None
assert p2p.peer_of("send", (t,), {{"group": dist.group.WORLD, "group_dst": 0}}) == 0
dist.P2POp(original, t, 0)
dist.P2POp(dist.isend, t, 0)
dist.destroy_process_group()
print("ok")
"""
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fresh_pipeline_run_pairs_every_send(tmp_path: Path) -> None:
    """``rankscope run`` of the pipeline example: the live runtime annotates, the merge pairs."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankscope.orchestrator",
            "run",
            "--nproc-per-node",
            "2",
            "--out",
            str(tmp_path),
            "--name",
            "pp",
            "--repeat",
            "1",
            "--no-analyze",
            str(EXAMPLE),
            "--steps",
            "6",
        ],
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir() and "-pp-" in p.name]
    with open_store(run / "trace.h5") as store:
        colls = store.collectives()
    p2p = colls[colls["op"].isin(["send", "recv"])]
    assert len(p2p) > 0 and (p2p.groupby("coll").size() == 2).all()
    assert (p2p.groupby("coll")["rank"].nunique() == 2).all()


# -- the pipeline bottleneck: receivers' waits traced back to a stage's own extra work ----------


def _analysis(folder: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    out = merge_run_dir(folder, output=tmp_path / "trace.h5", scheduler="synchronous", quiet=True)
    return analyze(out, ClusterSpec(scheduler=SYNCHRONOUS))


def test_slow_stage_is_the_pipeline_bottleneck_with_its_cause(tmp_path: Path) -> None:
    a = _analysis(DATA, tmp_path)
    assert a.bottleneck_ranks() == [SLOW_STAGE]
    top = a.pipeline.iloc[0]
    assert top["cause"] == Cause.OWN_COMPUTE and top["wait_share"] > 0.8
    # its extra compute: ~SLOW_MS per forward micro-batch it sent
    sent = PROFILED_STEPS * MICRO_BATCHES
    assert 0.5 * sent * SLOW_MS / 1e3 < top["compute_extra_s"] < 1.5 * sent * SLOW_MS / 1e3
    roots = p2p_roots(a.waits, a.windows)
    # the last stage waits for stage 2, which was late only because it waited for stage 1:
    # those waits are followed upstream to stage 1
    last = roots[(roots["receiver"] == WORLD - 1) & (roots["sender"] == WORLD - 2)]
    assert (last["root"] == SLOW_STAGE).mean() >= 0.5 and (last["via"] >= 1).any()
    # collectives alone name no straggler here (the all-reduce is not where ranks wait)
    assert a.straggler_ranks() == []
    # the views mark it like a straggler: shaded row, highlighted table row, the finding
    from rankscope.analysis.views.app import pipeline_markdown, summary_html

    assert a.flagged_ranks() == [SLOW_STAGE]
    assert f'<tr class="straggler"><td>{SLOW_STAGE}</td>' in summary_html(a)
    assert f"Pipeline bottleneck: rank {SLOW_STAGE}" in pipeline_markdown(a)


def test_balanced_pipeline_has_no_bottleneck(tmp_path: Path) -> None:
    """The bubble of a balanced pipeline is the schedule: it traces back to no stage."""
    a = _analysis(BALANCED, tmp_path)
    assert len(a.pipeline) == WORLD and a.bottleneck_ranks() == []
    assert a.pipeline["wait_share"].max() < 0.5
    assert a.flagged_ranks() == []


def test_chain_of_waits_is_followed_upstream() -> None:
    """Hand-built: 0 sends 10 ms late to 1; 1 forwards at once to 2; 2 waited for 0 (via 1)."""
    ms = 1_000_000
    # coll 0: send 0 -> recv 1 (1 arrives at 0, 0 at 10 ms after 10 ms of work); coll 1: send
    # 1 -> recv 2 (2 arrives at 0, 1 sends at 10.5 ms after 0.5 ms of work); coll 2: send 2 -> 3
    # after 0.5 ms, nobody waits. The typical stage works 0.5 ms before sending.
    waits = pd.DataFrame(
        {
            "coll": [0, 0, 1, 1, 2, 2],
            "op": ["send", "recv", "send", "recv", "send", "recv"],
            "rank": [0, 1, 1, 2, 2, 3],
            "n_ranks": [2] * 6,
            "arrival": [10 * ms, 0, 10 * ms + ms // 2, 0, 11 * ms, 11 * ms],
            "end": [
                10 * ms + 10,
                10 * ms + 20,
                10 * ms + ms // 2 + 10,
                10 * ms + ms // 2 + 20,
                11 * ms + 10,
                11 * ms + 20,
            ],
            "wait_ns": [0, 10 * ms, 0, 10 * ms + ms // 2, 0, 0],
        }
    )
    windows = pd.DataFrame(
        {
            "coll": [0, 1, 2],
            "rank": [0, 1, 2],
            "compute_ns": [10 * ms, ms // 2, ms // 2],
            "input_ns": [0, 0, 0],
            "idle_ns": [0, 0, 0],
        }
    )
    r = p2p_roots(waits, windows).set_index("coll")
    assert r.loc[0, "root"] == 0 and r.loc[0, "via"] == 0
    assert r.loc[1, "root"] == 0 and r.loc[1, "via"] == 1
    assert r.loc[1, "caused_ns"] == r.loc[0, "caused_ns"] > 9 * ms


def test_cli_names_the_bottleneck_in_text_json_and_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "pp"
    shutil.copytree(DATA, work)
    summary, report = tmp_path / "s.json", tmp_path / "r.html"
    args = ["analyze", str(work), "--json", str(summary), "--html", str(report)]
    assert cli([*args, "--scheduler", "synchronous"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"Pipeline bottleneck: rank {SLOW_STAGE}" in out and "→ own compute" in out
    doc = json.loads(summary.read_text())
    assert doc["pipeline"]["pairs"] == 2 * (WORLD - 1) * PROFILED_STEPS * MICRO_BATCHES
    assert [b["rank"] for b in doc["pipeline"]["bottlenecks"]] == [SLOW_STAGE]
    assert f"Pipeline bottleneck: rank {SLOW_STAGE}" in report.read_text()
    balanced = tmp_path / "bal"
    shutil.copytree(BALANCED, balanced)
    assert cli(["analyze", str(balanced), "--scheduler", "synchronous"]) == 0
    assert "No pipeline bottleneck" in " ".join(capsys.readouterr().out.split())


def test_the_table_does_not_depend_on_the_order_ranks_come_in(tmp_path: Path) -> None:
    """A merge on worker processes hands ``match`` the ranks as they finish: every order of the
    real pipeline's ranks gives the table of ascending order (a pair's op, and so its ``seq``,
    followed the order of arrival: ranks 0, 1, 3, 2 numbered 58 of the 96 rows otherwise)."""
    import itertools

    from rankscope.orchestrator.ingest.comm_kernels import DEFAULT_VOCABULARY
    from rankscope.orchestrator.ingest.discovery import discover
    from rankscope.orchestrator.ingest.rank_columns import parse_source

    sources, _, _ = discover([DATA])
    comm = {}
    for source in sources:
        res = parse_source(source, DEFAULT_VOCABULARY)
        assert res.comm is not None and res.rank is not None
        comm[res.rank] = res.comm
    assert sorted(comm) == list(range(WORLD))
    want = pd.DataFrame(match(comm))
    assert (want["op"].isin(["send", "recv"])).sum() > 0
    for order in itertools.permutations(range(WORLD)):
        got = pd.DataFrame(match({r: comm[r] for r in order}))
        pd.testing.assert_frame_equal(got, want, obj=str(order))
