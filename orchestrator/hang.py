"""Saying who stopped a hung job and where: the launcher noticed the hang and asked the ranks;
this reads their answers, has the analysis diagnose them, and tells the user.

On the terminal: one short paragraph (no traceback; the ranks' own output stays in the log).
On disk: ``report/hang.json`` (the whole diagnosis) and ``run.json``'s ``hang`` object (the
notice, the headline, the culprits' places). The orchestrator does it because the launchers,
which notice the hang, may not import the analysis (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.errors import OutputError, RankscopeError
from rankscope.launchers import rundir

if TYPE_CHECKING:
    from rankscope.launchers.hang_watch import HangNotice


def read_answers(
    run_dir: Path, token: str, name: str = rundir.HANG_DUMP
) -> dict[int, dict[str, Any]]:
    """rank → its hang.json (or ``name``), for the answers to this notice (``token``) only."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted((run_dir / rundir.RANKS_DIR).glob(f"*/{name}")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            doc = json.loads(path.read_text())
            if str(doc.get("token")) == token:
                out[int(doc["rank"])] = doc
    return out


def text_stacks(run_dir: Path, ranks: list[int], since_ns: int) -> dict[int, dict[str, Any]]:
    """rank → the threads of the stacks ``ranks`` (that did not answer) wrote as text since
    ``since_ns`` (ns since the epoch: this hang's, not an earlier one's): py-spy's
    (``native-stacks.txt``: thread names and native frames) before faulthandler's
    (``stacks.txt``), each frame marked as the user's by the rank's own rule, with
    ``stacks_from`` saying which (docs/hangs.md)."""
    from rankscope.analysis.compute.stack_text import parse_faulthandler, parse_py_spy
    from rankscope.launchers.hang_probe import is_user_file

    sources = (
        (rundir.NATIVE_STACKS_FILE, parse_py_spy, "py-spy"),
        (rundir.STACKS_FILE, parse_faulthandler, "faulthandler"),
    )
    out: dict[int, dict[str, Any]] = {}
    for rank in ranks:
        for name, parse, source in sources:
            path = rundir.rank_dir(run_dir, rank) / name
            try:
                if path.stat().st_mtime_ns < since_ns:
                    continue  # an earlier hang's
                threads = parse(path.read_text(errors="replace"))
            except OSError:
                continue
            if not threads or not threads[0]["frames"]:
                continue
            for thread in threads:
                for f in thread["frames"]:
                    f["user"] = not f["native"] and is_user_file(str(f["file"]))
            out[rank] = {
                "rank": rank,
                "threads": threads,
                "stacks_from": f"{source} stacks, {name}",
            }
            break
    return out


