"""Point-to-point hangs without a job: the diagnosis of real gloo answers (tests/data/hang_p2p,
made by real ``rankscope run`` jobs: see its README) and of Flight-Recorder-shaped answers built
here as NCCL writes them, against known truth: a receive whose sender is stuck elsewhere, peers
that do not match, a size mismatch, a cycle, a point-to-point hang while the other groups are
fine, and no culprit when every send has its receive."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rankscope.analysis.compute.hang import RankState, _group_views, diagnose
from rankscope.analysis.compute.hang_p2p import (
    P2PKind,
    P2PSource,
    P2PVerdict,
    entry_done,
    pending_p2p,
)
from rankscope.analysis.conclude.hang_findings import hang_json, headline, paragraph
from rankscope.launchers.hang_probe import p2p_call

DATA = Path(__file__).parent / "data" / "hang_p2p"
SCRIPT = DATA / "p2p_hang.py"


def _line(text: str) -> int:
    """The line of the job's script that holds ``text``."""
    lines = SCRIPT.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


def _real(job: str) -> dict[int, dict[str, Any]]:
    return {r: json.loads((DATA / job / f"rank{r}-hang.json").read_text()) for r in range(3)}


def test_a_real_receive_whose_sender_loops_names_the_sender_and_its_line() -> None:
    """chain/: rank 0 (stage 0) spins before its send; rank 1 waits in recv from rank 0, rank 2
    in recv from rank 1 (gloo: read from the calls, its Flight Recorder has no p2p entry)."""
    diag = diagnose(_real("chain"), 3)
    assert diag.culprits == [0]
    states = {p.rank: p.state for p in diag.places}
    assert states == {0: RankState.UNMATCHED, 1: RankState.WAITING, 2: RankState.WAITING}
    rank0, rank1, rank2 = diag.places
    assert rank0.user_frame is not None
    assert rank0.user_frame.line in (_line("stage 0 stuck"), _line("stage 0 stuck") + 1)
    assert rank1.p2p is not None and (rank1.p2p.kind, rank1.p2p.peer) == (P2PKind.RECV, 0)
    assert rank1.p2p.sizes == ((4,),) and rank1.p2p.source is P2PSource.STACK
    assert rank1.user_frame is not None and rank1.user_frame.line == _line("stage 1 receives")
    assert rank2.p2p is not None and rank2.p2p.peer == 1
    # rank 2 waits behind rank 1, whose wait ends at rank 0
    (w2,) = [w for w in diag.p2p if w.rank == 2]
    assert (w2.verdict, w2.root) == (P2PVerdict.BEHIND, 0)
    said = headline(diag)
    assert said.startswith("The job hung in a point-to-point op: rank 1 waits in recv from rank 0")
    assert f"p2p_hang.py:{_line('stage 1 receives')} (main)" in said
    assert f"rank 0 never sent it: it is in p2p_hang.py:{rank0.user_frame.line} (main)" in said
    text = paragraph(diag)
    assert "rank 0: never sent to rank 1, which waits in recv from it" in text
    assert "rank 2: waiting in recv from rank 1" in text
    doc = hang_json(diag, {})
    assert doc["culprits"] == [0] and doc["ranks"][1]["p2p"]["peer"] == 0


def test_gloo_records_no_p2p_entry_and_its_group_sequence_counts_them() -> None:
    """fr-p2p-ops-rank1.json: after send/recv, isend/irecv, batch_isend_irecv, an all-reduce and
    a barrier, gloo's recorder holds the two collectives only, and pg_status's sequence counts
    the point-to-point ops: the collective rule takes the entries' numbers."""
    fr = json.loads((DATA / "fr-p2p-ops-rank1.json").read_text())
    assert not any(e["is_p2p"] for e in fr["entries"])
    assert [e["collective_seq_id"] for e in fr["entries"]] == [1, 2]
    assert int(fr["pg_status"]["0"]["last_enqueued_collective"]) == 6
    # pg_status in the group's sequence: 6 enqueued (recv 1, all_reduce 2, isend 3, the batch 4
    # and 5, barrier 6), 2 completed: the barrier, dumped as it returned, was not yet recorded
    # completed (its entry not yet retired either)
    assert int(fr["pg_status"]["0"]["last_completed_collective"]) == 2
    views = _group_views({"flight_recorder": fr})
    assert views is not None and (views["0"].enqueued, views["0"].completed) == (2, 1)
    assert pending_p2p({"flight_recorder": fr}) is None


