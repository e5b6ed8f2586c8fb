"""Attention: each ``scaled_dot_product_attention`` call, the backend that ran it, and its time.

``torch.nn.functional.scaled_dot_product_attention`` shows in a trace as the op
``aten::scaled_dot_product_attention`` around the op of the backend torch chose, which launches
that backend's kernels on a GPU. The backend is read from those op names first
(:data:`BACKEND_OPS`), then from the names of the kernels the call launched (same correlation
id as a runtime call inside it; :data:`KERNEL_PATTERNS`):

* CPU (verified on torch 2.13 CPU traces): ``aten::_scaled_dot_product_flash_attention_for_cpu``
  (the CPU flash path) and ``aten::_scaled_dot_product_attention_math`` (math).
* GPU (from the documentation and torch's ``native_functions.yaml``, not verified on a GPU
  trace here): ``aten::_scaled_dot_product_flash_attention`` (kernels ``flash_fwd_kernel``,
  ``flash_bwd_*``), ``aten::_scaled_dot_product_efficient_attention`` (``fmha_cutlass*``,
  ``*AttentionKernel*``), ``aten::_scaled_dot_product_cudnn_attention`` (``cudnn*`` / ``*sdpa*``
  engine kernels); math on a GPU is ``aten::_scaled_dot_product_attention_math`` launching
  ordinary GEMM and softmax kernels. A math call that launched no kernel ran on the CPU.

A call is an SDPA op (the wrapper, or a backend op called directly, such as the backward ops
``aten::_scaled_dot_product_flash_attention_for_cpu_backward``) not nested in another one on its
thread; its backend is that of the first backend op inside it. All functions are pure (a rank's
events in, DataFrames or findings out); times are ns.
"""

from __future__ import annotations

import ast
import enum
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from rankscope.analysis.store.frames import empty

if TYPE_CHECKING:
    from rankscope.analysis.compute.finding import Finding


class SdpaBackend(enum.StrEnum):
    """The implementation that ran one scaled-dot-product-attention call."""

    FLASH = "flash"
    """FlashAttention (GPU)."""
    EFFICIENT = "efficient"
    """Memory-efficient attention (xFormers / cutlass, GPU)."""
    CUDNN = "cudnn"
    """cuDNN's fused attention (GPU)."""
    MATH = "math"
    """The unfused math fallback on a GPU (matmul, softmax, matmul kernels)."""
    CPU_FLASH = "cpu_flash"
    """The CPU flash path (``_scaled_dot_product_flash_attention_for_cpu``)."""
    CPU_MATH = "cpu_math"
    """The unfused math fallback on the CPU."""
    OTHER = "other"
    """An SDPA op whose backend the trace does not tell (e.g. a device's overrideable op)."""


#: The math fallbacks (a finding when they ran).
MATH_BACKENDS = frozenset({SdpaBackend.MATH, SdpaBackend.CPU_MATH})

