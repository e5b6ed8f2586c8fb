"""The advice (analysis/conclude/advice.py, docs/advice.md): each rule fires on a trace that has
its problem and not on one that does not, and every report starts with "What to do".

Positive and negative cases are real traces (tests/data: a V100 DLRM job with FP32 SIMT GEMMs and
pageable copies, an A100 job on TF32 tensor cores, CPU gloo jobs), one generated from a real
trace (tests/data/advice: the A100 job with its GEMMs renamed to FP32 SIMT ones) and synthetic
jobs with a known fault (``rankscope synth``: DataLoader time, GC pauses).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from analysis_frames import merged
from rankscope.analysis.compute.finding import Finding, FindingKind, Severity
from rankscope.analysis.compute.kernel_names import Precision, precision
from rankscope.analysis.conclude.advice import (
    NOT_ESTIMATED,
    Advice,
    BottleneckClass,
    Rule,
    advice,
    ranked,
)
from rankscope.analysis.conclude.advice_rules import exposed_communication, low_headroom
from rankscope.analysis.engine.driver import Analysis, ClusterSpec, analyze
from rankscope.analysis.render.report import print_summary, render_html
from rankscope.analysis.render.summary_json import summary
from rankscope.analysis.store.devices import CAPABILITY_ATTR
from rankscope.analysis.store.reader import open_store
from rich.console import Console

#: The stores the rules are checked on (tests/data/<name>).
STORES = (
    "param_dlrm_8rank",
    "hta/nccl_parser_config",
    "advice/a100_fp32",
    "advice/dlrm_pinned_sync",
    "hta/trace_filter_2rank",
    "cpu_gloo_4rank_straggler",
)


def _analyze(path: Path) -> Analysis:
    return analyze(path, ClusterSpec(scheduler="synchronous"))


@pytest.fixture(scope="module")
def stores(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("advice")
    return {name: merged(data_dir, name, out) for name in STORES}


@pytest.fixture(scope="module")
def analyses(stores: dict[str, Path]) -> dict[str, Analysis]:
    return {name: _analyze(path) for name, path in stores.items()}


def _synth(folder: Path, **faults: object) -> Analysis:
    """A 4-rank ``rankscope synth`` job with ``faults`` (SynthConfig fields), analysed."""
    from rankscope.analysis.engine.scheduler import SYNCHRONOUS
    from rankscope.orchestrator.ingest.merge import merge_run_dir
    from rankscope.orchestrator.synth import SynthConfig, generate

    generate(SynthConfig(ranks=4, steps=3, seed=3, **faults), folder)  # type: ignore[arg-type]
    return _analyze(Path(merge_run_dir(folder, quiet=True, scheduler=SYNCHRONOUS)))


def _rules(a: Analysis) -> list[Rule]:
    return [i.rule for i in advice(a)]


def test_kernel_names_say_their_precision() -> None:
    # names seen in tests/data (V100 DLRM, A100 nccl_parser_config) and in the synth's GEMMs
    assert precision("volta_sgemm_128x32_nt") is Precision.FP32_SIMT
    assert (
        precision("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 8, 9, false>") is Precision.FP32_SIMT
    )
    assert (
        precision("void cudnn::detail::implicit_convolve_sgemm<float, float>")
        is Precision.FP32_SIMT
    )
    tf32 = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x5_tn_align4>(x)"
    assert precision(tf32) is Precision.TENSOR_TF32
    assert (
        precision("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32")
        is Precision.TENSOR_TF32
    )
    assert (
        precision("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32")
        is Precision.TENSOR_TF32
    )
    assert precision("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8") is Precision.FP32_SIMT
    assert precision("volta_h884gemm_64x64_ldg8_nn") is Precision.TENSOR_HALF
    assert precision("ampere_bf16_s16816gemm_bf16_128x64") is Precision.TENSOR_HALF
    # matrix-vector and elementwise kernels are no GEMM the rule could move to tensor cores
    assert precision("void gemv2T_kernel_val<int, int, float, float>") is Precision.UNKNOWN
    assert (
        precision("void at::native::vectorized_elementwise_kernel<4, float>") is Precision.UNKNOWN
    )


def test_the_store_keeps_the_compute_capability(
    stores: dict[str, Path], analyses: dict[str, Analysis]
) -> None:
    with open_store(stores["hta/nccl_parser_config"]) as s:
        rank = s.ranks[0]
        # the A100 node's eight GPUs, each 8.0
        assert s.rank_meta(rank)[CAPABILITY_ATTR] == {str(i): [8, 0] for i in range(8)}
    assert set(analyses["param_dlrm_8rank"].capability.values()) == {(7, 0)}
    assert analyses["param_dlrm_8rank"].capability.keys() == set(range(8))
    assert analyses["cpu_gloo_4rank_straggler"].capability == {}


def test_fp32_matmul_fires_with_the_fix_of_the_gpu_generation(
    analyses: dict[str, Analysis],
) -> None:
    # real V100 (7.0, FP16 tensor cores, no TF32): volta_sgemm / gemmSN kernels -> autocast fp16
    (v100,) = [i for i in advice(analyses["param_dlrm_8rank"]) if i.rule is Rule.FP32_MATMUL]
    assert v100.bottleneck is BottleneckClass.COMPUTE
    assert "torch.float16" in v100.fix and "GradScaler" in v100.fix
    assert v100.ranks == tuple(range(8))
    assert v100.figures["compute_major"] == 7
    assert 0 < v100.figures["fp32_kernel_share"] <= 1
    assert v100.gain == NOT_ESTIMATED
    # generated A100 (8.0) with FP32 SIMT GEMMs -> TF32
    (a100,) = [i for i in advice(analyses["advice/a100_fp32"]) if i.rule is Rule.FP32_MATMUL]
    assert "allow_tf32" in a100.fix and a100.figures["compute_major"] == 8
    assert "ampere_sgemm_" in a100.seen


def test_fp32_matmul_does_not_fire_on_tensor_cores_or_cpu(analyses: dict[str, Analysis]) -> None:
    # the same A100 trace as it was recorded: its GEMMs ran TF32 on tensor cores
    assert Rule.FP32_MATMUL not in _rules(analyses["hta/nccl_parser_config"])
    assert Rule.FP32_MATMUL not in _rules(analyses["cpu_gloo_4rank_straggler"])


def test_pageable_copies_fire_only_where_there_are_some(analyses: dict[str, Analysis]) -> None:
    (paged,) = [i for i in advice(analyses["param_dlrm_8rank"]) if i.rule is Rule.PAGEABLE_COPY]
    assert paged.bottleneck is BottleneckClass.INPUT
    assert "pin_memory=True" in paged.fix and "non_blocking=True" in paged.fix
    assert paged.figures["pageable_htod_copies"] > 0
    # the A100 trace copies device to device only; the synth's batches are pinned
    assert Rule.PAGEABLE_COPY not in _rules(analyses["hta/nccl_parser_config"])


def test_dataloader_stall_fires_with_the_what_if_gain(tmp_path: Path) -> None:
    stalled = _synth(tmp_path / "slow", input_ms=3.0, slow_input=[(1, 20.0)])
    (item,) = [i for i in advice(stalled) if i.rule is Rule.DATALOADER_STALL]
    assert item.bottleneck is BottleneckClass.INPUT and "num_workers" in item.fix
    assert item.gain_ms is not None and item.gain_ms > 0
    assert item.gain_source == "no input stall"
    # truth: rank 1 waits 3 + 20 ms per step for its batch, the others 3 ms; every step waits
    # for rank 1, so taking the stalls out saves about its 23 ms, never more
    assert item.figures["worst_rank"] == 1
    assert 15.0 <= item.gain_ms <= 23.0 * 1.05
    fed = _synth(tmp_path / "fed", input_ms=0.0)
    assert Rule.DATALOADER_STALL not in _rules(fed)


def test_gc_pauses_fire_on_collections_and_not_without(tmp_path: Path) -> None:
    # a parallel job's fault in the synth (tensor parallel 2 x data parallel 2)
    paused = _synth(tmp_path / "gc", tp=2, gc_pause=[(2, 30.0, 1.0)])
    (item,) = [i for i in advice(paused) if i.rule is Rule.GC_PAUSES]
    assert item.bottleneck is BottleneckClass.FRAMEWORK and "gc.freeze()" in item.fix
    assert item.ranks == (2,)
    assert item.figures["gc_ms_per_step"] == pytest.approx(30.0, rel=0.05)
    assert Rule.GC_PAUSES not in _rules(_synth(tmp_path / "nogc", tp=2))


def test_exposed_communication_fires_on_a_job_that_waits_for_its_all_reduce(
    analyses: dict[str, Analysis],
) -> None:
    # gloo on CPU: the main thread blocks in every bucket's all-reduce, beyond its waits
    (item,) = [
        i for i in advice(analyses["cpu_gloo_4rank_straggler"]) if i.rule is Rule.EXPOSED_COMM
    ]
    assert item.bottleneck is BottleneckClass.SYSTEM and "bucket_cap_mb" in item.fix
    # hiding transfers saves at most the exposed transfers of a rank per step (the replay frees
    # the waiting collectives' transfers too: 31.4 ms of "gain" for 16.2 ms of transfers once)
    assert item.gain_ms is not None and item.gain_ms > 0
    assert item.gain_ms <= item.figures["exposed_transfer_ms_per_step_max"] + 1e-9
    # one rank of an A100 job has no collective to replay: no what-if, so nothing estimated
    only = [i for i in advice(analyses["hta/nccl_parser_config"]) if i.rule is Rule.EXPOSED_COMM]
    assert all(i.gain == NOT_ESTIMATED for i in only)


def test_the_gain_of_hiding_transfers_is_never_more_than_the_transfers() -> None:
    """Two ranks, 4 steps of 100 ms, 10 ms (rank 0) and 6 ms (rank 1) of exposed transfer per
    step, no waiting; a replay that frees more (30 ms per step: it also freed what waited) is
    capped at the largest transfer time of a rank per step, 10 ms, its share scaled with it."""
    import pandas as pd
    from rankscope.analysis.compute.whatif_scenarios import COMM_OVERLAPPED

    ms = 1_000_000
    breakdown = pd.DataFrame(
        {
            "rank": [0] * 4 + [1] * 4,
            "step": list(range(4)) * 2,
            "total_ns": [100 * ms] * 8,
            "comm_exposed_ns": [10 * ms] * 4 + [6 * ms] * 4,
        }
    )
    totals = pd.DataFrame({"rank": [0, 1], "comm_wait_ns": [0, 0]})
    whatif = pd.DataFrame(
        {"scenario": [COMM_OVERLAPPED], "rank": [-1], "saving_ns": [30 * ms], "saving_pct": [30.0]}
    )
    (item,) = exposed_communication(breakdown, totals, whatif)
    assert item.gain_ms == pytest.approx(10.0)
    assert item.gain_share == pytest.approx(0.10)
    assert item.figures["exposed_transfer_ms_per_step"] == pytest.approx(8.0)


def test_low_headroom_advice_comes_from_the_memory_finding() -> None:
    low = Finding(
        kind=FindingKind.LOW_MEMORY_HEADROOM,
        severity=Severity.PROBLEM,
        rank=3,
        headline="Low memory headroom: rank 3 (cuda:0)",
        evidence="peak reserved 78.0 GiB of 80.0 GiB (2.5% left)",
        figures={"headroom_share": 0.025},
    )
    (item,) = low_headroom([low])
    assert item.bottleneck is BottleneckClass.MEMORY and "checkpoint" in item.fix
    assert item.ranks == (3,) and "2.5% left" in item.seen
    fine = Finding(kind=FindingKind.NO_MEMORY_LEAK, severity=Severity.OK, rank=None)
    assert low_headroom([fine]) == []


def test_most_valuable_first() -> None:
    def item(rule: Rule, size: float, gain: float | None) -> Advice:
        return Advice(rule, BottleneckClass.SYSTEM, "h", "s", "f", size_ms=size, gain_ms=gain)

    items = [
        item(Rule.GC_PAUSES, 50.0, None),
        item(Rule.EXPOSED_COMM, 1.0, 2.0),
        item(Rule.DATALOADER_STALL, 9.0, 8.0),
        item(Rule.PAGEABLE_COPY, 0.1, None),
    ]
    assert [i.rule for i in ranked(items)] == [
        Rule.DATALOADER_STALL,
        Rule.EXPOSED_COMM,
        Rule.GC_PAUSES,
        Rule.PAGEABLE_COPY,
    ]


def test_every_report_starts_with_what_to_do(analyses: dict[str, Analysis]) -> None:
    a = analyses["param_dlrm_8rank"]
    items = advice(a)
    assert items
    buf = io.StringIO()
    print_summary(a, Console(file=buf, width=200))
    text = buf.getvalue()
    assert text.lstrip().startswith("What to do")
    # and the summary ends by pointing back at the first item
    last = " ".join(text.strip().splitlines()[-1].split())
    assert last.startswith("What to do first:") and items[0].headline in " ".join(
        text.split()[-60:]
    )
    for i in items:
        assert " ".join(i.fix.split())[:40] in " ".join(text.split())
    page = render_html(a)
    assert page.index("What to do") < page.index("Where the time went")
    doc = summary(a)
    keys = list(doc)
    assert keys.index("advice") == keys.index("ranks_present") + 1  # before every table
    assert [d["rule"] for d in doc["advice"]] == [str(i.rule) for i in items]
    json.dumps(doc["advice"])  # plain JSON: no numpy scalars
    first = doc["advice"][0]
    assert set(first) >= {"class", "seen", "fix", "gain_ms", "gain_source"}


def test_a_straggler_is_advised_with_its_what_if_gain(analyses: dict[str, Analysis]) -> None:
    # rank 2 of cpu_gloo_4rank_straggler busy-computes 20 ms more every step (tests/data/README.md)
    (item,) = [i for i in advice(analyses["cpu_gloo_4rank_straggler"]) if i.rule is Rule.STRAGGLER]
    assert item.ranks == (2,) and item.bottleneck is BottleneckClass.COMPUTE
    assert item.gain_ms is not None and 0 < item.gain_ms <= 20.0 * 1.5
    assert item.gain_source == "if rank 2 ran like the median rank"
    # the balanced GPU job has none
    assert Rule.STRAGGLER not in _rules(analyses["param_dlrm_8rank"])


def test_waiting_for_a_rank_is_not_advised_as_communication_to_hide(
    analyses: dict[str, Analysis],
) -> None:
    # the DLRM job's communication with nothing else running is its ranks waiting in the
    # all-to-alls for a later rank: no transfer that overlap could hide
    a = analyses["param_dlrm_8rank"]
    exposed = a.breakdown[a.breakdown["step"] >= 0]["comm_exposed_ns"].sum()
    assert exposed > 0.01 * a.breakdown[a.breakdown["step"] >= 0]["total_ns"].sum()
    assert Rule.EXPOSED_COMM not in _rules(a)


# -- how the host feeds the GPU: launch-bound ranks, blocking pinned copies ------------------

US = 1000  # ns per µs


def _fed_rank() -> tuple[object, object]:
    """One rank, µs (stored in ns): five 2 µs kernels on stream 7, each launched by a 10 µs
    cudaLaunchKernel starting 20 µs after the previous one (so each kernel waits for its launch);
    a 30 µs NCCL kernel on stream 20 launched before the GPU ran dry; a DataLoader __next__ on the
    loop's thread over the end of step 0; step 1's kernel launched after it.

    GPU events: [12,14) [32,34) [40,70) [52,54) [72,74) [92,94) [212,214); the whole GPU's gaps:
    [14,32) host wait (k1 launched at 20 > 14), [34,40) not (the NCCL kernel was launched at
    30), [70,72) not (k3 at 60), [74,92) host wait (k4 at 80), [94,212) host wait (launched at
    205), 105 µs of it inside the DataLoader [100,205). Step windows [12,212) and [212,214)."""
    from analysis_frames import GPU_LANES, LOADER, events, lanes
    from rankscope.analysis.store.schema import EventKind as K

    rows: list[tuple[object, ...]] = [
        (0, 200 * US, "ProfilerStep#0", K.PROFILER_STEP, 0, 0),
        (200 * US, 100 * US, "ProfilerStep#1", K.PROFILER_STEP, 0, 1),
        (100 * US, 105 * US, LOADER, K.USER_ANNOTATION, 0, 0),
        (30 * US, 5 * US, "cudaLaunchKernel", K.RUNTIME, 0, 0, 100),
        (40 * US, 30 * US, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", K.KERNEL_COMM, 2, 0, 100),
        (205 * US, 5 * US, "cudaLaunchKernel", K.RUNTIME, 0, 1, 50),
        (212 * US, 2 * US, "void add_kernel<float>()", K.KERNEL_COMPUTE, 1, 1, 50),
    ]
    for i in range(5):
        rows.append((20 * i * US, 10 * US, "cudaLaunchKernel", K.RUNTIME, 0, 0, i + 1))
        rows.append(
            ((20 * i + 12) * US, 2 * US, "void add_kernel<float>()", K.KERNEL_COMPUTE, 1, 0, i + 1)
        )
    return events(rows), lanes(GPU_LANES)


def test_host_wait_is_the_whole_gpus_idle_time_the_host_had_not_launched_for() -> None:
    from rankscope.analysis.compute.host_feed import host_wait

    ev, ln = _fed_rank()
    (row,) = host_wait(ev, ln, rank=3).to_dict("records")  # type: ignore[arg-type]
    assert row["rank"] == 3 and row["steps"] == 2 and row["step_ns"] == 202 * US
    assert row["gpu_idle_ns"] == (18 + 6 + 2 + 18 + 118) * US
    assert row["host_wait_ns"] == (18 + 18 + 118) * US
    assert row["input_wait_ns"] == 105 * US
    assert row["host_wait_gaps"] == 3


def _feed_tables(
    wait_ms: dict[int, float], input_ms: float, short: int, launches: int
) -> tuple[object, object, object]:
    """host_wait, launch_summary and breakdown of ranks with 4 steps of 10 ms each."""
    import pandas as pd

    ms = 1_000_000
    ranks = sorted(wait_ms)
    host = pd.DataFrame(
        {
            "rank": ranks,
            "host_wait_ns": [4 * wait_ms[r] * ms for r in ranks],
            "input_wait_ns": [4 * input_ms * ms for _ in ranks],
        }
    )
    summary = pd.DataFrame(
        {"rank": ranks, "launches": launches, "short_kernels": short}, index=range(len(ranks))
    )
    breakdown = pd.DataFrame(
        {
            "rank": [r for r in ranks for _ in range(4)],
            "step": list(range(4)) * len(ranks),
            "total_ns": [10 * ms] * 4 * len(ranks),
        }
    )
    return host, summary, breakdown


def test_launch_bound_fires_on_host_wait_with_mostly_short_kernels() -> None:
    """Truth by construction: rank 0 waits 3 ms per 10 ms step for the host, rank 1 1 ms; 80 %
    of the launches are shorter than their launch call. The gain is at most the larger wait
    per step (3 ms: a step waits for its slowest rank), 30 % of the step."""
    from rankscope.analysis.conclude.advice_feed import LAUNCH_GAIN_SOURCE, launch_bound

    (item,) = launch_bound(*_feed_tables({0: 3.0, 1: 1.0}, 0.0, 80, 100))  # type: ignore[arg-type]
    assert item.rule is Rule.LAUNCH_BOUND and item.bottleneck is BottleneckClass.FRAMEWORK
    assert "reduce-overhead" in item.fix and "CUDA graph" in item.fix and "batch" in item.fix
    assert item.ranks == (0, 1)
    assert item.figures["host_wait_ms_per_step"] == pytest.approx(2.0)
    assert item.figures["host_wait_share"] == pytest.approx(0.2)
    assert item.gain_ms == pytest.approx(3.0) and item.gain_share == pytest.approx(0.3)
    assert item.gain_source == LAUNCH_GAIN_SOURCE


def test_launch_bound_does_not_fire_on_long_kernels_input_or_immaterial_waits() -> None:
    from rankscope.analysis.conclude.advice_feed import launch_bound

    # the GPU waits as long, but most of its work outlasts the launch call: not the launches
    assert launch_bound(*_feed_tables({0: 3.0}, 0.0, 40, 100)) == []  # type: ignore[arg-type]
    # the host wait is all DataLoader (the input rule's)
    assert launch_bound(*_feed_tables({0: 3.0}, 3.0, 80, 100)) == []  # type: ignore[arg-type]
    # 0.05 ms of 10 ms: below the material share
    assert launch_bound(*_feed_tables({0: 0.05}, 0.0, 80, 100)) == []  # type: ignore[arg-type]


def test_launch_bound_on_real_gpu_traces(analyses: dict[str, Analysis]) -> None:
    # the DLRM job on V100s: many small embedding/elementwise kernels, the GPU waiting for them
    (item,) = [i for i in advice(analyses["param_dlrm_8rank"]) if i.rule is Rule.LAUNCH_BOUND]
    assert item.ranks == tuple(range(8))
    assert item.figures["short_launch_share"] > 0.5
    assert (
        item.gain_ms is not None
        and 0 < item.gain_ms <= item.figures["host_wait_ms_per_step_max"] + 1e-9
    )
    # the 128-rank job's two ranks run long GEMMs behind a deep queue (HTA: 140 of 602 launches
    # short, launch delays up to 104 ms): not launch-bound
    assert Rule.LAUNCH_BOUND not in _rules(analyses["hta/trace_filter_2rank"])
    assert Rule.LAUNCH_BOUND not in _rules(analyses["cpu_gloo_4rank_straggler"])


def _copy_rank(second: str, other_thread: bool = False) -> tuple[object, object]:
    """A pinned HtoD copy launched by cudaMemcpyAsync (corr 1) and then ``second`` on the same
    thread (or on another one), inside step 0; a cudaMemcpy (corr 2) copy from pinned memory."""
    from analysis_frames import events, lanes
    from rankscope.analysis.store.schema import EventKind as K
    from rankscope.analysis.store.schema import LaneKind

    pinned = "Memcpy HtoD (Pinned -> Device)"
    ev = events(
        [
            (0, 1000 * US, "ProfilerStep#0", K.PROFILER_STEP, 0, 0),
            (10 * US, 5 * US, "cudaMemcpyAsync", K.RUNTIME, 0, 0, 1),
            (16 * US, 40 * US, second, K.RUNTIME, 2 if other_thread else 0, 0),
            (20 * US, 3 * US, pinned, K.MEMCPY, 1, 0, 1),
            (100 * US, 30 * US, "cudaMemcpy", K.RUNTIME, 0, 0, 2),
            (110 * US, 4 * US, pinned, K.MEMCPY, 1, 0, 2),
        ]
    )
    spec = [
        (LaneKind.THREAD, "python3"),
        (LaneKind.GPU_STREAM, "stream 7"),
        (LaneKind.THREAD, "thread 2"),
    ]
    return ev, lanes(spec)


def test_blocking_copies_are_the_pinned_copies_the_host_waited_for() -> None:
    from rankscope.analysis.compute.host_feed import blocking_copies

    got = blocking_copies(*_copy_rank("cudaStreamSynchronize"), rank=1)  # type: ignore[arg-type]
    assert got[["call", "sync", "copy_ns", "wait_ns"]].values.tolist() == [
        ["cudaMemcpyAsync", "cudaStreamSynchronize", 3 * US, 40 * US],
        ["cudaMemcpy", "", 4 * US, 30 * US],
    ]
    assert set(got["rank"]) == {1} and set(got["step"]) == {0}
    # a launch after the copy, or a sync on another thread: the copy ran on, not waited for
    for ev_ln in (_copy_rank("cudaLaunchKernel"), _copy_rank("cudaStreamSynchronize", True)):
        assert blocking_copies(*ev_ln)["call"].tolist() == ["cudaMemcpy"]  # type: ignore[arg-type]


def test_blocking_pinned_copies_fire_on_synchronised_copies_only(
    analyses: dict[str, Analysis],
) -> None:
    # the DLRM rank whose pageable copies (each cudaMemcpyAsync + cudaStreamSynchronize, as
    # recorded) read pinned memory: what .to(device) without non_blocking does (tests/data/advice)
    (item,) = [
        i
        for i in advice(analyses["advice/dlrm_pinned_sync"])
        if i.rule is Rule.BLOCKING_PINNED_COPY
    ]
    assert item.bottleneck is BottleneckClass.INPUT and "non_blocking=True" in item.fix
    assert item.figures["blocking_pinned_copies"] == 8 and item.ranks == (0,)
    assert "cudaStreamSynchronize" in item.seen and item.gain == NOT_ESTIMATED
    assert Rule.PAGEABLE_COPY not in _rules(analyses["advice/dlrm_pinned_sync"])
    # the real jobs copy from pinned memory with non_blocking=True: nothing synchronises
    for name in ("param_dlrm_8rank", "hta/trace_filter_2rank", "cpu_gloo_4rank_straggler"):
        assert Rule.BLOCKING_PINNED_COPY not in _rules(analyses[name]), name


def test_steps_per_rank_are_pandas_count_and_sum_of_the_profiled_steps(
    analyses: dict[str, Analysis],
) -> None:
    """advice_rules._steps (every rule's per-rank steps and their summed time, from one sort):
    groupby("rank")'s size and sum of the profiled steps' rows, whatever their order, index
    dtype and all; float times and no profiled step are pandas' own."""
    import pandas as pd
    from rankscope.analysis.conclude.advice_rules import _steps

    def want(bd: pd.DataFrame) -> pd.DataFrame:
        g = bd[bd["step"] >= 0].groupby("rank")["total_ns"]
        return pd.DataFrame({"steps": g.size(), "total_ns": g.sum()})

    for a in analyses.values():
        bd = a.breakdown
        assert (bd["step"] >= 0).any() and bd["total_ns"].dtype.kind == "i"
        for frame in (
            bd,
            bd.iloc[::-1],
            bd.sample(frac=1.0, random_state=7),
            bd[bd["step"] < 0],
            bd.astype({"total_ns": "float64"}),
        ):
            pd.testing.assert_frame_equal(_steps(frame), want(frame), check_exact=True)


def test_per_step_is_the_ranks_mean_per_step_and_share_of_their_time(
    analyses: dict[str, Analysis],
) -> None:
    """advice_rules._per_step: (mean over the given ranks with profiled steps of their ns per
    step, in ms; their summed ns over those ranks' summed step time, at most 1), read from plain
    dicts: the very floats pandas' lookups gave, ranks without steps left out."""
    import random

    import pandas as pd
    from rankscope.analysis.conclude.advice_rules import _per_step, _steps

    def want(ns: dict[int, float], steps: pd.DataFrame) -> tuple[float, float]:
        ranks = [r for r in ns if r in steps.index and steps.at[r, "steps"] > 0]
        if not ranks:
            return 0.0, 0.0
        per = [ns[r] / float(steps.at[r, "steps"]) for r in ranks]
        whole = float(steps.loc[ranks, "total_ns"].sum())
        part = float(sum(ns[r] for r in ranks))
        return sum(per) / len(per) / 1e6, (min(part / whole, 1.0) if whole > 0 else 0.0)

    rng = random.Random(11)
    for a in analyses.values():
        for steps in (_steps(a.breakdown), _steps(a.breakdown).astype({"total_ns": "float64"})):
            ranks = [*steps.index.tolist(), 999]  # 999: no profiled step
            for _ in range(20):
                ns = {r: rng.random() * 1e9 for r in rng.sample(ranks, rng.randint(1, len(ranks)))}
                assert _per_step(ns, steps) == want(ns, steps)
    assert _per_step({1: 5.0}, _steps(a.breakdown.iloc[:0])) == (0.0, 0.0)
