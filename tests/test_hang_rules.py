"""Hang diagnosis without a job: the diagnosis of the ranks' answers against known truth
(Flight-Recorder-shaped answers built here, as PyTorch 2.13 writes them for gloo), the words,
and the launcher's rule on real progress files."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rankscope.analysis.compute.hang import RankState, diagnose
from rankscope.analysis.conclude.hang_findings import after_failure, hang_json, paragraph
from rankscope.launchers import rundir
from rankscope.launchers.hang_watch import MIN_HANG_AFTER_S, HangRule, HangWatch
from rankscope.rank_ranges import rank_list


def _frames(*where: tuple[str, int, str, bool]) -> list[dict[str, Any]]:
    return [{"file": f, "line": ln, "function": fn, "user": u} for f, ln, fn, u in where]


def _answer(
    rank: int, groups: dict[str, tuple[int, int, dict[int, str]]], frames: list[dict[str, Any]]
) -> dict[str, Any]:
    """A rank's hang.json: per group name (enqueued, completed, {seq: op}), its main stack."""
    entries, status = [], {}
    for i, (name, (enq, done, ops)) in enumerate(groups.items()):
        for seq, op in ops.items():
            entries.append(
                {
                    "collective_seq_id": seq,
                    "pg_id": i,
                    "process_group": [name, "default_pg" if name == "0" else "undefined"],
                    "profiling_name": f"gloo:{op}",
                    "time_created_ns": 1_000 * seq + i,
                    "is_p2p": False,
                }
            )
        status[str(i)] = {
            "last_enqueued_collective": str(enq),
            "last_completed_collective": str(done),
        }
    return {
        "rank": rank,
        "threads": [{"name": "MainThread", "frames": frames}],
        "flight_recorder": {"entries": entries, "pg_status": status},
    }


TRAIN = "/home/u/train.py"
WAITING = _frames(
    (TRAIN, 10, "<module>", True),
    (TRAIN, 41, "main", True),
    ("/lib/c10d.py", 9, "all_reduce", False),
)
LOOPING = _frames((TRAIN, 10, "<module>", True), (TRAIN, 88, "main", True))
OPS = {1: "all_reduce", 2: "all_reduce", 3: "all_reduce"}


def test_the_rank_that_never_arrived_is_named_with_its_line() -> None:
    """8 ranks; rank 5 stopped after collective 2, the others wait in #3."""
    answers = {
        r: _answer(r, {"0": (2, 2, OPS) if r == 5 else (3, 2, OPS)}, LOOPING if r == 5 else WAITING)
        for r in range(8)
    }
    diag = diagnose(answers, 8)
    assert diag.collective is not None and (diag.collective.op, diag.collective.seq) == (
        "all_reduce",
        3,
    )
    assert diag.culprits == [5] and not diag.desync
    assert diag.ranks(RankState.WAITING) == [0, 1, 2, 3, 4, 6, 7]
    text = paragraph(diag)
    assert text.splitlines()[0] == (
        "The job hung in all_reduce #3 of the default group: the others wait for rank 5."
    )
    assert "rank 5: never entered all_reduce #3 of the default group, in train.py:88 (main)" in text
    assert "ranks 0–4, 6–7: waiting in all_reduce #3" in text and "train.py:41 (main)" in text


def test_a_desync_names_both_call_sites() -> None:
    gather = _frames((TRAIN, 45, "main", True), ("/lib/c10d.py", 9, "all_gather", False))
    answers = {
        0: _answer(0, {"0": (3, 2, OPS)}, WAITING),
        1: _answer(1, {"0": (3, 2, {**OPS, 3: "all_gather"})}, gather),
    }
    diag = diagnose(answers, 2)
    assert diag.desync and diag.collective is not None and diag.collective.seq == 3
    assert {p.rank: p.op for p in diag.places} == {0: "all_reduce", 1: "all_gather"}
    text = paragraph(diag)
    assert "desync at collective #3 of the default group" in text
    assert "train.py:41" in text and "train.py:45" in text


