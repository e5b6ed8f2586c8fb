"""The DDP job of ``rankscope synth OUT_DIR``: a synthetic multi-GPU DDP job's Kineto traces, with ground truth.

Physics first: the generator simulates a data-parallel training job (DataLoader, forward on the
main thread, backward on the autograd thread, DDP bucket all-reduces on their own NCCL stream
overlapping backward, optimizer, a loss sync) rank by rank and step by step in integer
nanoseconds of a true clock, and writes what torch 2.x's profiler would write on each rank
(``rank-N.json.gz``, Kineto's JSON layout) plus ``truth.json``: the figures an analysis of those
traces should reproduce. It models the job, not any tool that reads the traces.

The one rule that makes it a multi-GPU job: a collective's NCCL kernel starts on each rank when
that rank reaches it (its *arrival*: launched by the CPU, after the compute stream reached the
event it waits on, after the previous collective on the NCCL stream) and ENDS on every rank at
the last arrival + the transfer time (ring all-reduce: latency + bytes * 2(n-1)/n / bandwidth,
times the slow-link factor). Early ranks' NCCL kernels therefore last longer: they wait.

See docs/synth.md for the model, the knobs, truth.json's fields and the limits.
Library use: ``simulate(SynthConfig(...))`` (arrays, no files) or ``generate(config, out_dir)``.

This module is the DDP simulation; the package's other modules hold the configuration
(:mod:`.config`), the command line (:mod:`.cli`), the truth (:mod:`.truth`), the Kineto writer
(:mod:`.render`) and the tensor x pipeline x data parallel jobs (:mod:`.parallel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rankscope.orchestrator.synth.config import (
    COMPUTE_STREAM,
    DATALOADER,
    NCCL_STREAM,
    RANKS_TRUNCATE,
    SynthConfig,
)


@dataclass
class _Template:
    """One event of a step, the same on every rank and every step (its times vary)."""

    kind: str
    """cpu (cpu_op / user_annotation), runtime (cuda_runtime), gpu (kernel / gpu_memcpy)"""
    cat: str
    name: str
    lane: str
    """main / autograd (threads) or compute / nccl (streams)"""
    ext: int = 0
    """External id (cpu ops: own; runtime and GPU: the enclosing op's), per step"""
    corr: int = 0
    """correlation id (runtime and GPU), per step; 0 none"""
    flow: bool = False
    """runtime: launches a GPU op (ac2g flow start); GPU ops always end a flow"""
    args: str = ""
    """static JSON args text after the ids (a leading comma included)"""
    coll: int = -1
    """collective index within the step (record_param_comms and NCCL kernels: carry Seq)"""


@dataclass
class Job:
    """A simulated job: per step, template e, rank r the true start and end (ns)."""

    config: SynthConfig
    templates: list[_Template]
    start: np.ndarray
    """int64 [steps, events, ranks]"""
    end: np.ndarray
    collectives: list[dict[str, Any]]
    """per step: {step, kind, bucket, bytes, transfer, arrival [ranks], end}"""
    step_start: np.ndarray
    """int64 [steps, ranks]: ProfilerStep start (true clock)"""
    step_end: np.ndarray
    input_ns: np.ndarray
    """int64 [steps, ranks]: DataLoader time"""
    slow_steps: dict[int, list[int]]
    """straggler rank -> indices of its slow steps"""
    pids: np.ndarray
    coll_per_step: int = 0


class _Sim:
    """Builds the event templates (first step) and records their times (every step)."""

    def __init__(self, config: SynthConfig, rng: np.random.Generator) -> None:
        self.c = config
        self.rng = rng
        self.R = config.ranks
        self.templates: list[_Template] = []
        self.index = 0
        self.starts: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []
        self.first = True
        self.next_ext = 1
        self.next_corr = 1
        self.ext_stack: list[int] = []

    # -- helpers
    def us(self, value: float) -> np.ndarray:
        """``value`` µs as int64 ns per rank, jittered (lognormal, mean preserving)."""
        j = self.c.jitter
        base = value * 1000.0
        if j == 0:
            return np.full(self.R, round(base), dtype=np.int64)
        factor = self.rng.lognormal(-j * j / 2, j, self.R)
        return np.rint(base * factor).astype(np.int64)

    def _record(self, tmpl: _Template, start: np.ndarray, end: np.ndarray) -> _Template:
        if self.first:
            self.templates.append(tmpl)
        else:
            tmpl = self.templates[self.index]
        self.index += 1
        self.starts.append(start)
        self.ends.append(end)
        return tmpl

    def begin_step(self) -> None:
        self.index = 0
        self.starts = []
        self.ends = []

    def end_step(self) -> tuple[np.ndarray, np.ndarray]:
        self.first = False
        return np.stack(self.starts), np.stack(self.ends)

    def cpu(self, cat: str, name: str, lane: str, start, end, args: str = "", coll: int = -1):
        ext = self.next_ext if self.first else 0
        if self.first:
            self.next_ext += 1
        return self._record(
            _Template("cpu", cat, name, lane, ext=ext, args=args, coll=coll), start, end
        )

    def runtime(self, name: str, lane: str, start, end, ext: int, flow: bool, cbid: int) -> int:
        corr = self.next_corr if self.first else 0
        if self.first:
            self.next_corr += 1
        t = self._record(
            _Template("runtime", "cuda_runtime", name, lane, ext=ext, corr=corr, flow=flow,
                      args=f', "cbid": {cbid}'),
            start, end,
        )  # fmt: skip
        return t.corr

    def gpu(
        self, cat: str, name: str, lane: str, start, end, ext: int, corr: int, args: str, coll=-1
    ):
        self._record(
            _Template("gpu", cat, name, lane, ext=ext, corr=corr, args=args, coll=coll), start, end
        )

    # -- composite ops
    def op(self, lane: str, t, chain: list[tuple[str, str]], kernel: tuple[str, np.ndarray] | None,
           stream: dict[str, Any] | None = None, cat: str = "kernel", kargs: str = "",
           wait_until=None):  # fmt: skip
        """Nested CPU ranges ``chain`` (outer first) from ``t``; the innermost launches
        ``kernel`` = (name, duration ns) on ``stream`` (``{"lane", "free"}``, updated).
        Returns (cpu time after the op, kernel start, kernel end) (kernel times None without)."""
        per = self.c.cpu_op_us / (2 * len(chain) + 1)
        starts = []
        cur = t
        for _ in chain:
            starts.append(cur)
            cur = cur + self.us(per)
        kstart = kend = None
        launch: tuple[Any, Any, Any, Any] | None = None
        if kernel is not None and stream is not None:
            rt_start = cur
            rt_end = cur + self.us(self.c.launch_us)
            ready = rt_start + np.int64(round(self.c.launch_latency_us * 1000))
            kstart = np.maximum(ready, stream["free"])
            if wait_until is not None:
                kstart = np.maximum(kstart, wait_until)
            kend = kstart + kernel[1]
            stream["free"] = kend
            launch = (rt_start, rt_end, kstart, kend)
            cur = rt_end
        else:
            cur = cur + self.us(per)
        ends = []
        for _ in chain:
            cur = cur + self.us(per)
            ends.append(cur)
        ends.reverse()
        # record outer to inner (the innermost op's External id goes to its launch and kernel)
        ext = 0
        for (c, name), s, e in zip(chain, starts, ends, strict=True):
            ext = self.cpu(c, name, lane, s, e).ext
        if launch is not None:
            rt_start, rt_end, ks, ke = launch
            assert kernel is not None and stream is not None
            corr = self.runtime(
                "cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync",
                lane,
                rt_start,
                rt_end,
                ext,
                True,
                211 if cat == "kernel" else 41,
            )
            self.gpu(cat, kernel[0], stream["lane"], ks, ke, ext, corr, kargs)
        return cur, kstart, kend


#: Kernel names (as CUDA 12 / torch 2.x / NCCL 2.x name them).
GEMM_FWD = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
GEMM_BWD = ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
            "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas")  # fmt: skip