def test_a_real_collective_hang_after_p2p_ops_names_no_false_culprit() -> None:
    """collective/: ranks 1 and 2 exchange before each all-reduce, rank 0 does not (gloo's group
    sequence of rank 2 runs ahead of rank 0's); rank 1 spins before all_reduce #7."""
    diag = diagnose(_real("collective"), 3)
    assert diag.collective is not None
    assert (diag.collective.op, diag.collective.seq) == ("all_reduce", 7)
    assert diag.culprits == [1]
    assert diag.ranks(RankState.WAITING) == [0, 2]
    rank1 = diag.places[1]
    assert rank1.user_frame is not None
    assert rank1.user_frame.line in (_line("rank 1 stuck"), _line("rank 1 stuck") + 1)


# --- Flight-Recorder-shaped answers, as NCCL writes them -----------------------------------
# Fields as torch writes them (torch/csrc/distributed/c10d/FlightRecorder*.{hpp,cpp} and its
# analyzer, torch/distributed/flight_recorder/components/types.py ``Op``): ``profiling_name``
# "nccl:send {rank}->{peer}" / "nccl:recv {rank}<-{peer}" with the ranks IN THE GROUP
# (ProcessGroupNCCL::send/recv: ``c10::str("nccl:send ", rank_, "->", dstRank)``), ``is_p2p``,
# ``p2p_seq_id``, ``collective_seq_id``, ``input_sizes``/``output_sizes``, ``state``
# (scheduled/started/completed), ``retired``, ``pg_config`` {name: {name, desc, ranks}} with the
# ranks as text ("[1, 3]"), ``pg_status`` with last_{enqueued,started,completed}_collective.

TRAIN = "/home/u/train.py"
PIPELINE = "/home/u/pipeline.py"


def _frames(file: str, line: int, inside: str | None = None) -> list[dict[str, Any]]:
    frames = [{"file": TRAIN, "line": 10, "function": "<module>", "user": True}]
    frames.append({"file": file, "line": line, "function": "main", "user": True})
    if inside:
        frames.append({"file": "/venv/torch/distributed/distributed_c10d.py", "line": 9,
                       "function": inside, "user": False})  # fmt: skip
    return frames


#: The groups of a 4-rank job, 2 stages x 2 data-parallel ranks: the world, the data-parallel
#: groups of each stage ({0, 1} and {2, 3}) and the pipeline pairs ({0, 2} and {1, 3}).
GROUPS = {
    "0": ("default_pg", [0, 1, 2, 3]),
    "1": ("dp", [0, 1]), "2": ("dp", [2, 3]),
    "3": ("pp", [0, 2]), "4": ("pp", [1, 3]),
}  # fmt: skip


def _nccl(rank: int, *, p2p: list[tuple[str, str, int, list[int], bool]], allreduces: int = 3):
    """A rank's answer whose recorder holds ``allreduces`` completed all-reduces of its data-
    parallel group and its p2p entries (group, op, peer's global rank, sizes, completed)."""
    mine = {g: (d, r) for g, (d, r) in GROUPS.items() if rank in r}
    dp = next(g for g, (d, _) in mine.items() if d == "dp")
    entries = []
    for seq in range(1, allreduces + 1):
        entries.append({
            "pg_id": int(dp), "process_group": [dp, "dp"], "collective_seq_id": seq,
            "p2p_seq_id": 0, "is_p2p": False, "profiling_name": "nccl:all_reduce",
            "input_sizes": [[8]], "output_sizes": [[8]], "state": "completed", "retired": True,
            "time_created_ns": 1_000 * seq,
        })  # fmt: skip
    for i, (group, op, peer, sizes, done) in enumerate(p2p, start=1):
        ranks = GROUPS[group][1]
        me, them = ranks.index(rank), ranks.index(peer)
        name = f"nccl:send {me}->{them}" if op == "send" else f"nccl:recv {me}<-{them}"
        entries.append({
            "pg_id": int(group), "process_group": [group, GROUPS[group][0]],
            "collective_seq_id": 0, "p2p_seq_id": i, "is_p2p": True, "profiling_name": name,
            "input_sizes": [sizes], "output_sizes": [sizes],
            "state": "completed" if done else "started", "retired": done,
            "time_created_ns": 10_000 + 1_000 * i,
        })  # fmt: skip
    config = {g: {"name": g, "desc": d, "ranks": str(r)} for g, (d, r) in mine.items()}
    status = {
        dp: {"last_enqueued_collective": allreduces, "last_started_collective": allreduces,
             "last_completed_collective": allreduces},
    }  # fmt: skip
    return {"entries": entries, "pg_config": config, "pg_status": status, "version": "2.10"}