def test_of_two_waiting_groups_the_one_waiting_longest_is_named() -> None:
    """Ranks 0-1 wait in the default group's #3 (created first); rank 2 never arrived there
    because it waits in group 1's #2 for rank 3, which never arrived there: the wavefront is the
    group that waits longest (the others wait behind it)."""
    g1 = {1: "broadcast", 2: "broadcast"}
    answers = {
        0: _answer(0, {"0": (3, 2, OPS)}, WAITING),
        1: _answer(1, {"0": (3, 2, OPS)}, WAITING),
        2: _answer(2, {"0": (2, 2, OPS), "1": (2, 1, g1)}, WAITING),
        3: _answer(3, {"0": (2, 2, OPS), "1": (1, 1, g1)}, LOOPING),
    }
    # group 1's #2 was created before the default group's #3 (time_created_ns = 1000*seq + pg)
    diag = diagnose(answers, 4)
    assert diag.collective is not None and (diag.collective.group, diag.collective.seq) == ("1", 2)
    assert diag.culprits == [3]


def test_without_a_flight_recorder_the_odd_one_out_is_suspected() -> None:
    answers = {
        r: {"rank": r, "threads": [{"name": "MainThread", "frames": WAITING}]} for r in range(4)
    }
    answers[2] = {"rank": 2, "threads": [{"name": "MainThread", "frames": LOOPING}]}
    diag = diagnose(answers, 4)
    assert diag.collective is None and diag.basis == "stacks"
    assert diag.culprits == [2]
    same = {
        r: {"rank": r, "threads": [{"name": "MainThread", "frames": WAITING}]} for r in range(4)
    }
    assert diagnose(same, 4).culprits == []


def test_dead_and_silent_ranks_are_named_as_such() -> None:
    answers = {0: _answer(0, {"0": (3, 2, OPS)}, WAITING)}
    dead = {1: {"error": "killed by SIGKILL", "user_frame": None}}
    diag = diagnose(answers, 3, dead)
    # every rank is in the default group: one that did not answer never arrived in #3
    states = {p.rank: p.state for p in diag.places}
    assert states == {0: RankState.WAITING, 1: RankState.DEAD, 2: RankState.SILENT}
    assert diag.collective is not None and diag.collective.seq == 3
    assert diag.culprits == [1]
    doc = hang_json(diag, {"idle_s": 21.0})
    assert [r["state"] for r in doc["ranks"]] == ["waiting", "dead", "silent"]
    json.dumps(doc)  # plain JSON


def test_rank_lists_read_as_ranges() -> None:
    assert rank_list([3]) == "rank 3"
    assert rank_list([7, 0, 1, 2, 5]) == "ranks 0–2, 5, 7"


def _progress(run: Path, rank: int, steps: int, last_ns: int | None, pid: int) -> None:
    rundir.write_json_atomic(
        rundir.rank_dir(run, rank) / rundir.PROGRESS_FILE,
        {"rank": rank, "pid": pid, "steps": steps, "last_step_ns": last_ns},
    )


def test_a_rank_whose_collective_failed_when_its_peer_died_was_waiting_in_it() -> None:
    """On a multi-node job the survivor of a SIGKILLed peer fails by itself ("Connection reset
    by peer") and answers with its error and the stack it raised from; its Flight Recorder
    counts the failed all_reduce #3 as completed. It was waiting in #3 when rank 1 died; the
    same error raised outside a collective makes it a dead rank of its own, waiting for no one."""
    failed_in = _frames(
        (TRAIN, 41, "main", True),
        ("/lib/torch/distributed/distributed_c10d.py", 3252, "all_reduce", False),
    )
    error = {"type": "RuntimeError", "message": "Connection reset by peer"}
    dead = {
        0: {"error": "RuntimeError: Connection reset by peer", "user_frame": None},
        1: {"error": "killed by SIGKILL", "user_frame": None},
    }
    answer = {**_answer(0, {"0": (3, 3, OPS)}, failed_in), "error": error}
    text = after_failure(diagnose({0: answer}, 2, dead))
    assert text.splitlines() == [
        "When rank 1 died, the others were waiting in all_reduce #3 of the default group:",
        "  rank 0: waiting in all_reduce #3 of the default group, in train.py:41 (main) inside "
        "distributed_c10d.py:all_reduce",
    ]
    raised_here = {**_answer(0, {"0": (3, 3, OPS)}, LOOPING), "error": error}
    diag = diagnose({0: raised_here}, 2, dead)
    assert diag.ranks(RankState.DEAD) == [0, 1] and after_failure(diag) == ""


