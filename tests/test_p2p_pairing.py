"""Send/recv pairs and collectives matched from what the profiler itself records for NCCL work.

The traces are written here, event by event, in the JSON shape PyTorch's profiler writes for
NCCL (torch ``torch/csrc/profiler/util.cpp`` ``saveNcclMeta``; docs/analysis.md): each call is a
``record_param_comms`` CPU op (``Collective name``, ``Process Group Name`` / ``Description`` /
``Ranks``, ``Rank``, ``Dst Rank`` on a send / ``Src Rank`` on a recv, ``Seq`` when recent), its
Work record_function (``nccl:send 0->1``), a ``cudaLaunchKernel`` inside it and an ac2g flow to
the kernel, whose args carry the copied metadata (never ``Seq``). A ``batch_isend_irecv`` is its
ops' ``record_param_comms`` without launches, then one ``nccl:coalesced`` Work that launches one
``SendRecv`` kernel with no metadata. Every rank runs on one clock: the two kernels of a pair
start at the same time, so a pair matched with the wrong partner shows as a start difference.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
from rankscope.analysis.conclude.findings import PIPELINE_KINDS, findings, point_to_point
from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze
from rankscope.analysis.store.reader import open_store
from rankscope.launchers.rundir import P2P_ANNOTATION_FORMAT
from rankscope.orchestrator.ingest.merge import merge_run_dir

#: ns of the trace's time base (µs stamps are relative to it).
BASE_NS = 1_700_000_000_000_000_000
#: The NCCL stream and the kernels' names as recent NCCL writes them.
STREAM = 20
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
#: µs between two transfers, and a kernel's duration (µs).
SLOT_US = 200
KERNEL_US = 40
NELEMS = 1024


@dataclasses.dataclass
class Call:
    """One NCCL call of one rank: what the profiler is given to write."""

    op: str
    """Collective name: send, recv, allreduce"""
    group: str
    ranks: list[int]
    peer: int = -1
    """global rank of the other side of a send / recv"""
    seq: int | None = None
    """``Seq`` on the record_param_comms (None: an older trace)"""
    trace_peer: bool = True
    """write ``Dst Rank`` / ``Src Rank``"""
    annotation: int | None = None
    """peer named by rankscope's runtime annotation around the call (None: no annotation)"""