def _answer(rank: int, frames: list[dict[str, Any]], fr: dict[str, Any]) -> dict[str, Any]:
    return {"rank": rank, "threads": [{"name": "MainThread", "frames": frames}],
            "flight_recorder": fr}  # fmt: skip


def test_nccl_p2p_entries_name_the_stage_that_never_sent_while_other_groups_are_fine() -> None:
    """Rank 1 (stage 0) loops in train.py:88 before sending to rank 3 (stage 1) in the pp group
    {1, 3}, where rank 3 waits in recv #2; ranks 0 and 2 completed their pair and every data-
    parallel all-reduce: nothing else is stuck, and they are named as nothing."""
    answers = {
        0: _answer(0, _frames(TRAIN, 50), _nccl(0, p2p=[("3", "send", 2, [4, 16], True)])),
        1: _answer(1, _frames(TRAIN, 88), _nccl(1, p2p=[("4", "send", 3, [4, 16], True)])),
        2: _answer(2, _frames(TRAIN, 50), _nccl(2, p2p=[("3", "recv", 0, [4, 16], True)])),
        3: _answer(3, _frames(PIPELINE, 120, "recv"), _nccl(3, p2p=[
            ("4", "recv", 1, [4, 16], True), ("4", "recv", 1, [4, 16], False)])),
    }  # fmt: skip
    diag = diagnose(answers, 4)
    assert diag.collective is None and diag.culprits == [1]
    assert diag.basis == "flight recorder"
    rank3 = diag.places[3]
    assert rank3.state == RankState.WAITING and rank3.p2p is not None
    # the peer in the group ("nccl:recv 1<-0" in {1, 3}) is global rank 1
    assert (rank3.p2p.kind, rank3.p2p.peer, rank3.p2p.group, rank3.p2p.seq) == ("recv", 1, "4", 2)
    assert rank3.p2p.sizes == ((4, 16),)
    assert [p.state for p in diag.places[:3]] == [
        RankState.ELSEWHERE, RankState.UNMATCHED, RankState.ELSEWHERE,
    ]  # fmt: skip
    said = headline(diag)
    assert "rank 3 waits in recv from rank 1 (p2p #2 of group 4 (pp), sizes [[4, 16]])" in said
    assert "pipeline.py:120 (main); rank 1 never sent it: it is in train.py:88 (main)" in said


def test_mismatched_peers_end_at_the_rank_that_never_posted() -> None:
    """Rank 0 sends to rank 1, which receives from rank 2 (the wrong peer); rank 2 is in
    user code: rank 0 waits behind rank 1, whose receive rank 2 never sent."""
    call = {
        0: {"op": "send", "peer": 1, "group": "0", "sizes": [[4]]},
        1: {"op": "recv", "peer": 2, "group": "0", "sizes": [[4]]},
    }
    answers = {
        r: {"threads": [{"name": "MainThread", "frames": _frames(TRAIN, 40 + r)}],
            "flight_recorder": None, "p2p_call": call.get(r)}
        for r in range(3)
    }  # fmt: skip
    diag = diagnose(answers, 3)
    assert diag.culprits == [2]
    verdicts = {w.rank: (w.verdict, w.root) for w in diag.p2p}
    assert verdicts == {0: (P2PVerdict.BEHIND, 2), 1: (P2PVerdict.NOT_POSTED, 2)}
    assert "rank 1 waits in recv from rank 2" in headline(diag)
    assert "rank 0: waiting in send to rank 1" in paragraph(diag)


