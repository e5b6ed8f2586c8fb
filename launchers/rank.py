"""Per-rank entry point: start the runtime, then run the user's script as ``__main__``.

``rankscope run`` launches every rank as ``python -m rankscope.launchers.rank SCRIPT ARGS…``.
Users who keep their own launcher insert the same module in their line::

    RANKSCOPE_RUN_DIR=runs/mine torchrun --nproc-per-node 4 -m rankscope.launchers.rank train.py --lr 3e-4
    srun … python -m rankscope.launchers.rank --run-dir runs/mine train.py --lr 3e-4

Options (before the script): ``--run-dir DIR`` (else :data:`rundir.ENV_RUN_DIR`), ``--module``
(the script is a module name, like ``python -m``), and the profiler schedule ``--wait``,
``--warmup``, ``--active``, ``--repeat``, ``--skip-first``, and ``--with-flops``,
``--samples-per-step N`` (each over :data:`rundir.ENV_PROFILER`'s value).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from rankscope.launchers import rundir
from rankscope.launchers.spec import ProfilerSettings, check_samples

USAGE = (
    "usage: python -m rankscope.launchers.rank [--run-dir DIR] [--module] [--wait N] [--warmup N] "
    "[--active N] [--repeat N] [--skip-first N] [--with-flops] [--samples-per-step N] "
    "SCRIPT [ARGS...]"
)
#: Schedule options accepted before the script (int-valued fields of ProfilerSettings).
SCHEDULE_OPTIONS = ("wait", "warmup", "active", "repeat", "skip_first")


def _parse(argv: list[str]) -> tuple[str | None, bool, dict[str, Any], list[str]]:
    """Split our leading options from the script and its arguments."""
    run_dir: str | None = None
    module = False
    schedule: dict[str, Any] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        opt, _, inline = argv[i].partition("=")
        key = opt.lstrip("-").replace("-", "_")
        if opt == "--module":
            module = True
            i += 1
            continue
        if opt == "--with-flops":
            schedule["with_flops"] = True
            i += 1
            continue
        if opt in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        if opt == "--":
            i += 1
            break
        if opt not in ("--run-dir", "--samples-per-step") and key not in SCHEDULE_OPTIONS:
            raise SystemExit(f"{USAGE}\nerror: unknown option {opt}")
        if inline:
            value = inline
            i += 1
        elif i + 1 < len(argv):
            value = argv[i + 1]
            i += 2
        else:
            raise SystemExit(f"{USAGE}\nerror: {opt} needs a value")
        if opt == "--run-dir":
            run_dir = value
        elif opt == "--samples-per-step":
            try:
                schedule[key] = check_samples(value, opt)
            except ValueError as exc:
                raise SystemExit(f"error: {exc}") from None
        else:
            try:
                schedule[key] = int(value)
            except ValueError:
                raise SystemExit(f"error: {opt} needs an integer, got {value!r}") from None
    rest = argv[i:]
    if not rest:
        raise SystemExit(f"{USAGE}\nerror: no script given")
    return run_dir, module, schedule, rest


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (torchrun stopping the ranks) → SystemExit, so windows in progress are flushed;
    first, the rank says where it was (its hang probe's answer, from the interrupted frame)."""
    from rankscope.launchers.hang_probe import answer_terminated
    from rankscope.launchers.runtime import Terminated

    answer_terminated(frame)

    raise Terminated(128 + signum)


def main(argv: list[str] | None = None) -> None:
    """Start the runtime and run the script; record its uncaught exception, then re-raise."""
    run_dir, module, schedule, rest = _parse(list(sys.argv[1:] if argv is None else argv))
    if run_dir is not None:
        os.environ[rundir.ENV_RUN_DIR] = str(Path(run_dir).resolve())
    if schedule:
        text = os.environ.get(rundir.ENV_PROFILER)
        base = ProfilerSettings.from_json(text).to_dict() if text else {}
        try:
            os.environ[rundir.ENV_PROFILER] = ProfilerSettings.from_dict(
                {**base, **schedule}
            ).to_json()
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
    if not os.environ.get(rundir.ENV_RUN_DIR):
        raise SystemExit(f"error: give --run-dir DIR or set {rundir.ENV_RUN_DIR}")

    from rankscope.launchers import runtime

    target, script_args = rest[0], rest[1:]
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    rt = runtime.start(target, script_args)
    sys.argv = [target, *script_args]
    if not module:
        sys.path[0] = str(Path(target).resolve().parent)
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0) and rt is not None:
            rt.record_error(exc)
        raise
    except BaseException as exc:
        if rt is not None:
            rt.record_error(exc)
        raise
    finally:
        if rt is not None:
            rt.close()


if __name__ == "__main__":
    main()