RELU_FWD = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)"
RELU_BWD = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, at::detail::Array<char*, 3> >(int, at::native::(anonymous namespace)::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, at::detail::Array<char*, 3>)"
SOFTMAX_FWD = "void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, (anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)"
SOFTMAX_BWD = "void (anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, (anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, float const*, long)"
OPTIMIZER = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)"
H2D = "Memcpy HtoD (Pinned -> Device)"
D2H = "Memcpy DtoH (Device -> Pageable)"


def nccl_kernel_name(nbytes: int) -> str:
    """The NCCL 2.x all-reduce kernel NCCL would pick for a float32 message of ``nbytes``."""
    proto = "LL" if nbytes < (64 << 10) else "LL128" if nbytes < (8 << 20) else "SIMPLE"
    return f"ncclDevKernel_AllReduce_Sum_f32_RING_{proto}(ncclDevKernelArgsStorage<4096ul>)"


def transfer_ns(config: SynthConfig, nbytes: int) -> int:
    """Ring all-reduce time of ``nbytes`` once every rank has arrived (ns)."""
    n = config.ranks
    ring = nbytes * 2 * (n - 1) / n / (config.link_gbps * 1e9) if n > 1 else 0.0
    return round((config.link_latency_us * 1e-6 + ring) * config.slow_link * 1e9)