def test_the_rule_counts_from_the_last_step_of_any_rank(tmp_path: Path) -> None:
    """Real progress files: rank 1 finished a step 2 s ago, rank 0 30 s ago: not hung at
    --hang-after 20; both 25 s ago: hung, and the notice says each rank's last step."""
    now = time.time_ns()
    me = os.getpid()
    watch = HangWatch(tmp_path, HangRule(hang_after_s=20.0))
    _progress(tmp_path, 0, 7, now - 30 * 10**9, me)
    _progress(tmp_path, 1, 8, now - 2 * 10**9, me)
    assert watch.check() is None
    _progress(tmp_path, 1, 8, now - 25 * 10**9, me)
    notice = watch.check()
    assert notice is not None and not notice.before_first_step and 24 < notice.idle_s < 40
    assert (
        "rank 0: step 7, 30 s ago" in notice.line() and "rank 1: step 8, 25 s ago" in notice.line()
    )
    assert watch.check() is None  # reported once; no new step since


def test_growing_steps_raise_the_default_threshold(tmp_path: Path) -> None:
    """Without --hang-after: max(10 x p99 step, 300 s); steps growing to 60 s make it 600 s, so
    a 400 s step is not a hang, and before any step the first-step rule applies."""
    watch = HangWatch(tmp_path, HangRule())
    assert watch.threshold_s(before_first_step=False) == MIN_HANG_AFTER_S
    t = time.time_ns() - 10**12
    me = os.getpid()
    for step, dur in enumerate([0.2, 1.0, 3.0, 20.0, 60.0], start=1):
        t += int(dur * 1e9)
        _progress(tmp_path, 0, step, t, me)
        watch.check()
    assert watch.p99_step_s() == 60.0
    assert watch.threshold_s(before_first_step=False) == 600.0
    assert HangWatch(tmp_path, HangRule(hang_after_s=20)).threshold_s(True) == 120.0
    assert HangWatch(tmp_path, HangRule(hang_after_s=50)).threshold_s(True) == 150.0


def test_a_rank_whose_process_is_gone_is_a_failure_not_a_hang(tmp_path: Path) -> None:
    import subprocess
    import sys

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    old = time.time_ns() - 100 * 10**9
    _progress(tmp_path, 0, 3, old, os.getpid())
    _progress(tmp_path, 1, 3, old, int(gone.stdout))
    assert HangWatch(tmp_path, HangRule(hang_after_s=5.0)).check() is None
    assert HangWatch(tmp_path, HangRule(hang_after_s=5.0), local=False).check() is not None
    # on Slurm the pids are another node's: a node task that recorded its torchrun's failure says it
    from rankscope.launchers.slurm.node_hang import failing_nodes
    from rankscope.launchers.slurm.records import SLURM_DIR, TASK_FORMAT

    task = tmp_path / SLURM_DIR / TASK_FORMAT.format(job_id="7", node=1)
    rundir.write_json_atomic(task, {"node": 1, "state": "running"})
    slurm = HangWatch(
        tmp_path,
        HangRule(hang_after_s=5.0),
        local=False,
        failing=lambda: failing_nodes(tmp_path, "7"),
    )
    assert slurm.check() is not None
    rundir.write_json_atomic(task, {"node": 1, "state": "failed"})
    slurm.reported_at_steps = None
    assert slurm.check() is None


#: A rank: faulthandler writes every thread's stack to argv[1] on SIGUSR2; it prints its pid.
_RANK = (
    "import faulthandler, os, signal, sys, threading; f = open(sys.argv[1], 'w'); "
    "faulthandler.register(signal.SIGUSR2, file=f, all_threads=True); "
    "print(os.getpid(), flush=True); threading.Event().wait(120)"
)
#: A node's torchrun: one rank below it.
_TORCHRUN = (
    "import subprocess, sys; "
    f"subprocess.Popen([sys.executable, '-c', {_RANK!r}, sys.argv[1]]).wait()"
)


