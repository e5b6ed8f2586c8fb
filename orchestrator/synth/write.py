"""Write a synthetic job: :func:`generate` simulates a configuration and writes every rank's
trace (``rank-N.json.gz``) and ``truth.json``.

Files are written to a temporary name and renamed, gzipped with a fixed header: the same
configuration writes byte-identical files. Above both renderers (``render.py`` for data-parallel
jobs, ``parallel_render.py`` for tensor × pipeline × data parallel ones), so neither imports the
other's caller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankscope.orchestrator.synth.config import (
    RANK_FILE,
    RANK_FILE_PATTERN,
    TRUTH_FILE,
    SynthConfig,
)
from rankscope.orchestrator.synth.ddp import simulate
from rankscope.orchestrator.synth.render import base_time_ns, render_rank
from rankscope.orchestrator.synth.truth import truth


def write_gz(path: Path, text: bytes) -> None:
    """Write ``text`` gzipped with a fixed header (no name, mtime 0: byte-identical for the same
    config) to a temporary name, then rename it to ``path``."""
    import os
    import zlib

    comp = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    data = comp.compress(text) + comp.flush()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def generate(config: SynthConfig, out: Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Simulate ``config`` and write ``out/rank-N.json.gz`` for every rank and ``out/truth.json``.

    Deterministic: the same config (seed included) writes byte-identical files. Returns a
    summary ``{"events", "bytes", "files"}`` (parallel jobs add ``mean_step_ns`` and
    ``saving_ns`` / ``saving_pct``: the counterfactual without the faults). With ``overwrite``,
    earlier rank files and truth.json in ``out`` are removed first.
    """
    import json
    import os

    config.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for p in out.iterdir():
            if RANK_FILE_PATTERN.match(p.name) or p.name == TRUTH_FILE:
                p.unlink()
    base = base_time_ns(config)
    total_events = 0
    total_bytes = 0
    files = []
    summary: dict[str, Any] = {}
    if config.is_parallel():
        from rankscope.orchestrator.synth.parallel import simulate_parallel
        from rankscope.orchestrator.synth.parallel_render import render_parallel_rank
        from rankscope.orchestrator.synth.parallel_truth import parallel_truth

        pjob = simulate_parallel(config)
        texts = (render_parallel_rank(pjob, rank, base) for rank in range(config.ranks))
        result = parallel_truth(pjob)
        summary = {
            "mean_step_ns": result["mean_step_ns"],
            "saving_ns": result["counterfactual"]["saving_ns"],
            "saving_pct": result["counterfactual"]["saving_pct"],
        }
    else:
        job = simulate(config)
        texts = (render_rank(job, rank, base) for rank in range(config.ranks))
        result = truth(job)
    for rank, (text, events) in enumerate(texts):
        total_events += events
        total_bytes += len(text)
        path = out / RANK_FILE.format(rank=rank)
        write_gz(path, text)
        files.append(path)
    result["base_time_ns"] = base
    tmp = out / f".{TRUTH_FILE}.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out / TRUTH_FILE)
    return {"events": total_events, "bytes": total_bytes, "files": files, **summary}
