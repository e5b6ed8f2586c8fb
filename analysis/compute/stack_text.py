"""The stacks a rank writes when its Python threads cannot answer, read back as frames.

A rank stuck in C code that holds the GIL (a regular expression that backtracks for hours, a C
extension that never releases it) cannot run its hang probe's thread, so it writes no
``hang.json``. Two texts still say where it is:

* ``ranks/NNNNN/stacks.txt``: what :mod:`faulthandler` writes from C on the stack signal, every
  thread's Python frames, innermost first::

      Current thread 0x00007f8ee0c17b80 (most recent call first):
        File "/home/u/train.py", line 22 in stuck_in_c
        File "/home/u/train.py", line 34 in main

  The file is appended to on every signal: the last block of each thread is its latest.
* ``ranks/NNNNN/native-stacks.txt``: ``py-spy dump --native --full-filenames``, every thread
  with its name, Python and native frames mixed, innermost first::

      Thread 27753 (active+gil): "MainThread"
          sre_ucs1_match (libpython3.11.so.1.0)
          stuck_in_c (/home/u/train.py:22)
          0x7f8ee044524a (libc.so.6)

Both become what a rank's answer holds (``threads``: ``{"thread", "name", "frames"}``, frames
innermost last, each ``{file, line, function, native}``), so that the diagnosis places the rank
as it places one that answered. Which frames are the user's is the caller's to mark (the rule
is the rank's own: ``launchers/hang_probe.py``). Pure functions of text, no I/O.
"""

from __future__ import annotations

import re
from typing import Any

#: A faulthandler thread header: ``Current thread 0x… (most recent call first):``.
FAULTHANDLER_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9a-fA-F]+)")
#: A faulthandler frame: ``  File "/x/train.py", line 22 in main`` (the line may be ``???``).
FAULTHANDLER_FRAME = re.compile(
    r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<function>.*)$'
)
#: A py-spy thread header: ``Thread 27753 (active+gil): "MainThread"`` (the name may be absent).
PY_SPY_THREAD = re.compile(
    r'^Thread (?P<ident>0x[0-9a-fA-F]+|\d+)(?: \([^)]*\))?:?(?: "(?P<name>.*)")?'
)
#: A py-spy frame: ``    name (file:line)`` (Python, or native with debug information) or
#: ``    name (library.so)`` (native, no line).
PY_SPY_FRAME = re.compile(r"^\s+(?P<function>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
#: A native frame py-spy could not name (``0x7f8ee044524a``): no information, left out.
ADDRESS = re.compile(r"^0x[0-9a-fA-F]+$")
#: The thread ``threading`` starts: its outermost frame is this module's (the main thread's is
#: not, which is how a faulthandler dump, which names no thread, tells the main thread apart).
THREADING_MODULE = "threading.py"
#: Python source files (a frame of one is a Python frame; any other file is native code's).
PYTHON_SUFFIXES = (".py", ".pyw")


def _frame(file: str, line: str | None, function: str, native: bool) -> dict[str, Any]:
    return {
        "file": file,
        "line": int(line) if line and line.isdigit() else None,
        "function": function,
        "native": native,
        "user": False,
        "closure": False,
    }


def is_python_file(file: str) -> bool:
    """Whether a frame's file is Python source (``<frozen runpy>`` included), not a library or
    a C file of native code."""
    return file.startswith("<") or file.endswith(PYTHON_SUFFIXES)


def _main_first(threads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Name the main thread ``MainThread`` when the text did not (faulthandler): the one whose
    outermost frame is not ``threading``'s, the current one (the signal's) among several."""
    if any(t["name"] == "MainThread" for t in threads):
        return sorted(threads, key=lambda t: t["name"] != "MainThread")

    def started_by_threading(t: dict[str, Any]) -> bool:
        frames = t["frames"]
        return bool(frames) and str(frames[0]["file"]).endswith(THREADING_MODULE)

    candidates = [t for t in threads if t["frames"] and not started_by_threading(t)] or threads
    main = next((t for t in candidates if t.get("current")), candidates[0] if candidates else None)
    if main is not None:
        main["name"] = "MainThread"
    return sorted(threads, key=lambda t: t["name"] != "MainThread")


def parse_faulthandler(text: str) -> list[dict[str, Any]]:
    """The threads of a faulthandler dump (the latest block of each thread when the file holds
    several dumps), main thread first; frames innermost last."""
    latest: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for raw in text.splitlines():
        head = FAULTHANDLER_THREAD.match(raw)
        if head:
            current = {
                "thread": head["ident"],
                "name": "?",
                "current": head["current"] == "Current thread",
                "frames": [],
            }
            latest.pop(head["ident"], None)  # a later dump: re-inserted last
            latest[head["ident"]] = current
            continue
        frame = FAULTHANDLER_FRAME.match(raw)
        if frame and current is not None:
            line = None if frame["line"] == "???" else frame["line"]
            current["frames"].append(_frame(frame["file"], line, frame["function"], False))
    threads = list(latest.values())
    for t in threads:
        t["frames"].reverse()  # innermost last, as a rank's answer has them
    return [{k: v for k, v in t.items() if k != "current"} for t in _main_first(threads)]


def parse_py_spy(text: str) -> list[dict[str, Any]]:
    """The threads of ``py-spy dump`` (``--native`` or not), main thread first; frames
    innermost last, native ones marked (unnamed native addresses left out)."""
    threads: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for raw in text.splitlines():
        head = PY_SPY_THREAD.match(raw)
        if head:
            current = {"thread": head["ident"], "name": head["name"] or "?", "frames": []}
            threads.append(current)
            continue
        frame = PY_SPY_FRAME.match(raw)
        if frame and current is not None and not ADDRESS.match(frame["function"]):
            file = frame["file"]
            native = not is_python_file(file)
            current["frames"].append(_frame(file, frame["line"], frame["function"], native))
    for t in threads:
        t["frames"].reverse()
    return _main_first(threads)