def test_a_node_relays_the_stack_signal_to_its_own_ranks_only(tmp_path: Path) -> None:
    """Real processes: a "torchrun" with its rank, and a rank of another node (not below it);
    the request names both, the relay of the first node signals its own rank only, once."""
    import subprocess
    import sys

    from rankscope.launchers.hang_watch import RankProgress
    from rankscope.launchers.slurm.node_hang import SignalRelay, request_stack_signal

    mine_out, other_out = tmp_path / "mine.txt", tmp_path / "other.txt"
    torchrun = subprocess.Popen(
        [sys.executable, "-c", _TORCHRUN, str(mine_out)], stdout=subprocess.PIPE, text=True
    )
    other = subprocess.Popen(
        [sys.executable, "-c", _RANK, str(other_out)], stdout=subprocess.PIPE, text=True
    )
    mine_pid = None
    try:
        assert torchrun.stdout is not None and other.stdout is not None
        mine_pid, other_pid = int(torchrun.stdout.readline()), int(other.stdout.readline())
        ranks = [
            RankProgress(rank=0, pid=mine_pid, steps=3, last_step_ns=None, stack_signal=True),
            RankProgress(rank=1, pid=other_pid, steps=3, last_step_ns=None, stack_signal=True),
        ]
        assert request_stack_signal(tmp_path, "7", ranks) == [0, 1]
        relay = SignalRelay(tmp_path, "7", torchrun.pid)
        assert relay.relay_once() == [mine_pid]
        assert relay.relay_once() == []  # the same request: once
        deadline = time.monotonic() + 60
        while "most recent call first" not in mine_out.read_text():
            assert time.monotonic() < deadline, "no stacks from the signalled rank"
            time.sleep(0.1)
        assert other_out.read_text() == ""
    finally:
        if mine_pid is not None:
            os.kill(mine_pid, 9)  # the rank below the "torchrun", by its pid
        for proc in (torchrun, other):
            proc.kill()
            proc.wait()


def test_across_nodes_a_rank_killed_by_a_signal_is_the_root_cause() -> None:
    """Each node's torchrun names its own first failure; rank 1 SIGKILLed on one node, rank 0
    failing in its collective on the other ("Connection reset by peer"): rank 1 is the job's
    root cause. Ranks the teardown ended (SIGTERM) are never causes."""
    from rankscope.launchers.slurm.records import root_cause_across_nodes

    reset = {"rank": 0, "error": "RuntimeError: Connection reset by peer", "exit_code": 1}
    killed = {"rank": 1, "error": "killed by SIGKILL", "exit_code": -9}
    out = root_cause_across_nodes([{**reset, "root_cause": True}, {**killed, "root_cause": True}])
    assert [(f["rank"], f["root_cause"]) for f in out] == [(0, False), (1, True)]
    ended = {"rank": 1, "error": "killed by SIGTERM", "exit_code": -15, "root_cause": True}
    out = root_cause_across_nodes([{**reset, "root_cause": True}, ended])
    assert [f["root_cause"] for f in out] == [True, True]  # the nodes' own words stand


#: gloo's collective timeout as PyTorch 2.13 (CPU build) raised it in a real job (rank 0 of
#: examples/train_hang.py --hang loader --pg-timeout 10)
GLOO_TIMEOUT = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]"
    " Timed out waiting 10000ms for recv operation to complete"
)
#: NCCL's watchdog line, as ProcessGroupNCCL.cpp writes it (behind torchrun's rank prefix)
NCCL_WATCHDOG = (
    "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1056, "
    "NumelOut=1056, Timeout(ms)=600000) ran for 600081 milliseconds before timing out."
)


