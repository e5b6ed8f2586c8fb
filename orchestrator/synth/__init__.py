"""``rankscope synth OUT_DIR``: a synthetic multi-GPU job's Kineto traces, with ground truth.

Physics first: the generator simulates a training job rank by rank in integer nanoseconds of a
true clock and writes what torch 2.x's profiler would write on each rank (``rank-N.json.gz``,
Kineto's JSON layout) plus ``truth.json``: the figures an analysis of those traces should
reproduce. It models the job, not any tool that reads the traces. Two kinds of jobs:

* **DDP** (:mod:`.ddp`): one process group, bucket all-reduces overlapping backward;
* **tensor x pipeline x data parallel / FSDP** (:mod:`.parallel`, with ``tp``, ``pp`` or
  ``fsdp``): Megatron-Core's rank order and process groups, a 1F1B or GPipe schedule with
  send/recv between stages, TP all-reduces in each layer, the DP gradient reduce-scatter and
  parameter all-gather, and faults with their counterfactual in the truth.

Modules: :mod:`.config` (the knobs), :mod:`.cli` (the command line), :mod:`.ddp`,
:mod:`.truth` and :mod:`.render` (the DDP job, its truth, the writer and :func:`generate`),
:mod:`.layout` (ranks and process groups), :mod:`.parallel` (the dependency-driven simulation),
:mod:`.parallel_render` and :mod:`.parallel_truth`. See docs/synth.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rankscope.orchestrator.synth.cli import config_from_args, configure, main
from rankscope.orchestrator.synth.config import (
    COMPUTE_STREAM,
    DATALOADER,
    NCCL_STREAM,
    NCCL_VERSION,
    RANK_FILE,
    RANK_FILE_PATTERN,
    RANKS_TRUNCATE,
    TRIMONTH_S,
    TRUTH_FILE,
    FaultClass,
    Schedule,
    SynthConfig,
)

# Imported here, before ``truth`` below is defined: importing a submodule sets the package's
# attribute of its name, so a later first import of ``.truth`` would replace the function.
from rankscope.orchestrator.synth.truth import clock_params, host_clock

if TYPE_CHECKING:
    from rankscope.orchestrator.synth.ddp import Job, nccl_kernel_name, transfer_ns
    from rankscope.orchestrator.synth.parallel import ParallelJob
    from rankscope.orchestrator.synth.render import base_time_ns, render_rank
    from rankscope.orchestrator.synth.write import generate

#: public name -> the module (inside this package) that defines it, loaded on first use: the
#: ``rankscope`` command imports this package for ``synth``'s parser (every ``--help``), and the
#: generator's modules import numpy (docs/architecture.md, "Deferred imports").
_LAZY: dict[str, str] = {
    "Job": "ddp",
    "nccl_kernel_name": "ddp",
    "transfer_ns": "ddp",
    "base_time_ns": "render",
    "render_rank": "render",
    "generate": "write",
}

__all__ = [
    "COMPUTE_STREAM",
    "DATALOADER",
    "NCCL_STREAM",
    "NCCL_VERSION",
    "RANKS_TRUNCATE",
    "RANK_FILE",
    "RANK_FILE_PATTERN",
    "TRIMONTH_S",
    "TRUTH_FILE",
    "FaultClass",
    "Job",
    "Schedule",
    "SynthConfig",
    "base_time_ns",
    "clock_params",
    "config_from_args",
    "configure",
    "generate",
    "host_clock",
    "main",
    "nccl_kernel_name",
    "render_rank",
    "simulate",
    "transfer_ns",
    "truth",
]


def simulate(config: SynthConfig) -> Any:
    """Simulate ``config`` on the true clock (no files): a DDP :class:`Job`, or a
    :class:`~.parallel.ParallelJob` for tensor / pipeline parallel and FSDP jobs."""
    if config.is_parallel():
        from rankscope.orchestrator.synth.parallel import simulate_parallel

        return simulate_parallel(config)
    from rankscope.orchestrator.synth.ddp import simulate as simulate_ddp

    return simulate_ddp(config)


def truth(job: Job | ParallelJob) -> dict[str, Any]:
    """Ground truth of a simulated job (docs/synth.md, "truth.json")."""
    from rankscope.orchestrator.synth.ddp import Job

    if isinstance(job, Job):
        from rankscope.orchestrator.synth.truth import truth as ddp_truth

        return ddp_truth(job)
    from rankscope.orchestrator.synth.parallel_truth import parallel_truth

    return parallel_truth(job)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