def test_a_size_mismatch_and_a_cycle_name_every_rank_of_them() -> None:
    """Rank 3 receives [5] from rank 2, which sends [6]: both are named. Ranks 0 and 1 each
    receive from the other first: a cycle (a deadlock), both named."""
    call = {
        0: {"op": "recv", "peer": 1, "group": "0", "sizes": [[4]]},
        1: {"op": "recv", "peer": 0, "group": "0", "sizes": [[4]]},
        2: {"op": "send", "peer": 3, "group": "0", "sizes": [[6]]},
        3: {"op": "recv", "peer": 2, "group": "0", "sizes": [[5]]},
    }
    answers = {
        r: {"threads": [{"name": "MainThread", "frames": _frames(TRAIN, 40 + r)}],
            "p2p_call": call[r]}
        for r in range(4)
    }  # fmt: skip
    diag = diagnose(answers, 4)
    assert diag.culprits == [0, 1, 2, 3]
    verdicts = {w.rank: w.verdict for w in diag.p2p}
    assert verdicts == {
        0: P2PVerdict.CYCLE, 1: P2PVerdict.CYCLE,
        2: P2PVerdict.MISMATCH, 3: P2PVerdict.MISMATCH,
    }  # fmt: skip
    said = headline(diag)
    assert "rank 2 waits in send to rank 3 (the default group, sizes [[6]])" in said
    assert (
        "rank 3 posted recv from rank 2 (the default group, sizes [[5]]): the sizes differ" in said
    )


def test_no_culprit_when_every_send_has_its_receive() -> None:
    """Ranks 0-2 receive (at one line) from ranks 3-5, which send (at three lines): every pair
    matched, in flight. Nobody is named — not the minority places of the stacks either."""
    answers = {}
    for r in range(6):
        peer = r + 3 if r < 3 else r - 3
        call = {"op": "recv" if r < 3 else "send", "peer": peer, "group": "0", "sizes": [[4]]}
        line = 30 if r < 3 else 60 + r
        answers[r] = {"threads": [{"name": "MainThread", "frames": _frames(TRAIN, line)}],
                      "p2p_call": call}  # fmt: skip
    diag = diagnose(answers, 6)
    assert diag.p2p == [] and diag.culprits == []


def test_a_retired_nccl_entry_that_did_not_complete_timed_out_a_gloo_one_completed() -> None:
    """NCCL retires an entry whose collective timed out without completing it (torch's
    FlightRecorder ``Entry::retired_``): its receive is still the one the rank waited in. gloo
    never moves ``state`` past scheduled: retired is completed there."""
    fr = _nccl(3, p2p=[("4", "recv", 1, [4, 16], True), ("4", "recv", 1, [4, 16], False)])
    fr["entries"][-1].update(retired=True, state="started")
    found = pending_p2p({"flight_recorder": fr})
    assert found is not None and (found.peer, found.seq) == (1, 2)
    gloo = json.loads((DATA / "fr-p2p-ops-rank1.json").read_text())["entries"][0]
    assert gloo["state"] == "scheduled" and gloo["retired"] and entry_done(gloo)
    assert not entry_done({**gloo, "profiling_name": "nccl:all_reduce"})


def _gloo(enqueued: int, completed: int) -> dict[str, Any]:
    """A gloo recorder of the default group: all-reduces 1..enqueued, 1..completed retired."""
    entries = [
        {"pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
         "p2p_seq_id": 0, "is_p2p": False, "profiling_name": "gloo:all_reduce",
         "state": "scheduled", "retired": seq <= completed, "time_created_ns": 1_000 * seq}
        for seq in range(1, enqueued + 1)
    ]  # fmt: skip
    return {"entries": entries, "pg_status": {}}


