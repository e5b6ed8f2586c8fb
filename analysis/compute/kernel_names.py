"""What a GPU kernel's name says about the arithmetic it runs: FP32 on the CUDA cores, or on
tensor cores (TF32, FP16, BF16). And whether a memcpy went through pageable host memory.

Why: a GEMM or a convolution in FP32 on the CUDA cores ("SIMT") runs at a fraction of what the
same GPU does on its tensor cores. An A100 peaks at 19.5 TFLOPS in FP32 and 156 in TF32 (312 in
FP16/BF16); a V100 at 15.7 in FP32 and 125 in FP16 (NVIDIA A100 and V100 data sheets). Tensor
cores exist from compute capability 7.0 (FP16) and take TF32 and BF16 from 8.0 (CUDA C++
Programming Guide, "Compute Capabilities"; torch documents TF32 in "TensorFloat-32 (TF32) on
Ampere (and later) devices"). The kernel's name is the only record of which unit ran it:

* cuBLAS' FP32 SIMT GEMMs are named ``<arch>_sgemm_<tile>_<layout>`` (``volta_sgemm_128x32_nt``,
  ``ampere_sgemm_64x32_sliced1x4_nn``, ``maxwell_sgemm_…``) and its small-matrix FP32 kernels
  ``gemmSN_<layout>_kernel<float, …>`` (both seen in
  tests/data/param_dlrm_8rank, V100); cuDNN's FP32 SIMT convolutions ``implicit_convolve_sgemm``,
  ``*_scudnn_*`` and ``explicit_convolve_sgemm``. (Matrix-vector ``gemv*`` kernels are not
  counted: bandwidth-bound, they gain nothing from tensor cores.)
* TF32 on tensor cores: CUTLASS' ``cutlass_80_tensorop_s1688gemm_…`` (``s``: single-precision
  operands, ``1688``: the m16n8k8 TF32 MMA shape; ``tensorop``: tensor cores), cuBLAS/cuDNN's
  ``sm80_xmma_*_tf32f32_tf32f32_f32_*`` and ``ampere_s16816gemm``/``*tf32*`` (all but the last
  seen in tests/data/hta/nccl_parser_config, A100).
* FP16/BF16 on tensor cores: ``*_h884gemm_*`` / ``*_h1688gemm_*`` / ``*_h16816gemm_*`` /
  ``hgemm`` / ``*bf16*`` / ``*f16f16*`` / ``h884cudnn`` (the ``h``: half operands).

Only names that say FP32 SIMT *positively* count; a kernel that matches nothing is left out (a
custom or fused kernel cannot be judged from its name).

Memcpy: Kineto names each copy ``Memcpy HtoD (Pageable -> Device)`` / ``(Pinned -> Device)``
(``cat`` gpu_memcpy). A copy from pageable memory is staged through a pinned buffer by the
driver and synchronises the host: "for transfers from pageable host memory to device memory, a
stream sync is performed before the copy is initiated" (CUDA Runtime API, "API synchronization
behavior") — the host waits for the GPU's queue to drain, and ``non_blocking=True`` cannot
help. Pinned memory (``DataLoader(pin_memory=True)``, ``tensor.pin_memory()``) makes the copy
asynchronous — if it is asked for: ``tensor.to(device)`` without ``non_blocking=True`` copies a
pinned tensor with ``cudaMemcpyAsync`` and then synchronises the stream (the host waits again;
``analysis/compute/host_feed.py`` finds those).
"""

from __future__ import annotations

import enum
import functools
import re


class Precision(enum.StrEnum):
    """The arithmetic a GEMM / convolution kernel ran, as its name says."""

    FP32_SIMT = "FP32 on CUDA cores"
    TENSOR_TF32 = "TF32 on tensor cores"
    TENSOR_HALF = "FP16/BF16 on tensor cores"
    UNKNOWN = "unknown"


#: Tensor-core kernels, checked first (half, then TF32: ``ampere_bf16_s16816gemm`` is BF16):
#: ``cutlass_80_tensorop_s1688gemm`` has an ``s`` (FP32 operands) but runs TF32 MMA.
_TF32 = re.compile(r"tf32|tensorop_s\d+gemm|_s1688gemm|_s16816gemm|s1688tf32", re.IGNORECASE)
_HALF = re.compile(
    r"h884|h1688|h16816|hgemm|bf16|f16f16|fp16|half|h884cudnn|hcudnn|_h\d+gemm", re.IGNORECASE
)
#: FP32 SIMT GEMMs and convolutions (cuBLAS ``*_sgemm_*``, ``gemmSN_*<float``; cuDNN
#: ``implicit_convolve_sgemm``, ``*scudnn*``). Matrix-vector kernels (``gemv*``) are left out:
#: they are bound by memory bandwidth, and tensor cores would not speed them up.
#: cuBLAS 12's ``sm<arch>_xmma_gemm_<A><B>_<compute><compute>_<accumulate>`` names say the
#: compute type too: ``f32f32_tf32f32_f32`` is TF32 (the synth writes that one), so
#: ``f32f32_f32f32_f32`` is FP32 without TF32 (from the naming scheme; no trace here has it).
_FP32 = re.compile(
    r"(?:^|[^a-z0-9])(?:[a-z]+_)?sgemm|gemmsn_\w+<float|scudnn|_f32f32_f32f32_f32_", re.IGNORECASE
)

#: The copy direction whose pageable form blocks the input path (HtoD): Kineto's names, by the
#: host memory the copy reads.
PAGEABLE_HTOD = "Memcpy HtoD (Pageable -> Device)"
PINNED_HTOD = "Memcpy HtoD (Pinned -> Device)"


class HostMemory(enum.StrEnum):
    """The host memory a host-to-device copy reads (Kineto's ``Memcpy HtoD (<kind> -> Device)``)."""

    PAGEABLE = "Pageable"
    """Ordinary memory: the driver stages it through a pinned buffer and the host waits."""
    PINNED = "Pinned"
    """Page-locked memory: the GPU reads it directly; asynchronous when asked to be."""


#: Compute capability (major) from which tensor cores take FP16 (Volta) and TF32/BF16 (Ampere).
TENSOR_CORES_FP16_MAJOR = 7
TENSOR_CORES_TF32_MAJOR = 8


@functools.lru_cache(maxsize=8192)
def precision(name: str) -> Precision:
    """What ``name`` (a GPU kernel's) says about the unit and precision of its GEMM / conv.

    Cached: the advice and the KPIs ask it of every op row of every rank, and a job's ranks run
    the same few hundred kernels (three regex searches each, ~0.1 ms a name)."""
    if _HALF.search(name):
        return Precision.TENSOR_HALF
    if _TF32.search(name):
        return Precision.TENSOR_TF32
    if _FP32.search(name):
        return Precision.FP32_SIMT
    return Precision.UNKNOWN


def htod_source(name: str) -> HostMemory | None:
    """The host memory a host-to-device copy reads, from Kineto's memcpy name; None for any
    other event (another direction, or a kind of memory not named here)."""
    if name.startswith(PAGEABLE_HTOD):
        return HostMemory.PAGEABLE
    if name.startswith(PINNED_HTOD):
        return HostMemory.PINNED
    return None


def is_pageable_htod(name: str) -> bool:
    """A host-to-device copy from pageable memory (Kineto's memcpy name)."""
    return htod_source(name) is HostMemory.PAGEABLE