#: The SDPA wrapper op (its inputs: query, key, value, attn_mask, dropout_p, is_causal, ...).
SDPA_OP = "aten::scaled_dot_product_attention"
#: Backend ops (forward and backward) → backend; math is decided by the kernels it launched.
BACKEND_OPS: dict[str, SdpaBackend] = {
    "aten::_scaled_dot_product_flash_attention": SdpaBackend.FLASH,
    "aten::_scaled_dot_product_flash_attention_backward": SdpaBackend.FLASH,
    "aten::_flash_attention_forward": SdpaBackend.FLASH,
    "aten::_flash_attention_backward": SdpaBackend.FLASH,
    "aten::_scaled_dot_product_efficient_attention": SdpaBackend.EFFICIENT,
    "aten::_scaled_dot_product_efficient_attention_backward": SdpaBackend.EFFICIENT,
    "aten::_efficient_attention_forward": SdpaBackend.EFFICIENT,
    "aten::_efficient_attention_backward": SdpaBackend.EFFICIENT,
    "aten::_scaled_dot_product_cudnn_attention": SdpaBackend.CUDNN,
    "aten::_scaled_dot_product_cudnn_attention_backward": SdpaBackend.CUDNN,
    "aten::_scaled_dot_product_attention_math": SdpaBackend.CPU_MATH,
    "aten::_scaled_dot_product_flash_attention_for_cpu": SdpaBackend.CPU_FLASH,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": SdpaBackend.CPU_FLASH,
    "aten::_scaled_dot_product_fused_attention_overrideable": SdpaBackend.OTHER,
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": SdpaBackend.OTHER,
}
#: Kernel names → backend, tried in order (documentation-based: FlashAttention-2's
#: ``flash_fwd_kernel`` / ``flash_bwd_*``, PyTorch's cutlass ``fmha_cutlassF*`` /
#: ``AttentionKernel``, cuDNN frontend's ``cudnn_generated_*sdpa*`` engines).
KERNEL_PATTERNS: tuple[tuple[re.Pattern[str], SdpaBackend], ...] = (
    (re.compile(r"flash_(fwd|bwd)|pytorch_flash::|flash::", re.I), SdpaBackend.FLASH),
    (re.compile(r"fmha|AttentionKernel|efficient_attention", re.I), SdpaBackend.EFFICIENT),
    (re.compile(r"cudnn|sdpa", re.I), SdpaBackend.CUDNN),
)

#: Columns of :func:`attention_calls` (ns; shapes and dtypes "" when not recorded).
ATTENTION_CALL_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "ts": "int64",  # start of the call (the store's aligned clock)
    "dur": "int64",  # the call's host time (inclusive)
    "name": "str",  # the outermost SDPA op (the wrapper, or a backend op called directly)
    "backward": "bool",  # a backward op (``*_backward``)
    "backend": "str",  # SdpaBackend
    "device_ns": "int64",  # kernels / copies it launched, summed (0 on CPU)
    "kernels": "int64",  # how many
    "query_shape": "str",  # e.g. "[4, 4, 128, 32]"
    "dtype": "str",  # the query's ("float", "c10::BFloat16", ...)
    "mask": "str",  # "none", "bool [128, 128]", ... (the wrapper's attn_mask), "" unknown
}


def classify_kernel(name: str) -> SdpaBackend | None:
    """The fused backend a kernel name belongs to (None: not an attention kernel)."""
    for pattern, backend in KERNEL_PATTERNS:
        if pattern.search(name):
            return backend
    return None


def _parse(text: Any) -> list[Any] | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, list) else None


def _inputs(shapes: Any, dtypes: Any, wrapper: bool) -> tuple[str, str, str]:
    """(query shape, query dtype, mask) from an op's recorded ``Input Dims`` / ``Input type``."""
    dims, types = _parse(shapes), _parse(dtypes)
    if dims is None:
        return "", "", ""
    query = str(dims[0]) if dims else ""
    dtype = str(types[0]) if types else ""
    mask = ""
    if wrapper and len(dims) > 3:
        t = str(types[3]) if types is not None and len(types) > 3 else ""
        mask = "none" if not t and dims[3] == [] else f"{t} {dims[3]}".strip()
    return query, dtype, mask