def test_a_collective_timeout_is_recognised_in_the_backends_words() -> None:
    from rankscope.launchers.hang_probe import is_collective_timeout
    from rankscope.launchers.torchrun import torchrun_failures

    assert is_collective_timeout(GLOO_TIMEOUT)
    assert is_collective_timeout(NCCL_WATCHDOG)
    for other in (
        "RuntimeError: Connection closed by peer [127.0.0.1]:29500",
        "Timed out after 900 seconds waiting for clients. 1/2 clients joined.",
        "RuntimeError: injected failure on rank 1 at step 7",
    ):
        assert not is_collective_timeout(other)
    # NCCL's watchdog ends the rank (SIGABRT): torchrun's summary says only the signal, the
    # rank's failure takes the watchdog's words from the log
    log = f"{NCCL_WATCHDOG}\n" + (
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-03_02:20:25\n"
        "  host      : localhost\n  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : -6 (pid: 20890)\n  error_file: <N/A>\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 20890\n"
    )
    (failure,) = torchrun_failures(log)
    assert failure["rank"] == 0 and is_collective_timeout(failure["error"])
    assert "SeqNum=5, OpType=ALLREDUCE" in failure["error"]


def test_a_rank_whose_collective_timed_out_waited_in_it() -> None:
    """gloo marks the collective that timed out completed (rank 0: enqueued 5, completed 5);
    rank 1 never arrived (enqueued 4). The timed-out rank waited in #5: rank 1 is named."""
    ops = {seq: "all_reduce" for seq in range(1, 6)}
    timed_out = _answer(0, {"0": (5, 5, ops)}, WAITING) | {"timed_out": True}
    answers = {0: timed_out, 1: _answer(1, {"0": (4, 4, ops)}, LOOPING)}
    diag = diagnose(answers, 2)
    assert diag.collective is not None and (diag.collective.op, diag.collective.seq) == (
        "all_reduce",
        5,
    )
    assert diag.culprits == [1]
    assert {p.rank: p.state for p in diag.places} == {0: RankState.WAITING, 1: RankState.MISSING}


def test_library_wrappers_are_looked_through() -> None:
    """The user's line, then torch's decorator (a closure in an installed package, wherever it
    is installed), then the collective: the place names the user's line and the collective."""
    from rankscope.analysis.compute.hang import place_in_code
    from rankscope.launchers.hang_probe import is_user_file

    torch_dir = "/opt/conda/lib/python3.11/site-packages/torch/distributed"
    assert not is_user_file(f"{torch_dir}/c10d_logger.py")
    assert not is_user_file("/usr/lib/python3/dist-packages/torch/distributed/c10d_logger.py")
    assert is_user_file("/home/u/project/train.py")
    frames = [
        {"file": TRAIN, "line": 41, "function": "main", "user": True, "closure": False},
        {
            "file": f"{torch_dir}/c10d_logger.py",
            "line": 83,
            "function": "wrapper",
            "user": False,
            "closure": True,
        },
        {
            "file": f"{torch_dir}/distributed_c10d.py",
            "line": 3252,
            "function": "all_reduce",
            "user": False,
            "closure": False,
        },
    ]
    frame, inside = place_in_code({"threads": [{"name": "MainThread", "frames": frames}]})
    assert frame is not None and (frame.line, frame.function) == (41, "main")
    assert inside == "distributed_c10d.py:all_reduce"