class RankTrace:
    """The events of one rank's Kineto trace, built call by call (µs relative to BASE_NS)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.pid = 1000 + rank
        self.events: list[dict] = []
        self.ext = 1
        self.corr = 100_000

    def _x(self, cat: str, name: str, ts: float, dur: float, *, gpu: bool = False, **args) -> None:
        pid, tid = (0, STREAM) if gpu else (self.pid, self.pid)
        event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
        self.events.append({**event, "args": args})

    def step(self, number: int, start: float, end: float) -> None:
        self._x("user_annotation", f"ProfilerStep#{number}", start, end - start)

    def _meta(self, c: Call) -> dict:
        """The saveNcclMeta args Kineto copies onto the kernel (no Rank, no Seq)."""
        meta = {
            "Collective name": c.op, "In msg nelems": NELEMS, "Out msg nelems": NELEMS,
            "Group size": len(c.ranks), "dtype": "Float", "In split size": "[]",
            "Out split size": "[]", "Process Group Name": c.group,
            "Process Group Description": "default_pg" if c.group == "0" else f"pg{c.group}",
            "Process Group Ranks": str(c.ranks),
        }  # fmt: skip
        if c.trace_peer and c.op == "send":
            meta["Dst Rank"] = c.peer
        if c.trace_peer and c.op == "recv":
            meta["Src Rank"] = c.peer
        return meta

    def _rpc(self, c: Call, ts: float, dur: float) -> int:
        """The call's record_param_comms; returns its External id."""
        ext = self.ext
        self.ext += 1
        args = {"External id": ext, "Record function id": 0, **self._meta(c)}
        # Rank: the peer's group rank for send / recv, the caller's for collectives
        args["Rank"] = c.ranks.index(c.peer if c.op in ("send", "recv") else self.rank)
        if c.seq is not None:
            args["Seq"] = c.seq
        self._x("cpu_op", "record_param_comms", ts, dur, **args)
        return ext

    def _launch(self, name: str, ext: int, ts: float, gpu_ts: float, kernel_args: dict) -> None:
        """cudaLaunchKernel at ts, the ac2g flow, and the kernel at gpu_ts."""
        corr = self.corr
        self.corr += 1
        self._x(
            "cuda_runtime", "cudaLaunchKernel", ts, 4, **{"External id": ext, "correlation": corr}
        )
        flow = {"id": corr, "cat": "ac2g", "name": "ac2g"}
        self.events.append({"ph": "s", "pid": self.pid, "tid": self.pid, "ts": ts, **flow})
        args = {
            "External id": ext, "queued": 0, "device": 0, "context": 1, "stream": STREAM,
            "correlation": corr, "registers per thread": 96, "shared memory": 0,
            "blocks per SM": 0.1, "warps per SM": 1, "grid": [2, 1, 1], "block": [640, 1, 1],
            "est. achieved occupancy %": 0, **kernel_args,
        }  # fmt: skip
        self._x("kernel", name, gpu_ts, KERNEL_US, gpu=True, **args)
        self.events.append({"ph": "f", "pid": 0, "tid": STREAM, "ts": gpu_ts, "bp": "e", **flow})

    def call(self, c: Call, gpu_ts: float, *, kernel: bool = True) -> None:
        """One NCCL call whose kernel runs at ``gpu_ts`` (its CPU side 60 µs before)."""
        t = gpu_ts - 60
        if c.annotation is not None:
            label = P2P_ANNOTATION_FORMAT.format(op=c.op, peer=c.annotation)
            self._x("user_annotation", label, t - 2, 30)
        ext = self._rpc(c, t, 25)
        me = c.ranks.index(self.rank)
        if c.op == "send":
            work = f"nccl:send {me}->{c.ranks.index(c.peer)}"
        elif c.op == "recv":
            work = f"nccl:recv {me}<-{c.ranks.index(c.peer)}"
        else:
            work = "nccl:all_reduce"
        self._x("user_annotation", work, t + 2, 20, **{"External id": ext + 10_000})
        if kernel:
            name = SENDRECV if c.op in ("send", "recv") else ALLREDUCE
            self._launch(name, ext, t + 5, gpu_ts, self._meta(c))

    def batch(self, calls: list[Call], gpu_ts: float, *, kernel: bool = True) -> None:
        """A batch_isend_irecv: the ops' record_param_comms, then nccl:coalesced and its kernel."""
        t = gpu_ts - 80
        for i, c in enumerate(calls):
            self._rpc(c, t + 6 * i, 4)
        start = t + 6 * len(calls) + 2
        ext = self.ext
        self.ext += 1
        self._x("user_annotation", "nccl:coalesced", start, 20, **{"External id": ext})
        if kernel:  # coalesced kernels can lack the PG metadata (pytorch#131462)
            self._launch(SENDRECV, ext, start + 5, gpu_ts, {})

    def write(self, folder: Path) -> None:
        doc = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world},
            "deviceProperties": [],
            "baseTimeNanoseconds": BASE_NS,
            "traceEvents": self.events,
            "traceName": f"rank-{self.rank}.json",
        }
        (folder / f"rank-{self.rank}.json").write_text(json.dumps(doc, indent=1))


def _merge(traces: list[RankTrace], tmp_path: Path) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir()
    for t in traces:
        t.write(folder)
    return merge_run_dir(folder, output=tmp_path / "t.h5", scheduler="synchronous", quiet=True)