def _kargs(device: int, stream: int, grid: str, block: str, regs: int, smem: int) -> str:
    return (
        f', "queued": 0, "device": {device}, "context": 1, "stream": {stream}, '
        f'"registers per thread": {regs}, "shared memory": {smem}, "grid": {grid}, "block": {block}'
    )


def simulate(config: SynthConfig) -> Job:
    """Simulate the job on the true clock (no files): see the module docstring."""
    config.validate()
    c = config
    R, S = c.ranks, c.steps
    rng = np.random.default_rng(c.seed)
    pids = rng.integers(1000, 4_000_000, R)
    slow_steps: dict[int, list[int]] = {}
    slow_extra = np.zeros((S, R), dtype=np.int64)
    for rank, extra_ms, frac in c.stragglers:
        k = max(1, round(frac * S))
        chosen = sorted(int(s) for s in rng.choice(S, size=k, replace=False))
        slow_steps[rank] = chosen
        slow_extra[chosen, rank] += round(extra_ms * 1e6)
    input_extra = np.zeros(R, dtype=np.int64)
    for rank, extra_ms in c.slow_input:
        input_extra[rank] += round(extra_ms * 1e6)
    sizes = c.bucket_sizes()
    # layers, in backward order, split into buckets (DDP fills buckets from the last layer)
    order = list(range(c.layers - 1, -1, -1))
    bucket_of_pos = [min(c.buckets - 1, i * c.buckets // c.layers) for i in range(c.layers)]
    last_in_bucket = {
        k: max(i for i in range(c.layers) if bucket_of_pos[i] == k) for k in range(c.buckets)
    }
    bwd_gemm_base = 2 * c.layers * c.fwd_kernel_us * 1000.0
    lat = np.int64(round(c.launch_latency_us * 1000))
    sim = _Sim(c, rng)
    dev = 0  # the device id goes in at write time (local rank)
    k_gemm = _kargs(dev, COMPUTE_STREAM, "[132, 8, 1]", "[384, 1, 1]", 168, 213248)
    k_elem = _kargs(dev, COMPUTE_STREAM, "[8192, 1, 1]", "[128, 1, 1]", 26, 0)
    k_nccl = _kargs(dev, NCCL_STREAM, "[32, 1, 1]", "[640, 1, 1]", 96, 87328)

    starts, ends, colls = [], [], []
    step_start = np.zeros((S, R), dtype=np.int64)
    step_end = np.zeros((S, R), dtype=np.int64)
    input_ns = np.zeros((S, R), dtype=np.int64)
    t = np.full(R, c.start_ns, dtype=np.int64)
    compute: dict[str, Any] = {"lane": "compute", "free": t.copy()}
    nccl: dict[str, Any] = {"lane": "nccl", "free": t.copy()}
    coll_index = 0

    def comm_args(nbytes: int) -> tuple[str, str]:
        """(record_param_comms args, NCCL kernel args) without Seq and Rank."""
        nel = nbytes // 4
        ranks = list(range(R))
        shown = ", ".join(str(r) for r in ranks[:RANKS_TRUNCATE])
        if R > RANKS_TRUNCATE:
            shown += ", ..."
        common = (
            f', "Collective name": "allreduce", "In msg nelems": {nel}, "Out msg nelems": {nel}, '
            f'"Group size": {R}, "dtype": "Float"'
        )
        pg = (
            f', "Process Group Name": "0", "Process Group Description": "default_pg", '
            f'"Process Group Ranks": "[{shown}]"'
        )
        rpc = (
            common + ', "In split size": "[]", "Out split size": "[]", '
            '"Global rank start": 0, "Global rank stride": 1' + pg
        )
        return rpc, common + pg

    def allreduce(lane: str, t, nbytes: int, kind: str, bucket: int, step: int):
        """c10d::allreduce_ -> record_param_comms -> nccl:all_reduce, stream wait + launch.
        Returns (cpu time after, arrival [R], launch-ready [R]); the kernel is recorded later."""
        nonlocal coll_index
        per = c.cpu_op_us / 5
        a0 = t
        a1 = a0 + sim.us(per)
        a2 = a1 + sim.us(per)
        w0 = a2 + sim.us(per / 2)
        w1 = w0 + sim.us(1.0)
        l0 = w1 + sim.us(per / 2)
        l1 = l0 + sim.us(c.launch_us)
        e2 = l1 + sim.us(per / 2)
        e1 = e2 + sim.us(per / 2)
        e0 = e1 + sim.us(per)
        rpc, kern = comm_args(nbytes)
        sim.cpu("cpu_op", "c10d::allreduce_", lane, a0, e0)
        sim.cpu("cpu_op", "record_param_comms", lane, a1, e1, args=rpc, coll=coll_index)
        ext = sim.cpu("user_annotation", "nccl:all_reduce", lane, a2, e2).ext
        sim.runtime("cudaStreamWaitEvent", lane, w0, w1, ext, False, 147)
        corr = sim.runtime("cudaLaunchKernel", lane, l0, l1, ext, True, 211)
        # ready once launched and the compute stream reached the event it waits on; the NCCL
        # stream's earlier collectives are resolved later, in order (finish)
        ready = np.maximum(l0 + lat, compute["free"])
        coll = {"step": step, "kind": kind, "bucket": bucket, "bytes": nbytes,
                "transfer": transfer_ns(c, nbytes), "ready": ready, "index": coll_index,
                "ext": ext, "corr": corr, "args": kern}  # fmt: skip
        coll_index += 1
        return e0, coll

    def finish(coll: dict[str, Any]) -> None:
        """Resolve a collective across ranks and record its NCCL kernel on every rank."""
        coll["arrival"] = np.maximum(coll.pop("ready"), nccl["free"])
        end = np.full(R, coll["arrival"].max() + coll["transfer"], dtype=np.int64)
        coll["end"] = end
        nccl["free"] = end
        sim.gpu("kernel", nccl_kernel_name(coll["bytes"]), "nccl", coll["arrival"], end,
                coll["ext"], coll["corr"], k_nccl + coll["args"], coll=coll["index"])  # fmt: skip

    for s in range(S):
        sim.begin_step()
        coll_index = 0
        step_colls: list[dict[str, Any]] = []
        t0 = t
        step_start[s] = t0
        ps_index = len(sim.starts)
        sim.cpu("user_annotation", "ProfilerStep#", "main", t0, t0)  # number and end: later
        z0 = t0 + sim.us(5)
        z1 = z0 + sim.us(20)
        sim.cpu("user_annotation", "Optimizer.zero_grad#SGD.zero_grad", "main", z0, z1)
        d0 = z1 + sim.us(5)
        d1 = d0 + sim.us(c.input_ms * 1000) + input_extra
        input_ns[s] = d1 - d0
        sim.cpu("user_annotation", DATALOADER, "main", d0, d1)
        copy_ns = sim.us(c.input_bytes / (c.pcie_gbps * 1e9) * 1e6)
        t, _, _ = sim.op("main", d1 + sim.us(3), [("cpu_op", "aten::to"), ("cpu_op", "aten::_to_copy"),
                         ("cpu_op", "aten::copy_")], (H2D, copy_ns), compute, cat="gpu_memcpy",
                         kargs=f', "device": {dev}, "context": 1, "stream": {COMPUTE_STREAM}, '
                               f'"bytes": {c.input_bytes}')  # fmt: skip
        # forward (main thread)
        for _ in range(c.layers):
            t, _, _ = sim.op("main", t + sim.us(2), [("cpu_op", "aten::linear"), ("cpu_op", "aten::addmm")],
                             (GEMM_FWD, sim.us(c.fwd_kernel_us)), compute, kargs=k_gemm)  # fmt: skip
            t, _, _ = sim.op("main", t + sim.us(2), [("cpu_op", "aten::relu")],
                             (RELU_FWD, sim.us(c.relu_kernel_us)), compute, kargs=k_elem)  # fmt: skip
        t, _, _ = sim.op("main", t + sim.us(2), [("cpu_op", "aten::cross_entropy_loss"),
                         ("cpu_op", "aten::log_softmax"), ("cpu_op", "aten::_log_softmax")],
                         (SOFTMAX_FWD, sim.us(c.loss_kernel_us)), compute, kargs=k_elem)  # fmt: skip
        # backward (autograd thread); the main thread waits in loss.backward()
        a = t + sim.us(8)
        a, _, _ = sim.op("autograd", a, [("cpu_op", "autograd::engine::evaluate_function: LogSoftmaxBackward0"),
                         ("cpu_op", "LogSoftmaxBackward0"), ("cpu_op", "aten::_log_softmax_backward_data")],
                         (SOFTMAX_BWD, sim.us(c.loss_kernel_us)), compute, kargs=k_elem)  # fmt: skip
        scale = 1.0 + slow_extra[s] / bwd_gemm_base if bwd_gemm_base > 0 else np.ones(R)
        for pos in range(len(order)):
            a, _, _ = sim.op("autograd", a + sim.us(2), [("cpu_op", "autograd::engine::evaluate_function: ReluBackward0"),
                             ("cpu_op", "ReluBackward0"), ("cpu_op", "aten::threshold_backward")],
                             (RELU_BWD, sim.us(c.relu_kernel_us)), compute, kargs=k_elem)  # fmt: skip
            for g in range(2):
                dur = np.rint(sim.us(c.fwd_kernel_us) * scale).astype(np.int64)
                name = "autograd::engine::evaluate_function: AddmmBackward0"
                a, _, _ = sim.op("autograd", a + sim.us(2), [("cpu_op", name), ("cpu_op", "AddmmBackward0"),
                                 ("cpu_op", "aten::mm")], (GEMM_BWD[g], dur), compute, kargs=k_gemm)  # fmt: skip
            g0 = a + sim.us(2)
            g1 = g0 + sim.us(6)
            sim.cpu("cpu_op", "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
                    "autograd", g0, g1)  # fmt: skip
            a = g1
            k = bucket_of_pos[pos]
            if last_in_bucket[k] == pos:
                a, coll = allreduce("autograd", a + sim.us(3), sizes[k], "bucket", k, s)
                step_colls.append(coll)
        # the collectives resolve in launch order on the NCCL stream
        for coll in step_colls:
            finish(coll)
        # DDP finalize: the compute stream waits for every bucket's all-reduce
        for _ in step_colls:
            w1 = a + sim.us(2)
            sim.runtime("cudaStreamWaitEvent", "autograd", a, w1, 0, False, 147)
            a = w1
        compute["free"] = np.maximum(compute["free"], nccl["free"])
        # optimizer (main thread, after backward returns)
        t = np.maximum(t, a) + sim.us(10)
        o0 = t
        t = o0 + sim.us(15)
        for _ in range(c.buckets):
            t, _, _ = sim.op("main", t + sim.us(3), [("cpu_op", "aten::_foreach_add_")],
                             (OPTIMIZER, sim.us(c.optimizer_kernel_us)), compute, kargs=k_elem)  # fmt: skip
        t = t + sim.us(10)
        sim.cpu("user_annotation", "Optimizer.step#SGD.step", "main", o0, t)
        if c.metric_allreduce:
            t, coll = allreduce("main", t + sim.us(5), 4, "metric", -1, s)
            finish(coll)
            step_colls.append(coll)
            w0 = t + sim.us(2)
            w1 = w0 + sim.us(1)
            sim.runtime("cudaStreamWaitEvent", "main", w0, w1, 0, False, 147)
            t = w1
            compute["free"] = np.maximum(compute["free"], coll["end"])
        # loss.item(): a device-to-host copy the CPU waits for (the step's sync point)
        i0 = t + sim.us(5)
        i1 = i0 + sim.us(3)
        r0 = i1 + sim.us(2)
        r1 = r0 + sim.us(c.launch_us)
        m0 = np.maximum(r0 + lat, compute["free"])
        m1 = m0 + sim.us(2)
        compute["free"] = m1
        y0 = r1 + sim.us(1)
        y1 = np.maximum(y0 + sim.us(2), m1 + sim.us(3))
        i2 = y1 + sim.us(2)
        i3 = i2 + sim.us(2)
        sim.cpu("cpu_op", "aten::item", "main", i0, i3)
        ext = sim.cpu("cpu_op", "aten::_local_scalar_dense", "main", i1, i2).ext
        corr = sim.runtime("cudaMemcpyAsync", "main", r0, r1, ext, True, 41)
        sim.gpu("gpu_memcpy", D2H, "compute", m0, m1, ext, corr,
                f', "device": {dev}, "context": 1, "stream": {COMPUTE_STREAM}, "bytes": 4')  # fmt: skip
        sim.runtime("cudaStreamSynchronize", "main", y0, y1, ext, False, 131)
        t = i3 + sim.us(8)
        sim.ends[ps_index] = t
        step_end[s] = t
        st, en = sim.end_step()
        starts.append(st)
        ends.append(en)
        colls.extend(step_colls)
    for coll in colls:
        for key in ("ext", "corr", "args"):
            coll.pop(key)
    return Job(
        config=c,
        templates=sim.templates,
        start=np.stack(starts),
        end=np.stack(ends),
        collectives=colls,
        step_start=step_start,
        step_end=step_end,
        input_ns=input_ns,
        slow_steps=slow_steps,
        pids=pids,
        coll_per_step=coll_index,
    )
