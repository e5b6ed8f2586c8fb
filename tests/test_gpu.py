"""The CUDA/NCCL path on a real GPU machine: skipped without CUDA (the `gpu` marker).

What the CPU suite cannot show: the runtime records CUDA activity (kernels on streams), the ranks
talk NCCL, the merge classifies the NCCL kernels as communication and matches their collectives
across ranks through ``record_param_comms``, and the analysis finds GPU communication time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_ddp.py"


def test_nccl_run_merges_with_nccl_kernels_as_communication(tmp_path: Path) -> None:
    import torch
    from rankscope.analysis import analyze
    from rankscope.analysis.store.reader import open_store
    from rankscope.analysis.store.schema import EventKind

    nproc = min(2, torch.cuda.device_count())
    out = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "rankscope", "run", "--nproc-per-node", str(nproc),
         "--out", str(out), "--no-analyze", str(EXAMPLE), "--steps", "8"],
        capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = list(out.iterdir())
    with open_store(run_dir / "trace.h5") as store:
        assert store.ranks == list(range(nproc))
        meta = store.rank_meta(0)
        assert meta.get("backend") == "nccl"
        for rank in store.ranks:
            events = store.events(rank, columns=["name", "kind"])
            comm = events[events["kind"] == EventKind.KERNEL_COMM]
            assert len(comm) > 0, f"rank {rank}: no NCCL kernel classified as communication"
            assert comm["name"].astype(str).str.match(r"^nccl.*Kernel").all()
            assert (events["kind"] == EventKind.KERNEL_COMPUTE).any()
        colls = store.collectives()
        if nproc > 1:
            assert not colls.empty
            assert (colls.groupby("coll")["rank"].nunique() == nproc).all()
    whole = analyze(run_dir / "trace.h5").whole()
    assert (whole["comm_ns"] > 0).all(), whole
