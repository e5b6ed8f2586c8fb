"""Communication kernels that are not NCCL's (issue 28, item 2): DeepEP, NVSHMEM, a user's own.

Known truth: ``tests/data/deepep_nvshmem_8rank`` is the real 8-rank DLRM trace of
``param_dlrm_8rank`` with five NCCL all-to-all kernels per rank renamed to DeepEP's and NVSHMEM's
names and one all-reduce to an in-house name, their c10d launch ops removed (its ``make.py``;
``renamed.json`` lists the renamed kernels and their real durations). The kernels are the same
ones, so with every renamed kernel known as communication each rank's breakdown must equal the
original's to the ns, and the renamed kernels' time is exactly what the report calls "not
matched".
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rankscope.analysis.compute.finding import FindingKind
from rankscope.analysis.conclude.findings import findings
from rankscope.analysis.engine.driver import Analysis, analyze
from rankscope.analysis.engine.scheduler import SYNCHRONOUS, ClusterSpec
from rankscope.analysis.store.reader import open_store
from rankscope.analysis.store.schema import EventKind
from rankscope.orchestrator.ingest.comm_kernels import (
    COMM_KERNEL_FAMILIES,
    DEFAULT_VOCABULARY,
    ENV_CONFIG,
    CommLibrary,
    CommVocabulary,
)
from rankscope.orchestrator.ingest.merge import merge_run_dir

DATA = Path(__file__).parent / "data"
RENAMED = DATA / "deepep_nvshmem_8rank"
ORIGINAL = DATA / "param_dlrm_8rank"
#: The in-house kernel's namespace: only a user's pattern makes it communication.
USER_PATTERN = "my_lab::"
#: Breakdown columns that must not move when the renamed kernels are known as communication.
COLUMNS = ["rank", "total_ns", "compute_ns", "comm_ns", "comm_overlapped_ns", "comm_exposed_ns"]


def _truth() -> dict[int, list[dict[str, Any]]]:
    return {int(r): v for r, v in json.loads((RENAMED / "renamed.json").read_text()).items()}


def _ns(items: list[dict[str, Any]], *, user: bool) -> int:
    """Summed duration (ns) of the renamed kernels, with or without the in-house one."""
    return sum(k["dur_us"] * 1000 for k in items if user or USER_PATTERN not in k["name"])


@pytest.fixture(scope="module")
def analyses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Analysis]:
    """The original, the renamed with the built-in vocabulary, and with the user's pattern."""
    work = tmp_path_factory.mktemp("comm")
    shutil.copytree(ORIGINAL, work / "orig")
    (work / "ren").mkdir()
    for f in RENAMED.glob("*.json.gz"):
        shutil.copy2(f, work / "ren" / f.name)
    spec = ClusterSpec(scheduler=SYNCHRONOUS)
    stores = {
        "orig": merge_run_dir(work / "orig", output=work / "orig.h5", cluster=spec, quiet=True),
        "ren": merge_run_dir(
            work / "ren", output=work / "ren.h5", cluster=spec, quiet=True, comm=DEFAULT_VOCABULARY
        ),
        "user": merge_run_dir(
            work / "ren",
            output=work / "user.h5",
            cluster=spec,
            quiet=True,
            comm=CommVocabulary((USER_PATTERN,)),
        ),
    }
    return {k: analyze(v, spec) for k, v in stores.items()}


def _whole(a: Analysis) -> Any:
    b = a.breakdown
    return b[b["step"] == -1][COLUMNS].sort_values("rank").reset_index(drop=True)


def test_renamed_kernels_are_communication_to_the_ns(analyses: dict[str, Analysis]) -> None:
    """With every renamed kernel known as communication, 0 ns moves from communication to
    compute: each rank's breakdown, and HTA's numbers, equal the original NCCL trace's."""
    orig, user = analyses["orig"], analyses["user"]
    assert _whole(user).equals(_whole(orig)), (_whole(user), _whole(orig))
    h = ["rank", "compute_ns", "comm_union_ns", "idle_ns"]
    assert (
        user.hta[h]
        .sort_values("rank")
        .reset_index(drop=True)
        .equals(orig.hta[h].sort_values("rank").reset_index(drop=True))
    )
    with open_store(user.path) as s:
        for rank, items in _truth().items():
            ev = s.events(rank)
            comm = set(ev.loc[ev["kind"] == int(EventKind.KERNEL_COMM), "name"].astype(str))
            assert {k["name"] for k in items} <= comm


def test_built_in_vocabulary_leaves_only_the_in_house_kernel_as_compute(
    analyses: dict[str, Analysis],
) -> None:
    """DeepEP's and NVSHMEM's names are known without configuration: the compute the renamed
    trace shows beyond the original comes from the in-house kernel alone (at most its time; less
    where it ran beside a compute kernel)."""
    orig, ren = _whole(analyses["orig"]), _whole(analyses["ren"])
    for rank, items in _truth().items():
        in_house = _ns(items, user=True) - _ns(items, user=False)
        extra = int(ren.loc[rank, "compute_ns"] - orig.loc[rank, "compute_ns"])
        assert 0 < extra <= in_house, (rank, extra, in_house)


