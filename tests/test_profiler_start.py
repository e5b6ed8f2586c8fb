"""A window starts without importing torch's compiler (launchers/profiler.py): real torch, one
process (the checks run in order in a child, since an import cannot be undone)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

COMMON = textwrap.dedent(
    """
    import sys
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    from rankscope.launchers.profiler import make_profile

    def kw():
        return dict(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
        )

    def window(prof, inside=lambda: None):
        traces = []
        prof.on_trace_ready = lambda p: traces.append(len(p.events()))
        prof.start()
        for _ in range(3):
            torch.ones(8, 8) @ torch.ones(8, 8)
            prof.step()
            inside()
        prof.stop()
        return traces
    """
)
#: rankscope's profile: no compiler import; a job that turns inductor's CUDA graphs on inside a
#: window gets torch's answer when the window stops
OURS = """
ours = make_profile(**kw())
traces = window(ours)
assert traces and traces[0] > 0, traces  # the window recorded
assert "torch._dynamo" not in sys.modules and "torch._inductor" not in sys.modules
assert ours.has_cudagraphs is False
print("window without the compiler: ok")

def compile_with_cuda_graphs():
    import torch._inductor.config as inductor_config
    inductor_config.triton.cudagraphs = True

ours = make_profile(**kw())
window(ours, compile_with_cuda_graphs)
assert ours.has_cudagraphs is True
print("inductor in use: torch's answer: ok")
"""
#: the premise: torch's own profile imports the compiler when a window starts
TORCHS = """
window(profile(**kw()))
assert "torch._inductor" in sys.modules and "torch._dynamo" in sys.modules
print("torch's own imports it: ok")
"""


def _child(body: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", COMMON + body],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_a_window_starts_without_importing_the_compiler_and_keeps_torchs_answer() -> None:
    """torch's ``prepare_trace`` asks ``hasattr(torch, "_inductor")``, which imports
    ``torch._inductor`` and ``torch._dynamo`` (~2 s of CPU in every rank at its first window);
    rankscope's profile records the same window without them, and once the job has imported
    inductor, has torch's answer (``has_cudagraphs``) as torch's own profile would."""
    assert _child(TORCHS) == ["torch's own imports it: ok"]
    assert _child(OURS) == [
        "window without the compiler: ok",
        "inductor in use: torch's answer: ok",
    ]
