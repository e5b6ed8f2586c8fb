"""The ``rankscope`` process ends without the interpreter's teardown once nothing is left to do
(``cli._end_finished``): the status and the output are those of the usual exit, ``atexit``
handlers run, and the usual exit is kept where it still has work (a live thread, a tracer).

Each case runs a real ``rankscope`` process (``python -c`` calling ``cli.main()`` as the console
script does) on a real run folder. Whether the teardown ran is seen from an object held by the
script's module, whose ``__del__`` prints only when the interpreter deallocates its modules.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

from run_folders import failed_local_run

#: What the script's module holds: printed only by the interpreter's teardown.
TEARDOWN = "teardown ran"
#: Printed by an ``atexit`` handler the script registers.
ATEXIT = "atexit ran"
#: Printed without a newline just before the command: only a flush makes it appear.
BUFFERED = "buffered-output"


def rankscope_process(argv: list[str], before: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``rankscope ARGV`` as the console script does, after the lines ``before``."""
    script = textwrap.dedent(
        f"""
        import atexit, sys, threading, time

        class Held:
            def __del__(self):
                print({TEARDOWN!r}, flush=True)

        HELD = Held()
        atexit.register(print, {ATEXIT!r})
        """
    )
    script += textwrap.dedent(before)
    script += textwrap.dedent(
        f"""
        print({BUFFERED!r}, end="")
        sys.argv = ["rankscope", *{argv!r}]
        from rankscope.orchestrator.cli import main
        sys.exit(main())
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )


def test_finished_command_ends_without_teardown(tmp_path: Path) -> None:
    """Success and failure alike: the command's status, its output and the script's buffered
    text flushed, the ``atexit`` handler run, and no teardown."""
    run_dir = failed_local_run(tmp_path)
    ok = rankscope_process(["status", str(run_dir)])
    assert ok.returncode == 0, ok.stderr
    assert "rank 1 failed" in ok.stdout
    assert BUFFERED in ok.stdout and ATEXIT in ok.stdout
    assert TEARDOWN not in ok.stdout

    bad = rankscope_process(["status", str(tmp_path / "missing")])
    assert bad.returncode == 1
    assert "not found" in bad.stderr
    assert BUFFERED in bad.stdout and ATEXIT in bad.stdout
    assert TEARDOWN not in bad.stdout

    local = rankscope_process(["cancel", str(run_dir)])
    assert local.returncode == 2  # a local run: nothing to cancel
    assert TEARDOWN not in local.stdout


def test_live_thread_keeps_the_usual_exit(tmp_path: Path) -> None:
    """A thread that is not a daemon still runs when the command returns: the process waits for
    it as the interpreter always does (it ends once the main thread is done), then tears down."""
    run_dir = failed_local_run(tmp_path)
    before = """
        def last_word():
            for _ in range(6000):  # bounded: 60 s at most
                if not threading.main_thread().is_alive():
                    break
                time.sleep(0.01)
            print("thread done", flush=True)

        threading.Thread(target=last_word).start()
        """
    out = rankscope_process(["status", str(run_dir)], before)
    assert out.returncode == 0, out.stderr
    assert "thread done" in out.stdout
    assert ATEXIT in out.stdout and TEARDOWN in out.stdout


def test_tracer_keeps_the_usual_exit(tmp_path: Path) -> None:
    """Under a tracer (coverage, a debugger) or a profiler the process exits the usual way:
    ``main`` returns to its caller, so what they do after the command returns is done. The hook
    prints when it sees ``cli.main`` return (the teardown's ``__del__`` is no witness here: a
    tracer set changes what the teardown runs)."""
    run_dir = failed_local_run(tmp_path)
    hook = """
        def hook(frame, event, arg):
            code = frame.f_code
            if code.co_name == "main" and code.co_filename.endswith("cli.py"):
                if event == "return":
                    print("main returned", flush=True)
                return hook
            return None
        """
    for setter in ("sys.settrace(hook)", "sys.setprofile(hook)"):
        out = rankscope_process(["status", str(run_dir)], hook + setter + "\n")
        assert out.returncode == 0, out.stderr
        assert "main returned" in out.stdout, setter
        assert ATEXIT in out.stdout, setter


def test_process_without_stdout(tmp_path: Path) -> None:
    """Started with stdout closed (``>&-``: Python's stream is None): the status, the error line
    on stderr, no traceback (the flush before the exit skipped the missing stream)."""
    run_dir = failed_local_run(tmp_path)
    for argv, status in (([str(run_dir)], 0), ([str(tmp_path / "missing")], 1)):
        command = " ".join(
            [shlex.quote(sys.executable), "-m", "rankscope", "status"]
            + [shlex.quote(a) for a in argv]
        )
        done = subprocess.run(
            ["bash", "-c", command + " >&-"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == status, done.stderr
        assert "Traceback" not in done.stderr
        if status:
            assert "not found" in done.stderr