def _tables(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    with open_store(out) as store:
        return store.collectives(), store.problems()


def _pairs(colls: pd.DataFrame) -> list[tuple[int, int]]:
    """(sending rank, receiving rank) of each two-sided p2p collective, in time order; every
    pair's two kernels started together (the builders put them in one slot)."""
    p2p = colls[colls["op"].isin(["send", "recv"])]
    two = p2p.groupby("coll").filter(lambda g: len(g) == 2)
    spread = two.groupby("coll")["start"].agg(lambda s: s.max() - s.min())
    assert (spread < 1_000).all(), f"paired with the wrong partner: {spread.max()} ns apart"
    if two.empty:
        return []
    wide = two.pivot(index="coll", columns="op", values="rank").sort_index()
    return list(zip(wide["send"].astype(int), wide["recv"].astype(int), strict=True))


def _alone(colls: pd.DataFrame) -> pd.DataFrame:
    """The send/recv rows of one-rank collectives (not paired)."""
    p2p = colls[colls["op"].isin(["send", "recv"])]
    return p2p[p2p.groupby("coll")["coll"].transform("size") == 1]


# -- a 4-stage pipeline of NCCL sends / recvs ---------------------------------------------------

WORLD = 4
STEPS = 2
MICRO = 2


def _pipeline(
    *, seq: bool, trace_peer: bool = True, annotate: bool = False, extras: bool = False
) -> tuple[list[RankTrace], list[tuple[int, int]]]:
    """GPipe over 4 stages, 2 steps of 2 micro-batches, then a world all-reduce per step.

    Returns the traces and the expected (sender, receiver) of each transfer in time order.
    ``extras``: rank 0 also sends once to rank 2, which never receives it, and rank 3 sends once
    with no peer recorded anywhere (no Dst Rank, no annotation).
    """
    traces = [RankTrace(r, WORLD) for r in range(WORLD)]
    world = list(range(WORLD))
    expected: list[tuple[int, int]] = []
    seqs = [0] * WORLD
    slot = 0

    def next_seq(rank: int, p2p: bool = True) -> int | None:
        """Seq as PyTorch passes it: the group's collective count, + 1 for a send / recv
        (which does not count), so every p2p op between two collectives has the same Seq."""
        if not p2p:
            seqs[rank] += 1
        return seqs[rank] + p2p if seq else None

    def transfer(src: int, dst: int) -> None:
        nonlocal slot
        t = 1_000 + SLOT_US * slot
        slot += 1
        for me, op, peer in ((src, "send", dst), (dst, "recv", src)):
            c = Call(op, "0", world, peer, next_seq(me), trace_peer,
                     peer if annotate else None)  # fmt: skip
            traces[me].call(c, t)
        expected.append((src, dst))

    for step in range(STEPS):
        start = 1_000 + SLOT_US * slot - 150
        for _ in range(MICRO):
            for s in range(WORLD - 1):
                transfer(s, s + 1)
        for _ in range(MICRO):
            for s in range(WORLD - 1, 0, -1):
                transfer(s, s - 1)
        if extras and step == 0:
            t = 1_000 + SLOT_US * slot
            slot += 1
            traces[0].call(Call("send", "0", world, 2, next_seq(0)), t)
            t = 1_000 + SLOT_US * slot
            slot += 1
            traces[3].call(Call("send", "0", world, 1, next_seq(3), trace_peer=False), t)
        t = 1_000 + SLOT_US * slot
        slot += 1
        for r in range(WORLD):
            traces[r].call(Call("allreduce", "0", world, seq=next_seq(r, p2p=False)), t)
        end = t + KERNEL_US + 100
        for tr in traces:
            tr.step(step + 1, start, end)
    return traces, expected


@pytest.mark.parametrize("seq", [True, False], ids=["seq", "no-seq"])
def test_pipeline_pairs_from_dst_and_src_rank(tmp_path: Path, seq: bool) -> None:
    """No annotation: every send is paired with its recv by the trace's own Dst/Src Rank."""
    traces, expected = _pipeline(seq=seq)
    colls, problems = _tables(_merge(traces, tmp_path))
    assert _pairs(colls) == expected
    assert _alone(colls).empty
    assert problems.empty, problems
    ar = colls[colls["op"] == "allreduce"]
    assert ar["coll"].nunique() == STEPS and (ar.groupby("coll").size() == WORLD).all()
    assert set(colls["group"]) == {"0"}, "the group is the trace's Process Group Name"


def test_without_dst_and_src_rank_nothing_is_guessed(tmp_path: Path) -> None:
    """An older trace (no Dst/Src Rank) and no annotation: each send/recv stays alone."""
    traces, expected = _pipeline(seq=False, trace_peer=False)
    colls, _ = _tables(_merge(traces, tmp_path))
    assert _pairs(colls) == []
    assert len(_alone(colls)) == 2 * len(expected)


def test_runtime_annotation_pairs_older_traces(tmp_path: Path) -> None:
    """No Dst/Src Rank, but rankscope's runtime annotation around each call: paired by it."""
    traces, expected = _pipeline(seq=False, trace_peer=False, annotate=True)
    colls, problems = _tables(_merge(traces, tmp_path))
    assert _pairs(colls) == expected
    assert problems.empty, problems


def test_trace_args_win_over_a_disagreeing_annotation(tmp_path: Path) -> None:
    """Annotation and Dst/Src Rank both present: the trace's peer is used, disagreements said."""
    traces, expected = _pipeline(seq=True, annotate=True)
    # rank 0's first send: the annotation names rank 3, Dst Rank says 1
    first = next(e for e in traces[0].events if e["name"].startswith("rankscope::p2p send"))
    first["name"] = P2P_ANNOTATION_FORMAT.format(op="send", peer=3)
    colls, problems = _tables(_merge(traces, tmp_path))
    assert _pairs(colls) == expected
    (line,) = problems["problem"]
    assert line.startswith("1 send/recv op(s): the runtime's peer annotation disagrees")
    assert problems["rank"].tolist() == [0]


def test_unpaired_ops_are_counted_and_said(tmp_path: Path) -> None:
    """A send whose recv is in no trace, and one whose peer nobody recorded: alone, and said."""
    traces, expected = _pipeline(seq=True, extras=True)
    out = _merge(traces, tmp_path)
    colls, _ = _tables(out)
    assert _pairs(colls) == expected
    alone = _alone(colls).sort_values("start")
    assert list(zip(alone["rank"], alone["op"], strict=True)) == [(0, "send"), (3, "send")]
    a = analyze(out, ClusterSpec(scheduler=SYNCHRONOUS))
    assert point_to_point(a) == (len(expected), 2)
    (text,) = [f.evidence for f in findings(a) if f.kind in PIPELINE_KINDS]
    assert text.endswith(
        "1 send/recv op(s) without a known peer (no Dst/Src Rank in the trace, no `rankscope run` "
        "peer annotation) and 1 whose peer's side is in no trace (not traced, or outside the "
        "profiled window): not paired."
    ), text


# -- collectives of a sub-group: Seq from the record_param_comms, else call order ---------------


def _subgroup(*, seq: bool, drop_first_on: int | None) -> list[RankTrace]:
    """Two ranks, three all-reduces on group "5" (ranks [0, 1]) in one step, then one on the
    world group. ``drop_first_on``: that rank's trace lacks the first of the three."""
    traces = [RankTrace(r, 2) for r in range(2)]
    for r, tr in enumerate(traces):
        for i in range(3):
            if r == drop_first_on and i == 0:
                continue
            tr.call(Call("allreduce", "5", [0, 1], seq=i + 1 if seq else None), 1_000 + SLOT_US * i)
        tr.call(Call("allreduce", "0", [0, 1], seq=4 if seq else None), 1_000 + SLOT_US * 3)
        tr.step(1, 800, 1_000 + SLOT_US * 4)
    return traces


def test_kernels_take_seq_from_their_record_param_comms(tmp_path: Path) -> None:
    """Seq is not on the kernel: the linked record_param_comms gives it, so rank 1 missing the
    first all-reduce does not shift the others (call order would pair them one off)."""
    colls, _ = _tables(_merge(_subgroup(seq=True, drop_first_on=1), tmp_path))
    sub = colls[colls["group"] == "5"]
    by_seq = sub.groupby("seq")["rank"].apply(sorted).to_dict()
    assert by_seq == {1: [0], 2: [0, 1], 3: [0, 1]}
    spread = sub.groupby("coll")["start"].agg(lambda s: s.max() - s.min())
    assert (spread < 1_000).all()


def test_without_seq_a_group_matches_in_call_order(tmp_path: Path) -> None:
    colls, _ = _tables(_merge(_subgroup(seq=False, drop_first_on=None), tmp_path))
    sub = colls[colls["group"] == "5"]
    assert sub["coll"].nunique() == 3 and (sub.groupby("coll")["rank"].nunique() == 2).all()
    assert sorted(sub["seq"].unique()) == [0, 1, 2], "call order within the group"
    spread = sub.groupby("coll")["start"].agg(lambda s: s.max() - s.min())
    assert (spread < 1_000).all()


# -- batch_isend_irecv: one coalesced kernel per rank and batch ----------------------------------


def _coalesced(*, missing_kernel: bool = False) -> tuple[list[RankTrace], set[tuple[int, int]]]:
    """Three ranks. Step 1: rank 0 batches [send 1, recv 1], rank 1 [recv 0, send 0, send 2],
    rank 2 [recv 1], all at one slot; then a plain send 2 -> 0. Step 2: rank 0 batches [send 2]
    and rank 2 [recv 0] (``missing_kernel``: rank 2's kernel is not in its trace)."""
    world = [0, 1, 2]
    traces = [RankTrace(r, 3) for r in world]

    def c(op: str, peer: int) -> Call:
        return Call(op, "0", world, peer)

    t = 1_000
    traces[0].batch([c("send", 1), c("recv", 1)], t)
    traces[1].batch([c("recv", 0), c("send", 0), c("send", 2)], t)
    traces[2].batch([c("recv", 1)], t)
    t += SLOT_US
    traces[2].call(c("send", 0), t)
    traces[0].call(c("recv", 2), t)
    t += SLOT_US
    for tr in traces:
        tr.call(Call("allreduce", "0", world), t)
        tr.step(1, 800, t + KERNEL_US + 50)
    t += 2 * SLOT_US
    traces[0].batch([c("send", 2)], t)
    traces[2].batch([c("recv", 0)], t, kernel=not missing_kernel)
    t += SLOT_US
    for tr in traces:
        tr.call(Call("allreduce", "0", world), t)
        tr.step(2, t - 2 * SLOT_US - 100, t + KERNEL_US + 50)
    expected = {(0, 1), (1, 0), (1, 2), (2, 0), (0, 2)}
    return traces, expected


def test_coalesced_batches_pair_each_op_with_its_counterpart(tmp_path: Path) -> None:
    traces, expected = _coalesced()
    colls, problems = _tables(_merge(traces, tmp_path))
    pairs = _pairs(colls)
    assert sorted(pairs) == sorted(expected) and len(pairs) == len(expected)
    assert _alone(colls).empty and problems.empty, problems
    # no op of a batch was matched as a collective of the kernel's ranks
    assert set(colls["op"]) == {"send", "recv", "allreduce"}
    # the batch's ops share its kernel: rank 1's three rows are one event
    first = colls[(colls["rank"] == 1) & colls["op"].isin(["send", "recv"])]
    assert first["event"].nunique() == 1 and len(first) == 3


def test_a_batch_without_its_kernel_is_counted_not_guessed(tmp_path: Path) -> None:
    traces, expected = _coalesced(missing_kernel=True)
    colls, problems = _tables(_merge(traces, tmp_path))
    assert sorted(_pairs(colls)) == sorted(expected - {(0, 2)})
    alone = _alone(colls)
    assert list(zip(alone["rank"], alone["op"], strict=True)) == [(0, "send")]
    (line,) = problems.loc[problems["rank"] == 2, "problem"]
    assert line.startswith("1 send/recv op(s) whose NCCL kernel is not in the trace")
