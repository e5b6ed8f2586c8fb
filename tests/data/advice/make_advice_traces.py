"""Make the advice rules' positive cases that no real trace here has (tests/test_advice.py).

``a100_fp32/rank-0.json.gz``: the real A100 trace ``hta/nccl_parser_config/nccl_data.json.gz``
(compute capability 8.0, its GEMMs on TF32 tensor cores) with every CUTLASS TF32 GEMM kernel
renamed to the cuBLAS FP32 SIMT kernel of the same tile and layout — what the same model runs
with ``torch.backends.cuda.matmul.allow_tf32 = False`` (torch's default since 1.12):
``void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(…)`` becomes
``ampere_sgemm_256x64_nn``. Times, streams, steps and everything else are the real ones (the
kernels keep their TF32 durations: the rule reads names and the device, not speeds); the
renamed events' ``args`` are untouched.

``dlrm_pinned_sync/rank-0.json.gz``: rank 0 of the real V100 DLRM job
``param_dlrm_8rank/worker0_*.json`` with its host-to-device copies from pageable memory renamed
as copies from pinned memory (``Memcpy HtoD (Pageable -> Device)`` becomes
``Memcpy HtoD (Pinned -> Device)``, in the name and the ``args``' memory kinds where present).
In the real trace each of those copies is a ``cudaMemcpyAsync`` followed at once by a
``cudaStreamSynchronize`` on the same thread — the calls PyTorch's ``tensor.to(device)``
makes without ``non_blocking=True`` for a pinned tensor too (``copy_kernel_cuda``: copy
asynchronously, then synchronise the stream when not non-blocking). So the result is what the same
job records with ``pin_memory=True`` and no ``non_blocking``; its own five pinned copies (made
with ``non_blocking=True``: no synchronisation follows) and everything else are unchanged.

Run from the repository root: ``python tests/data/advice/make_advice_traces.py``.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

HERE = Path(__file__).parent
SOURCE = HERE.parent / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
TARGET = HERE / "a100_fp32" / "rank-0.json.gz"
DLRM = HERE.parent / "param_dlrm_8rank" / "worker0_step_12.1694128201545.pt.trace.json"
PINNED_TARGET = HERE / "dlrm_pinned_sync" / "rank-0.json.gz"
#: A CUTLASS TF32 GEMM kernel name: its tile and layout.
TF32_GEMM = re.compile(r"cutlass_80_tensorop_s1688gemm_(\d+x\d+)_\d+x\d+_(\w\w)_align\d")


def fp32_name(name: str) -> str:
    """The cuBLAS FP32 SIMT name of a CUTLASS TF32 GEMM (unchanged for any other kernel)."""
    m = TF32_GEMM.search(name)
    return f"ampere_sgemm_{m.group(1)}_{m.group(2)}" if m else name


def main() -> None:
    doc = json.loads(gzip.decompress(SOURCE.read_bytes()))
    renamed = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            new = fp32_name(str(e.get("name", "")))
            renamed += new != e["name"]
            e["name"] = new
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    print(f"{TARGET}: {renamed} kernels renamed")
    pinned_sync()


def pinned_sync() -> None:
    """The DLRM rank with its pageable host-to-device copies made pinned ones."""
    doc = json.loads(DLRM.read_text())
    renamed = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "gpu_memcpy" and "(Pageable -> Device)" in str(e.get("name", "")):
            e["name"] = str(e["name"]).replace("(Pageable -> Device)", "(Pinned -> Device)")
            renamed += 1
    PINNED_TARGET.parent.mkdir(parents=True, exist_ok=True)
    PINNED_TARGET.write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    print(f"{PINNED_TARGET}: {renamed} copies renamed")


if __name__ == "__main__":
    main()