def dead_ranks(run_dir: Path) -> dict[int, dict[str, Any]]:
    """rank → the error its runtime recorded (meta.json), for ranks that died of one."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted((run_dir / rundir.RANKS_DIR).glob(f"*/{rundir.META_JSON}")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            meta = json.loads(path.read_text())
            err = meta.get("error")
            if err and not err.get("interrupted"):
                out[int(meta["rank"])] = {
                    "error": f"{err.get('type')}: {err.get('message')}",
                    "user_frame": err.get("user_frame"),
                    "time_ns": err.get("time_ns"),
                }
    return out


def _ended_by_us(
    rank: int, death: dict[str, Any], answers: dict[int, dict[str, Any]], notice: HangNotice
) -> bool:
    """Whether a rank's recorded error came after it answered the hang notice: then the
    hang's ending (rankscope's SIGTERM to the job, which Slurm's scancel also sends to the
    rank's data-loader workers, whose death torch raises in the rank before the rank's own
    SIGTERM handler runs) made it, and the rank is placed by its answer, not as dead."""
    at = death.get("time_ns")
    return rank in answers and isinstance(at, int) and at >= notice.noticed_ns


def say_who_and_where(run_dir: Path, notice: HangNotice) -> None:
    """Diagnose the answers to ``notice``, print the paragraph, write hang.json and run.json."""
    from rankscope.analysis.compute.hang import diagnose
    from rankscope.analysis.conclude.hang_findings import hang_json, paragraph, run_record

    answers = read_answers(run_dir, str(notice.noticed_ns))
    try:
        world = int(rundir.load_run(run_dir).get("world_size") or 0)
    except (RankscopeError, OSError, ValueError):
        world = 0
    world = max(world, 1 + max([*answers, *(p.rank for p in notice.ranks), -1]))
    progress = {p.rank: (p.steps, notice.since_s(p)) for p in notice.ranks}
    for rank, doc in answers.items():  # the answer's own record is newer than the notice's
        last = doc.get("last_step_ns")
        since = None if last is None else (notice.noticed_ns - int(last)) / 1e9
        progress[rank] = (int(doc.get("steps") or 0), since)
    dead = {r: d for r, d in dead_ranks(run_dir).items() if not _ended_by_us(r, d, answers, notice)}
    silent = [r for r in range(world) if r not in answers and r not in dead]
    stacks = text_stacks(run_dir, silent, notice.noticed_ns)
    diag = diagnose(answers, world, dead, progress, stacks=stacks)
    print(paragraph(diag), file=sys.stderr, flush=True)
    report = run_dir / rundir.REPORT_DIR / rundir.HANG_REPORT
    try:
        rundir.write_json_atomic(report, hang_json(diag, notice.record()))
        rundir.update_run(run_dir, hang={**notice.record(), **run_record(diag)})
    except OutputError as exc:
        print(f"rankscope run: warning: {exc}", file=sys.stderr, flush=True)
        return
    print(f"rankscope: wrote {report}", file=sys.stderr, flush=True)


def say_what_the_others_did(run_dir: Path) -> str:
    """After a rank died: the paragraph of what the survivors were in (their answers to
    SIGTERM, ``terminated.json``), printed; "" when there is nothing to say."""
    from rankscope.analysis.compute.hang import diagnose
    from rankscope.analysis.conclude.hang_findings import after_failure
    from rankscope.launchers.hang_probe import TERMINATED_TOKEN

    answers = read_answers(run_dir, TERMINATED_TOKEN, rundir.TERMINATED_DUMP)
    try:
        record = rundir.load_run(run_dir)
    except (RankscopeError, OSError, ValueError):
        return ""
    dead = dead_ranks(run_dir)
    for f in record.get("failures") or []:
        rank = f.get("rank")
        if rank is not None and rank not in answers and rank not in dead:
            dead[int(rank)] = {
                "error": str(f.get("error") or ""),
                "user_frame": f.get("user_frame"),
            }
    if not answers or not dead:
        return ""
    world = max(int(record.get("world_size") or 0), 1 + max([*answers, *dead]))
    text = after_failure(diagnose(answers, world, dead))
    if text:
        print(text, file=sys.stderr, flush=True)
    return text


def say_the_timeout(run_dir: Path) -> str:
    """After a collective timed out (the launcher recorded the run ``hung`` with run.json's
    ``hang.collective_timeout``): who and where, from the ranks' own answers — the rank that
    timed out answered before it ended, the others when torchrun ended them
    (``hang_probe.TERMINATED_TOKEN``). Prints the paragraph, writes ``report/hang.json`` and
    run.json's ``hang``; returns the paragraph ("" when there is nothing to say)."""
    from rankscope.analysis.compute.hang import diagnose
    from rankscope.analysis.conclude.hang_findings import hang_json, paragraph, run_record
    from rankscope.launchers.hang_probe import TERMINATED_TOKEN, is_collective_timeout

    try:
        record = rundir.load_run(run_dir)
    except (RankscopeError, OSError, ValueError):
        return ""
    hang = record.get("hang") or {}
    timeout = hang.get("collective_timeout")
    if not isinstance(timeout, dict) or hang.get("headline"):
        return ""  # not a timeout, or said already (the watch noticed the hang first)
    answers = read_answers(run_dir, TERMINATED_TOKEN, rundir.TERMINATED_DUMP)
    dead = {r: d for r, d in dead_ranks(run_dir).items() if r not in answers}
    # ranks whose collective timed out and that could not answer (NCCL's watchdog ends them)
    waited = {
        int(f["rank"]): {**dead.get(int(f["rank"]), {}), "error": f.get("error")}
        for f in record.get("failures") or []
        if f.get("rank") is not None
        and int(f["rank"]) not in answers
        and is_collective_timeout(str(f.get("error") or ""))
    }
    dead = {r: d for r, d in dead.items() if r not in waited}
    progress: dict[int, tuple[int | None, float | None]] = {}
    for rank, doc in answers.items():
        last, now = doc.get("last_step_ns"), doc.get("time_ns")
        since = None if last is None or now is None else (int(now) - int(last)) / 1e9
        progress[rank] = (int(doc.get("steps") or 0), since)
    world = max(int(record.get("world_size") or 0), 1 + max([*answers, *dead, *waited, -1]))
    diag = diagnose(answers, world, dead, progress, timed_out=waited)
    who = "launcher" if timeout.get("rank") is None else f"rank {timeout['rank']}"
    text = f"A collective timed out ({who}: {timeout.get('error')}).\n{paragraph(diag)}"
    print(text, file=sys.stderr, flush=True)
    report = run_dir / rundir.REPORT_DIR / rundir.HANG_REPORT
    notice = {"collective_timeout": timeout, "answered": sorted(answers)}
    try:
        rundir.write_json_atomic(report, hang_json(diag, notice))
        rundir.update_run(run_dir, hang={**hang, **notice, **run_record(diag)})
    except OutputError as exc:
        print(f"rankscope run: warning: {exc}", file=sys.stderr, flush=True)
        return text
    print(f"rankscope run: wrote {report}", file=sys.stderr, flush=True)
    return text


def diagnose_recorded(run_dir: Path) -> bool:
    """A hang noticed by a Slurm batch job's first node (``launchers/slurm/node_hang.py``),
    which records the notice but may not diagnose it: diagnose it now from the answers on the
    shared folder, printed (the merge log) and written as :func:`say_who_and_where` does. False
    when there is nothing to do (no hang, or one diagnosed already)."""
    from rankscope.launchers.hang_watch import HangNotice, HangRule, HangWatch, OnHang

    try:
        hang = rundir.load_run(run_dir).get("hang") or {}
    except (RankscopeError, OSError, ValueError):
        return False
    if not hang or hang.get("headline") or hang.get("noticed_ns") is None:
        return False
    notice = HangNotice(
        idle_s=float(hang.get("idle_s") or 0.0),
        threshold_s=float(hang.get("threshold_s") or 0.0),
        before_first_step=bool(hang.get("before_first_step")),
        ranks=HangWatch(run_dir, HangRule()).progress(),
        noticed_ns=int(hang["noticed_ns"]),
        answered=list(hang.get("answered") or []),
        signalled=list(hang.get("signalled") or []),
        on_hang=OnHang(hang.get("on_hang") or OnHang.REPORT),
    )
    say_who_and_where(run_dir, notice)
    return True