def test_unmatched_communication_is_said_in_one_line(analyses: dict[str, Analysis]) -> None:
    """No record_param_comms launches the renamed kernels: they are in no collective, and the
    report says how much time that is, over which ranks, in ms, exactly."""
    truth = _truth()
    for key, user in (("ren", False), ("user", True)):
        a = analyses[key]
        u = a.unmatched_comm.sort_values("rank").reset_index(drop=True)
        assert u["rank"].tolist() == sorted(truth)
        assert u["dur_ns"].tolist() == [_ns(truth[r], user=user) for r in sorted(truth)]
        assert u["kernels"].tolist() == [len(truth[r]) - (not user) for r in sorted(truth)]
        (f,) = [f for f in findings(a) if f.kind == FindingKind.UNMATCHED_COMM]
        total_ms = sum(_ns(v, user=user) for v in truth.values()) / 1e6
        assert f.figures["unmatched_ms"] == round(total_ms, 6)
        assert f"{total_ms:.3f} ms of communication kernels on ranks 0–7" in f.text
        assert "\n" not in f.text and "record_param_comms" in f.text
    # the original's NCCL kernels are all matched: nothing to say
    assert analyses["orig"].unmatched_comm["kernels"].sum() == 0
    assert not [f for f in findings(analyses["orig"]) if f.kind == FindingKind.UNMATCHED_COMM]


#: (kernel name as Kineto writes it, its library; None: not communication).
NAMES = [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "NCCL/RCCL"),
    (
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "NCCL/RCCL",
    ),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "NCCL/RCCL"),
    ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*)", "DeepEP"),
    ("void deep_ep::internode::combine<false, 2, 8>(int4*)", "DeepEP"),
    ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*)", "DeepEP"),
    ("void dpsk::ep::internode::notify_dispatch<true, 8>(int const*)", "DeepEP"),
    (
        "void alltoall_on_stream_kernel<float>(int, float*, float const*, unsigned long)",
        "NVSHMEM",
    ),
    ("c10d::nvshmem_extension::allToAllV(void*, void*, long*, unsigned long, int)", "NVSHMEM"),
    ("void allreduce8<(Op)0, __half>(__half*, __half*, __half*)", "MSCCL++"),
    (
        "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*)",
        "vLLM custom all-reduce",
    ),
    (
        "void vllm::cross_device_reduce_2stage<float, 4>(vllm::RankData*)",
        "vLLM custom all-reduce",
    ),
    (
        "void tensorrt_llm::kernels::oneShotAllReduceKernel<half, 8>(AllReduceParams)",
        "TensorRT-LLM all-reduce",
    ),
    (
        "void userbuffers_fp16_sum_inplace_gpu_rr_rs<8>(int, int, int, int, int, int, void**)",
        "userbuffers",
    ),
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)", None),
    ("void deep_ep::internode::get_dispatch_layout<256, 32, 8>(long const*, int*)", None),
    ("ampere_sgemm_128x64_nn", None),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor>()", None),
]


@pytest.mark.parametrize(("name", "library"), NAMES)
def test_vocabulary_names_each_library(name: str, library: str | None) -> None:
    """Names as Kineto writes them (demangled signatures), from each library's sources; only
    NCCL's are collectives the merge matches across ranks."""
    v = DEFAULT_VOCABULARY
    assert v.library(name) == library
    assert v.is_comm(name) == (library is not None)
    assert v.is_collective(name) == (library == CommLibrary.NCCL)


def test_every_family_cites_its_source_and_compiles() -> None:
    import re

    assert {f.library for f in COMM_KERNEL_FAMILIES} == set(CommLibrary) - {CommLibrary.USER}
    for f in COMM_KERNEL_FAMILIES:
        assert f.source and re.compile(f.pattern)


def _rankscope(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "rankscope", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    return proc.returncode, proc.stdout + proc.stderr


def _unmatched(summary: Path) -> dict[str, float]:
    doc = json.loads(summary.read_text())
    (f,) = [f for f in doc["findings"] if f["kind"] == "unmatched_comm"]
    return dict(f["figures"])


def test_user_patterns_from_the_flag_and_the_config_file(tmp_path: Path) -> None:
    """``--comm-kernel REGEX`` and the config file's ``comm_kernels`` make a kernel
    communication; a store merged with other patterns is merged again."""
    run = tmp_path / "ren"
    run.mkdir()
    for f in RENAMED.glob("*.json.gz"):
        shutil.copy2(f, run / f.name)
    truth = _truth()
    summary = tmp_path / "s.json"
    sync = ("--scheduler", "synchronous", "--json", str(summary))
    rc, out = _rankscope("analyze", str(run), "--comm-kernel", USER_PATTERN, *sync)
    assert rc == 0, out
    assert _unmatched(summary)["kernels"] == sum(len(v) for v in truth.values())
    config = tmp_path / "rankscope.toml"
    config.write_text(f'comm_kernels = ["{USER_PATTERN}"]\n')
    rc, out = _rankscope("analyze", str(run), *sync, env={ENV_CONFIG: str(config)})
    assert rc == 0 and "merging again" not in out, out  # the same patterns: the store is reused
    assert _unmatched(summary)["kernels"] == sum(len(v) for v in truth.values())
    rc, out = _rankscope("analyze", str(run), *sync, env={ENV_CONFIG: str(tmp_path / "none.toml")})
    assert rc != 0 and out.strip().count("\n") == 0 and "none.toml" in out, out
    rc, out = _rankscope("analyze", str(run), *sync)
    assert rc == 0 and "merged with other --comm-kernel patterns" in out, out
    assert _unmatched(summary)["kernels"] == sum(len(v) - 1 for v in truth.values())


def test_a_bad_pattern_is_one_line(tmp_path: Path) -> None:
    rc, out = _rankscope("merge", str(RENAMED), "--comm-kernel", "(", "-o", str(tmp_path / "x.h5"))
    assert rc == 2 and out.strip().count("\n") == 0 and "--comm-kernel" in out, out
    config = tmp_path / "c.toml"
    config.write_text('comm_kernels = "my_lab"\n')
    rc, out = _rankscope(
        "merge", str(RENAMED), "-o", str(tmp_path / "x.h5"), env={ENV_CONFIG: str(config)}
    )
    assert rc != 0 and out.strip().count("\n") == 0 and "c.toml" in out, out
    assert not (tmp_path / "x.h5").exists()