def attention_calls(
    events: pd.DataFrame, rank: int = 0, lanes: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Every SDPA call of one rank with its backend (``ATTENTION_CALL_COLUMNS``), in time order.

    ``events``: the rank's events (``Store.events``; add the optional ``shapes`` and ``dtypes``
    columns to get the query shape, dtype and mask of traces recorded with ``record_shapes``).
    """
    from rankscope.analysis.compute.ops import DEVICE_TIME_KINDS, launches, op_tree
    from rankscope.analysis.store.schema import text_codes

    code, texts = text_codes(events["name"])  # compared once per distinct text
    sdpa = np.isin(texts, [SDPA_OP, *BACKEND_OPS])[code]
    if not sdpa.any():
        return _empty()
    names = texts[code]
    tree = op_tree(events, lanes, merge_redispatch=False)
    order = tree["row"].to_numpy(np.int64)
    parent = np.full(len(events), -1, np.int64)
    parent[order] = tree["parent"].to_numpy(np.int64)
    call_of = np.full(len(events), -1, np.int64)
    backend: dict[int, SdpaBackend] = {}
    for i in order.tolist():  # parents before children
        p = parent[i]
        up = call_of[p] if p >= 0 else -1
        if up < 0 and sdpa[i]:
            up = i  # an SDPA op not inside another: a call
        call_of[i] = up
        if up >= 0 and up not in backend and names[i] in BACKEND_OPS:
            backend[up] = BACKEND_OPS[names[i]]
    calls = np.flatnonzero(call_of == np.arange(len(events)))
    kind = events["kind"].to_numpy().astype(np.int64)
    dur = events["dur"].to_numpy(np.int64)
    dev = np.flatnonzero(np.isin(kind, [int(k) for k in DEVICE_TIME_KINDS]))
    launch = launches(events, dev)
    owner = np.where(launch >= 0, call_of[np.maximum(launch, 0)], -1)
    mine = owner >= 0
    device_ns = np.zeros(len(events), np.int64)
    n_kernels = np.zeros(len(events), np.int64)
    np.add.at(device_ns, owner[mine], dur[dev[mine]])
    np.add.at(n_kernels, owner[mine], 1)
    from_kernels: dict[int, SdpaBackend] = {}
    for o, k in zip(owner[mine].tolist(), dev[mine].tolist(), strict=True):
        if o not in from_kernels:
            b = classify_kernel(str(names[k]))
            if b is not None:
                from_kernels[o] = b
    shapes = events["shapes"].to_numpy(object) if "shapes" in events.columns else None
    dtypes = events["dtypes"].to_numpy(object) if "dtypes" in events.columns else None
    rows = []
    for c in calls.tolist():
        b = backend.get(c)
        if b is None or b is SdpaBackend.OTHER:
            b = from_kernels.get(c, b or SdpaBackend.OTHER)
        if b is SdpaBackend.CPU_MATH and n_kernels[c] > 0:
            b = SdpaBackend.MATH  # the math op launched GPU kernels
        q, dt, mask = _inputs(
            shapes[c] if shapes is not None else None,
            dtypes[c] if dtypes is not None else None,
            names[c] == SDPA_OP,
        )
        rows.append(
            (rank, int(events["ts"].iat[c]), int(dur[c]), str(names[c]),
             str(names[c]).endswith("_backward"), str(b), int(device_ns[c]), int(n_kernels[c]),
             q, dt, mask)
        )  # fmt: skip
    out = pd.DataFrame(rows, columns=list(ATTENTION_CALL_COLUMNS))
    return out.astype({k: v for k, v in ATTENTION_CALL_COLUMNS.items() if v != "str"})


def _empty() -> pd.DataFrame:
    return empty({c: d if d != "str" else "object" for c, d in ATTENTION_CALL_COLUMNS.items()})


#: Columns of :func:`attention_by_backend` (ns; ``share``: of the rank's SDPA host time).
ATTENTION_BACKEND_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "backend": "str",
    "backward": "bool",
    "calls": "int64",
    "total_ns": "int64",
    "mean_ns": "float64",
    "device_ns": "int64",
    "share": "float64",
}


def attention_by_backend(calls: pd.DataFrame) -> pd.DataFrame:
    """Calls and time per (rank, backend, forward/backward) (``ATTENTION_BACKEND_COLUMNS``)."""
    if not len(calls):
        return pd.DataFrame(
            {
                c: pd.Series(dtype=d if d != "str" else object)
                for c, d in ATTENTION_BACKEND_COLUMNS.items()
            }
        )
    g = calls.groupby(["rank", "backend", "backward"], sort=True)
    out = g.agg(
        calls=("dur", "size"), total_ns=("dur", "sum"), device_ns=("device_ns", "sum")
    ).reset_index()
    out["mean_ns"] = out["total_ns"] / out["calls"]
    per_rank = calls.groupby("rank")["dur"].sum()
    out["share"] = out["total_ns"] / out["rank"].map(per_rank).where(lambda s: s > 0)
    out = out.fillna({"share": 0.0})
    return out[list(ATTENTION_BACKEND_COLUMNS)].astype(
        {k: v for k, v in ATTENTION_BACKEND_COLUMNS.items() if v != "str"}
    )


def _time(calls: pd.DataFrame) -> pd.Series:
    """A call's time: its device time when it launched kernels, else its host time (ns)."""
    return calls["device_ns"].where(calls["device_ns"] > 0, calls["dur"])