def test_ranks_waiting_in_a_collective_behind_a_receive_are_said_to_wait_behind_it() -> None:
    """Rank 0 skipped its send to rank 1 and waits in all_reduce #5 with rank 2; rank 1 waits
    in recv from rank 0 (it never entered #5, only because of rank 0): rank 0 is named, rank 2
    waits behind it. Rank 1 is not the one the all-reduce waits for."""
    answers = {
        0: {"threads": [{"name": "MainThread", "frames": _frames(TRAIN, 90, "all_reduce")}],
            "flight_recorder": _gloo(5, 4)},
        1: {"threads": [{"name": "MainThread", "frames": _frames(PIPELINE, 120, "recv")}],
            "flight_recorder": _gloo(4, 4),
            "p2p_call": {"op": "recv", "peer": 0, "group": "0", "sizes": [[4]]}},
        2: {"threads": [{"name": "MainThread", "frames": _frames(TRAIN, 90, "all_reduce")}],
            "flight_recorder": _gloo(5, 4)},
    }  # fmt: skip
    diag = diagnose(answers, 3)
    assert diag.collective is not None and diag.collective.seq == 5
    assert diag.culprits == [0]
    assert [p.state for p in diag.places] == [
        RankState.UNMATCHED, RankState.WAITING, RankState.WAITING,
    ]  # fmt: skip
    said = headline(diag)
    assert "rank 0 never sent it: it is in train.py:90 (main) inside distributed_c10d.py" in said
    assert said.endswith("Rank 2 waits in all_reduce #5 of the default group behind it.")


def test_a_real_pipeline_stage_that_skipped_its_send_is_named_not_the_rank_waiting_for_it() -> None:
    """skip_send/: examples/train_hang.py --hang p2p --rank 0 under rankscope run: at step 4
    rank 0 skips its send and enters all_reduce #5; rank 1 waits in recv from rank 0 (and so
    never entered #5). Rank 0 is the one named, in the all-reduce; rank 1 waits in recv."""
    answers = {
        r: json.loads((DATA / "skip_send" / f"rank{r}-hang.json").read_text()) for r in (0, 1)
    }
    diag = diagnose(answers, 2)
    assert diag.culprits == [0]
    assert diag.collective is not None and (diag.collective.op, diag.collective.seq) == (
        "all_reduce",
        5,
    )
    rank0, rank1 = diag.places
    assert rank0.state == RankState.UNMATCHED and rank0.inside == "distributed_c10d.py:all_reduce"
    assert rank1.state == RankState.WAITING and rank1.inside == "distributed_c10d.py:recv"
    assert rank1.user_frame is not None and rank1.user_frame.function == "pipeline_stage"
    assert rank1.p2p is not None and (rank1.p2p.kind, rank1.p2p.peer) == (P2PKind.RECV, 0)
    assert rank1.p2p.sizes == ((16, 32),)
    said = headline(diag)
    assert "rank 1 waits in recv from rank 0 (the default group, sizes [[16, 32]])" in said
    assert "rank 0 never sent it: it is in train_hang.py:" in said


def test_the_probe_reads_the_peer_and_sizes_of_the_recv_a_rank_failed_in() -> None:
    """The probe's reading of a point-to-point call from a live frame of torch's own ``recv``
    (here the frame of a real ``dist.recv`` that raised — no process group — as the frames of
    a rank whose recv timed out are read): the peer, the sizes, the op."""
    import torch
    import torch.distributed as dist

    try:
        dist.recv(torch.zeros(3, 5), src=1)
    except Exception as exc:  # no default group: raised inside torch's recv
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        assert tb is not None
        call = p2p_call(tb.tb_frame)
    else:
        raise AssertionError("recv without a process group did not raise")
    assert call == {"op": "recv", "peer": 1, "group": "", "sizes": [[3, 5]]}
    assert p2p_call(sys._getframe()) is None  # not in a point-to-point call


def test_a_receive_that_timed_out_names_its_sender_not_the_bystanders() -> None:
    """gloo's recv timed out in rank 3 (its own answer: the error, the recv it raised in), whose
    sender rank 2 loops; ranks 0 and 1 are elsewhere in user code. Rank 2 is named, not the
    ranks that merely did not time out (the rule for a timed-out collective nobody names)."""
    answers: dict[int, dict[str, Any]] = {
        r: {"threads": [{"name": "MainThread", "frames": _frames(TRAIN, 30 + r)}]} for r in range(3)
    }
    answers[3] = {
        "threads": [{"name": "MainThread", "frames": _frames(PIPELINE, 120, "recv")}],
        "timed_out": True,
        "error": {"type": "RuntimeError", "message": "Timed out waiting 10000ms for recv"},
        "p2p_call": {"op": "recv", "peer": 2, "group": "0", "sizes": [[4]]},
    }
    diag = diagnose(answers, 4)
    assert diag.culprits == [2]
    assert diag.places[3].state == RankState.WAITING
    assert "rank 3 waits in recv from rank 2" in headline(diag)
