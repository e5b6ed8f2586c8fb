"""Make this folder from ../param_dlrm_8rank: a real 8-rank NCCL trace whose communication
kernels are renamed to those of libraries that are not NCCL, as those libraries launch them.

On every rank, in stream order, the five ``ncclKernel_SendRecv_*`` kernels (TorchRec's
all-to-alls) become DeepEP's and NVSHMEM's, and the first ``ncclKernel_AllReduce_*`` becomes an
in-house kernel that only a user's ``--comm-kernel`` pattern names (RENAMES below). DeepEP,
NVSHMEM and in-house kernels are not launched through c10d: the CPU ops around each renamed
kernel's launch that c10d writes (``c10d::alltoall_base_`` / ``c10d::allreduce_``,
``record_param_comms``, ``nccl:all_to_all`` / ``nccl:all_reduce``) are removed, so no
``record_param_comms`` launches them. Nothing else changes: every duration and timestamp is the
real one, so the renamed kernels' time is known exactly (``renamed.json``, µs as in the trace).

Run from anywhere: ``python tests/data/deepep_nvshmem_8rank/make.py``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "param_dlrm_8rank"
#: Kernel names taken from the libraries' sources (docs/communication-kernels.md): DeepEP
#: csrc/kernels/intranode.cu and internode.cu (``dpsk::ep::`` is the namespace a DeepEP build
#: shows in a real H800 trace), NVSHMEM's on-stream all-to-all (src/host/coll/alltoall) and
#: PyTorch's NVSHMEM all-to-all (torch/csrc/distributed/c10d/symm_mem/nvshmem_extension.cu).
#: Argument lists are shortened; the analysis reads the qualified name.
SENDRECV_RENAMES = (
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, "
    "int*, int4 const*, float const*, long const*, float const*, bool const*, int const*, int, "
    "int, int, int, int, int, void**, int, int, int)",
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int const*, int*, int, int, "
    "int, bool const*, int*, int*, int, int, void**, int**, int)",
    "void deep_ep::internode::combine<false, 2, 8>(int4*, float*, bool const*, int4 const*, "
    "float const*, int const*, int const*, int, int, int, void*, int, int, void**, int, int)",
    "void dpsk::ep::internode::dispatch<false, 2, 8, 12>(int4*, float*, long*, float*, "
    "void*, int, int, int, int, void**, int, int, int)",
    "void alltoall_on_stream_kernel<signed char>(int, signed char*, signed char const*, "
    "unsigned long)",
)
#: The first all-reduce: an in-house kernel no built-in family knows (a user's pattern).
ALLREDUCE_RENAME = "void my_lab::ring_allreduce_kernel<float>(float*, float const*, int)"
#: CPU ops c10d writes around a collective's launch; removed around each renamed kernel's.
C10D_OPS = ("c10d::", "record_param_comms", "nccl:")


def rename(doc: dict) -> list[dict]:
    """Rename the kernels of one rank in place; returns what was renamed (name, dur in µs)."""
    events = doc["traceEvents"]
    kernels = sorted(
        (e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")),
        key=lambda e: e["ts"],
    )
    sendrecv = [k for k in kernels if "SendRecv" in k["name"]]
    allreduce = [k for k in kernels if "AllReduce" in k["name"]]
    assert len(sendrecv) == len(SENDRECV_RENAMES) and allreduce, "not the DLRM trace"
    renamed = []
    for kernel, name in [*zip(sendrecv, SENDRECV_RENAMES, strict=True), (allreduce[0], ALLREDUCE_RENAME)]:
        corr = kernel["args"]["correlation"]
        launch = next(
            e for e in events
            if e.get("cat") == "cuda_runtime" and e.get("args", {}).get("correlation") == corr
        )
        drop = {
            id(e) for e in events
            if e.get("ph") == "X" and e.get("tid") == launch["tid"] and e.get("pid") == launch["pid"]
            and e["name"].startswith(C10D_OPS) and e["ts"] <= launch["ts"] <= e["ts"] + e["dur"]
        }
        events[:] = [e for e in events if id(e) not in drop]
        kernel["name"] = name
        renamed.append({"name": name, "dur_us": kernel["dur"]})
    return renamed


def main() -> None:
    truth = {}
    for src in sorted(SOURCE.glob("worker*.json")):
        doc = json.loads(src.read_text())
        rank = int(doc["distributedInfo"]["rank"])
        truth[rank] = rename(doc)
        out = HERE / f"{src.name}.gz"
        with gzip.GzipFile(out, "wb", mtime=0) as f:  # mtime 0: the same bytes every time
            f.write(json.dumps(doc).encode())
    (HERE / "renamed.json").write_text(json.dumps(truth, indent=1) + "\n")


if __name__ == "__main__":
    main()