def math_fallback_findings(
    calls: pd.DataFrame, reference: pd.DataFrame | None = None
) -> list[Finding]:
    """One finding per rank whose forward SDPA calls ran the math fallback, with its evidence:
    how many calls, their time (device time on a GPU, host time on the CPU), the query shape,
    dtype and mask when recorded, and — to say what it cost — the mean time of fused forward
    calls of the same query shape: those of this run, else of ``reference`` (another run's
    :func:`attention_calls`, e.g. the same job with the flash backend). On a GPU the finding is
    a problem (the fused kernels were skipped); on the CPU a note."""
    from rankscope.analysis.compute.finding import Finding, FindingKind, Severity

    if not len(calls):
        return []
    fwd = calls[~calls["backward"]]
    out: list[Finding] = []
    for rank, mine in fwd.groupby("rank", sort=True):
        math = mine[mine["backend"].isin([str(b) for b in MATH_BACKENDS])]
        if not len(math):
            continue
        gpu = bool((math["backend"] == str(SdpaBackend.MATH)).any())
        t = _time(math)
        total_ms = float(t.sum()) / 1e6
        mean_ms = total_ms / len(math)
        top = math.groupby(["query_shape", "dtype", "mask"]).size().sort_values().index[-1]
        query, dtype, mask = (str(v) for v in top)
        figures: dict[str, float] = {
            "math_calls": len(math),
            "calls": len(mine),
            "math_total_ms": round(total_ms, 6),
            "math_mean_ms": round(mean_ms, 6),
        }
        evidence = (
            f"{len(math)} of {len(mine)} scaled_dot_product_attention calls ran the "
            f"{'GPU' if gpu else 'CPU'} math fallback: {total_ms:.2f} ms in all, "
            f"{mean_ms:.3f} ms per call"
        )
        inputs = ", ".join(
            p
            for p in (f"query {query}" if query else "", dtype, f"mask {mask}" if mask else "")
            if p
        )
        if inputs:
            evidence += f" ({inputs})"
        fused, where = _fused_like(mine, query), "this run"
        if not len(fused) and reference is not None and len(reference):
            fused, where = (
                _fused_like(reference[~reference["backward"]], query),
                "the reference run",
            )
        if len(fused):
            f_mean = float(_time(fused).mean()) / 1e6
            backend = str(fused["backend"].mode().iat[0])
            figures["fused_mean_ms"] = round(f_mean, 6)
            if f_mean > 0:
                figures["math_vs_fused"] = round(mean_ms / f_mean, 2)
            evidence += (
                f"; {backend} calls of the same shape took {f_mean:.3f} ms per call in {where}"
                + (f": the math fallback was {mean_ms / f_mean:.1f}x slower" if f_mean > 0 else "")
            )
        out.append(
            Finding(
                kind=FindingKind.SDPA_MATH_FALLBACK,
                severity=Severity.PROBLEM if gpu else Severity.NOTE,
                rank=int(str(rank)),
                headline=f"Attention math fallback: rank {rank}",
                evidence=evidence + ".",
                figures=figures,
            )
        )
    return out


def _fused_like(calls: pd.DataFrame, query: str) -> pd.DataFrame:
    """The fused (non-math, known) calls, of query shape ``query`` when shapes were recorded."""
    fused = calls[~calls["backend"].isin([*map(str, MATH_BACKENDS), str(SdpaBackend.OTHER)])]
    if query:
        fused = fused[fused["query_shape"] == query]
    return fused
