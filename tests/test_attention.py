"""Attention (``analysis.attention``): SDPA calls, their backend from op and kernel names, time
per backend, and the math-fallback finding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from analysis_frames import events, lanes
from rankscope.analysis.compute.attention import (
    SdpaBackend,
    attention_by_backend,
    attention_calls,
    classify_kernel,
    math_fallback_findings,
)
from rankscope.analysis.conclude.findings import FindingKind, Severity
from rankscope.analysis.store.schema import EventKind as K
from rankscope.analysis.store.schema import LaneKind

ROOT = Path(__file__).resolve().parents[1]
LANES = lanes([(LaneKind.THREAD, "main"), (LaneKind.GPU_STREAM, "stream 7")])
SDPA = "aten::scaled_dot_product_attention"


def test_kernel_names() -> None:
    assert classify_kernel("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>") == (
        SdpaBackend.FLASH
    )
    assert classify_kernel("fmha_cutlassF_f16_aligned_64x64_rf_sm80") == SdpaBackend.EFFICIENT
    assert classify_kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == (
        SdpaBackend.CUDNN
    )
    assert classify_kernel("ampere_sgemm_128x64_nn") is None


def _gpu_calls() -> pd.DataFrame:
    """Four GPU calls: flash (op name), efficient (kernel name only), math (launched GEMMs), and
    a direct backward flash op; one CPU math call without kernels."""
    ev = events(
        [
            (0, 50, SDPA, K.CPU_OP, 0),
            (5, 40, "aten::_scaled_dot_product_flash_attention", K.CPU_OP, 0),
            (10, 5, "cudaLaunchKernel", K.RUNTIME, 0, -1, 1),
            (20, 30, "pytorch_flash::flash_fwd_kernel", K.KERNEL_COMPUTE, 1, -1, 1),
            (100, 50, SDPA, K.CPU_OP, 0),
            (110, 5, "cudaLaunchKernel", K.RUNTIME, 0, -1, 2),
            (120, 40, "fmha_cutlassF_f16_aligned_64x64_rf_sm80", K.KERNEL_COMPUTE, 1, -1, 2),
            (200, 80, SDPA, K.CPU_OP, 0),
            (205, 70, "aten::_scaled_dot_product_attention_math", K.CPU_OP, 0),
            (210, 5, "cudaLaunchKernel", K.RUNTIME, 0, -1, 3),
            (220, 5, "cudaLaunchKernel", K.RUNTIME, 0, -1, 4),
            (230, 100, "ampere_sgemm_128x64_nn", K.KERNEL_COMPUTE, 1, -1, 3),
            (330, 60, "softmax_warp_forward", K.KERNEL_COMPUTE, 1, -1, 4),
            (400, 20, "aten::_scaled_dot_product_flash_attention_backward", K.CPU_OP, 0),
            (402, 16, "aten::_flash_attention_backward", K.CPU_OP, 0),
        ]
    )
    return attention_calls(ev, 3, LANES)


def test_backends_from_ops_and_kernels() -> None:
    calls = _gpu_calls()
    assert calls["backend"].tolist() == ["flash", "efficient", "math", "flash"]
    assert calls["backward"].tolist() == [False, False, False, True]
    assert calls["device_ns"].tolist() == [30, 40, 160, 0]
    assert calls["kernels"].tolist() == [1, 1, 2, 0]
    assert (calls["rank"] == 3).all()
    by = attention_by_backend(calls).set_index(["backend", "backward"])
    assert by.loc[("math", False), "total_ns"] == 80
    assert by.loc[("math", False), "device_ns"] == 160
    assert by["share"].sum() == pytest.approx(1.0)


def test_cpu_backends_shapes_and_mask() -> None:
    ev = events(
        [
            (0, 50, SDPA, K.CPU_OP, 0),
            (5, 40, "aten::_scaled_dot_product_attention_math", K.CPU_OP, 0),
            (10, 10, "aten::bmm", K.CPU_OP, 0),
            (100, 20, SDPA, K.CPU_OP, 0),
            (105, 10, "aten::_scaled_dot_product_flash_attention_for_cpu", K.CPU_OP, 0),
        ]
    )
    q = "[2, 4, 64, 32]"
    ev["shapes"] = pd.Categorical(
        [f"[{q}, {q}, {q}, [64, 64], [], [], [], []]", None, None, f"[{q}, {q}, {q}, [], []]", None]
    )
    ev["dtypes"] = pd.Categorical(
        ["['c10::Half', 'c10::Half', 'c10::Half', 'bool', 'Scalar']", None, None,
         "['float', 'float', 'float', '', 'Scalar']", None]
    )  # fmt: skip
    calls = attention_calls(ev, 0)
    assert calls["backend"].tolist() == ["cpu_math", "cpu_flash"]
    assert calls["query_shape"].tolist() == [q, q]
    assert calls["dtype"].tolist() == ["c10::Half", "float"]
    assert calls["mask"].tolist() == ["bool [64, 64]", "none"]
    (finding,) = math_fallback_findings(calls)
    assert finding.kind == FindingKind.SDPA_MATH_FALLBACK and finding.severity == Severity.NOTE
    assert "1 of 2 scaled_dot_product_attention calls ran the CPU math fallback" in finding.text
    assert "mask bool [64, 64]" in finding.evidence
    # the fused call has another dtype but the same query shape: compared per call
    assert finding.figures["math_vs_fused"] == pytest.approx(2.5)


def test_gpu_math_is_a_problem_and_no_sdpa_no_finding() -> None:
    (finding,) = math_fallback_findings(_gpu_calls())
    assert finding.severity == Severity.PROBLEM and finding.rank == 3
    assert finding.figures["math_total_ms"] == pytest.approx(160e-6)  # device time on a GPU
    assert math_fallback_findings(attention_calls(events([(0, 5, "aten::mm", K.CPU_OP, 0)]))) == []


@pytest.mark.slow
def test_math_and_flash_runs(tmp_path: Path) -> None:
    """examples/attention.py on the CPU with --sdpa-backend math and flash: each run's backend
    is found with its time, and the math run's finding compares it with the flash run."""
    import rankscope
    from rankscope.orchestrator.ingest.merge import merge_run_dir

    calls = {}
    for backend in ("math", "flash"):
        trace = tmp_path / f"{backend}.json"
        subprocess.run(
            [sys.executable, str(ROOT / "examples/attention.py"), "--sdpa-backend", backend,
             "--steps", "3", "--seq", "64", "--profile", str(trace)],
            check=True, cwd=tmp_path, capture_output=True,
        )  # fmt: skip
        store = merge_run_dir(trace, output=tmp_path / f"{backend}.h5", quiet=True)
        with rankscope.open(store) as st:
            cols = ["ts", "dur", "name", "cat", "kind", "lane", "corr", "shapes", "dtypes"]
            calls[backend] = attention_calls(st.events(0, columns=cols), 0, st.lanes(0))
    math, flash = calls["math"], calls["flash"]
    assert set(math["backend"]) == {"cpu_math"} and (~math["backward"]).sum() == 3
    assert set(flash["backend"]) == {"cpu_flash"}
    assert (~flash["backward"]).sum() == 3 and flash["backward"].sum() == 3
    assert (math["dur"] > 0).all() and (math["query_shape"] == "[4, 4, 64, 32]").all()
    assert (math["dtype"] == "float").all() and (math["mask"] == "none").all()
    assert math_fallback_findings(flash) == []
    (finding,) = math_fallback_findings(math, reference=flash)
    assert "ran the CPU math fallback" in finding.evidence
    assert "cpu_flash calls of the same shape took" in finding.evidence
    assert "in the reference run" in finding.evidence
    assert finding.figures["fused_mean_ms"] > 0