def test_tracebacks_stay_out_of_the_terminal() -> None:
    """What torchrun wrote when a rank was killed (a data-loader's ignored exception, then
    torchrun's ChildFailedError with its framed report) and a rank's chained traceback: the
    tracebacks are left out whole, every other line is shown. The framed report holds the
    failed ranks' tracebacks, chained ones too ("During handling …", then an indented
    "Traceback"): the report is left out up to its closing line (a real CI run showed its Root
    Cause section once a chained traceback inside had ended the frame early)."""
    from rankscope.launchers.output import ConsoleFilter

    text = """step 3 loss 0.5
W1203 02:20:25.706000 20822 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 20889 closing signal SIGTERM
Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f2008f68400>
Traceback (most recent call last):
  File "/x/site-packages/torch/utils/data/dataloader.py", line 1703, in __del__
    def __del__(self) -> None:

  File "/x/site-packages/torch/utils/data/_utils/signal_handling.py", line 73, in handler
    _error_if_any_worker_fails()
RuntimeError: DataLoader worker (pid 20977) is killed by signal: Terminated.
[rank1]: Traceback (most recent call last):
[rank1]:   File "/x/train.py", line 85, in main
[rank1]:     for step, batch in enumerate(loader):
[rank1]: rankscope.launchers.runtime.Terminated: 143

[rank1]: During handling of the above exception, another exception occurred:

[rank1]: Traceback (most recent call last):
[rank1]:   File "/x/rank.py", line 128, in main
[rank1]: FileExistsError: [Errno 17] File exists
E1203 02:20:34.729000 20822 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
rankscope.launchers.rank FAILED
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  traceback : Traceback (most recent call last):
    File "/x/train.py", line 85, in main
      for step, batch in enumerate(loader):
  rankscope.launchers.runtime.Terminated: 143

  During handling of the above exception, another exception occurred:

  Traceback (most recent call last):
    File "/x/site-packages/torch/utils/data/dataloader.py", line 1291, in _try_get_data
  RuntimeError: DataLoader worker (pid 25852) is killed by signal: Terminated.

------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  traceback : Traceback (most recent call last):
    File "/x/train.py", line 129, in main
  RuntimeError: Timed out waiting 10000ms for recv operation to complete

============================================================
step 4 loss 0.4
"""
    shown = ConsoleFilter()
    out = b"".join(
        kept
        for line in text.encode().splitlines(keepends=True)
        if (kept := shown(line)) is not None
    ).decode()
    assert out.splitlines() == [
        "step 3 loss 0.5",
        *(line for line in text.splitlines() if line.startswith(("W1203", "E1203"))),
        "step 4 loss 0.4",
    ]


def test_ranks_ended_by_the_nccl_watchdog_waited_and_the_one_that_answered_never_came() -> None:
    """NCCL: ranks 0, 2, 3 timed out in a collective and were ended by the watchdog (no
    answer); rank 1, stuck in a loop, answered torchrun's SIGTERM without a timeout. A
    collective times out only in the ranks that entered it: rank 1 never did."""
    ops = {seq: "all_reduce" for seq in range(1, 5)}
    answers = {1: _answer(1, {"0": (4, 4, ops)}, LOOPING)}
    waited = {r: {"error": NCCL_WATCHDOG.replace("Rank 0", f"Rank {r}")} for r in (0, 2, 3)}
    diag = diagnose(answers, 4, {}, timed_out=waited)
    assert diag.culprits == [1]
    assert diag.ranks(RankState.WAITING) == [0, 2, 3]
    assert "rank 1 is not where the others are" in paragraph(diag)


def test_a_rank_that_does_not_answer_gets_its_native_stacks_from_py_spy(tmp_path: Path) -> None:
    """A real process that stopped stepping and has no probe to answer (as a rank whose C
    extension holds the GIL): the watch notices the hang, waits for the answer in vain, and
    py-spy (the dev extra) writes its native and Python frames to native-stacks.txt."""
    import subprocess
    import sys
    import threading

    from rankscope.launchers.hang_watch import py_spy

    assert py_spy() is not None  # installed with the dev extra
    blocked = "import threading; threading.Event().wait(120)"
    proc = subprocess.Popen([sys.executable, "-c", blocked])
    try:
        _progress(tmp_path, 0, 3, time.time_ns() - 100 * 10**9, proc.pid)
        watch = HangWatch(tmp_path, HangRule(hang_after_s=5.0))
        notice = watch.check()
        assert notice is not None
        watch.ask_ranks(notice)
        assert notice.answered == [] and notice.native == [0]
        text = (rundir.rank_dir(tmp_path, 0) / rundir.NATIVE_STACKS_FILE).read_text()
        assert "Event.wait (" in text and "libc" in text
        # full paths (--full-filenames): the analysis tells the user's files by them
        assert f"{Path(threading.__file__)}:" in text
        assert notice.record()["native_stacks"] == [0]
    finally:
        proc.kill()
        proc.wait()
