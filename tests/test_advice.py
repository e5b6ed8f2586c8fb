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