@pytest.mark.slow
def test_analyze_and_compare_say_the_math_fallback_against_the_flash_run(tmp_path: Path) -> None:
    """The user's path: analyze a math run (its summary names the fallback and its time), then
    `rankscope compare FLASH MATH` says how much slower the math calls were than flash's."""
    import json

    runs = {}
    for backend in ("math", "flash"):
        trace = tmp_path / backend / "attention.json"
        trace.parent.mkdir()
        subprocess.run(
            [sys.executable, str(ROOT / "examples/attention.py"), "--sdpa-backend", backend,
             "--steps", "3", "--seq", "64", "--profile", str(trace)],
            check=True, cwd=tmp_path, capture_output=True,
        )  # fmt: skip
        runs[backend] = trace.parent
    res = subprocess.run(
        [sys.executable, "-m", "rankscope", "analyze", str(runs["math"]), "--json",
         str(tmp_path / "math.json"), "--html", str(tmp_path / "math.html")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "math.json").read_text())
    (row,) = [r for r in doc["attention"] if not r["backward"]]
    assert row["backend"] == "cpu_math" and row["calls"] == 3 and row["total_s"] > 0
    kinds = [f["kind"] for f in doc["findings"]]
    assert "sdpa_math_fallback" in kinds
    assert "ran the CPU math fallback" in " ".join(res.stdout.split())
    html = (tmp_path / "math.html").read_text()
    assert "Attention (scaled_dot_product_attention)" in html and "cpu_math" in html
    assert "ran the CPU math fallback" in html and "Op table (like key_averages()" in html
    cmp = subprocess.run(
        [sys.executable, "-m", "rankscope", "compare", str(runs["flash"]), str(runs["math"])],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cmp.returncode == 0, cmp.stderr
    text = " ".join(cmp.stdout.split())
    assert "cpu_flash calls of the same shape took" in text and "the math fallback was" in text
