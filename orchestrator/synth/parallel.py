"""The tensor x pipeline x data parallel (and FSDP) job of ``rankscope synth``: a dependency-driven
simulation of one program per rank.

Each rank runs its program (:class:`_Rank`, a generator) on one CPU cursor, a compute stream and
one NCCL stream per use (TP, DP, the pipeline neighbours, embedding, grad norm), all in integer
ns of a true clock. Ranks meet only at rendezvous (:func:`_run`):

* a **collective** of a group: each member posts when its kernel can start (launched, the
  compute stream reached the event recorded at the launch, the previous op on its NCCL stream
  ended: its *arrival*); it ends on every member at the last arrival + the transfer
  (:func:`.comm.transfer_ns`);
* a **send / recv** pair (the k-th send from s to d meets the k-th recv on d from s): both end
  at max(send start, recv start) + transfer. A send blocks like NCCL's: it ends only once the
  recv is posted and the bytes moved.

A step (Megatron-Core's ``train_step``): DataLoader, the schedule (1F1B or GPipe over the
microbatches: forward and backward per stage, with send/recv of activations and gradients
between neighbouring stages of the same (tp, dp), each exchange followed by
``torch.cuda.synchronize`` as Megatron's ``batch_p2p_sync`` does), TP all-reduces in each layer
(two forward, two backward), the DP gradient reduce-scatter (or all-reduce) per bucket during the
last microbatch's backward — or, FSDP, a per-layer parameter all-gather before each layer's
forward and backward and a gradient reduce-scatter after its last backward —, the embedding
all-reduce between first and last stage, the grad-norm all-reduce, the optimizer, the parameter
all-gather (distributed optimizer), ``loss.item()``.

Faults are multipliers and pauses on that program, never a change of its random draws: jitter
comes from one stream per rank, the fault draws from their own streams, so the same job without a
fault (:mod:`.parallel_truth`) draws the same numbers (except the extra layers of stage
imbalance, which draw their own).

Why one module of ~540 lines: one rank's program (the schedule, the layers' collectives, the
faults applied to it) and the rendezvous that advances every rank's program are one simulation,
read together; the groups and the transfer times live in ``layout.py`` and ``comm.py``.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from rankscope.orchestrator.synth.comm import (
    COLL_NAMES,
    CollOp,
    comm_args,
    kernel_name,
    p2p_names,
    transfer_ns,
)
from rankscope.orchestrator.synth.config import (
    COMPUTE_STREAM,
    DATALOADER,
    GC_EVENT_NAME,
    Schedule,
    SynthConfig,
)
from rankscope.orchestrator.synth.ddp import (
    D2H,
    GEMM_BWD,
    GEMM_FWD,
    H2D,
    OPTIMIZER,
    SOFTMAX_BWD,
    SOFTMAX_FWD,
    _kargs,
)
from rankscope.orchestrator.synth.engine import Post, Program, Rendezvous, Wait, run, schedule
from rankscope.orchestrator.synth.layout import Layout, Role, megatron_layout, torchtitan_layout

#: GPU streams per use (Kineto's stream ids; compute is the default stream).
STREAMS = {"compute": COMPUTE_STREAM, "tp": 20, "dp": 24, "pp_prev": 28, "pp_next": 32,
           "embedding": 36, "norm": 40}  # fmt: skip
#: Lane of each group role's collectives.
ROLE_LANE = {Role.TP: "tp", Role.DP: "dp", Role.EMBEDDING: "embedding", Role.WORLD: "norm",
             Role.MODEL: "norm"}  # fmt: skip
#: The kernel of the word embedding (forward) and its gradient (backward).
EMBEDDING_FWD = "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)"
EMBEDDING_BWD = "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>(long const*, float const*, float*, int, long, int, int)"
NORM_KERNEL = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::NormTwoOps<float, float, float>, unsigned int, float, 4>)"
#: Jitter factors drawn at a time per rank.
JITTER_BLOCK = 4096


class Phase(NamedTuple):
    """One microbatch's forward or backward on a rank (true ns): the schedule's order."""

    step: int
    kind: str
    """F or B"""
    mb: int
    start: int
    end: int


@dataclass(slots=True)
class Event:
    """One trace event of one rank: ``args`` is the JSON body after the ids (leading comma)."""

    kind: str
    """cpu, runtime or gpu"""
    cat: str
    name: str
    lane: str
    start: int
    end: int
    ext: int = 0
    corr: int = 0
    flow: bool = False
    args: str = ""


@dataclass
class ParallelJob:
    """A simulated parallel job (true clock, ns)."""

    config: SynthConfig
    layout: Layout
    events: list[list[Event]]
    """per rank, in program order"""
    step_start: np.ndarray
    """int64 [steps, ranks]"""
    step_end: np.ndarray
    compute_ns: np.ndarray
    """int64 [steps, ranks]: compute kernel time (one stream: their sum)"""
    rendezvous: list[Rendezvous]
    """every collective and send/recv pair, in the order they resolved"""
    phases: list[list[Phase]]
    slow_steps: dict[int, list[int]]
    """slow worker rank -> its slow step indices"""
    gc: list[dict[str, int]]
    """GC pauses: rank, step (index), mb, start_ns, ns"""
    data_factor: np.ndarray
    """float [steps, dp, microbatches]: the work factor of each microbatch (1 without imbalance)"""
    pids: np.ndarray


def layout_of(config: SynthConfig) -> Layout:
    """The job's groups: Megatron-Core's, or torchtitan's DeviceMesh ones for FSDP."""
    make = torchtitan_layout if config.fsdp else megatron_layout
    return make(config.tp, config.pp, config.dp_size())


class _Rank:
    """One rank's program and state (docstring of the module)."""

    def __init__(self, job: _Build, rank: int) -> None:
        self.b = job
        self.c = job.c
        self.rank = rank
        self.co = job.layout.coords(rank)
        self.device = rank % self.c.ranks_per_host
        self.cpu = self.c.start_ns
        self.free = dict.fromkeys(STREAMS, self.c.start_ns)
        self.pending: dict[str, tuple[Rendezvous, Event]] = {}
        self.events: list[Event] = []
        self.phases: list[Phase] = []
        self.next_ext = 1
        self.next_corr = 1_000_000 + rank
        self.seq: dict[str, int] = {}
        self.p2p_count: dict[tuple[int, int], int] = {}
        self.rng = np.random.default_rng([self.c.seed, 1, rank])
        self.jit = np.ones(0)
        self.ji = 0
        self.scale = 1.0
        self.step = 0
        self.lat = round(self.c.launch_latency_us * 1000)
        self.k_gemm = _kargs(self.device, COMPUTE_STREAM, "[132, 8, 1]", "[384, 1, 1]", 168, 213248)
        self.k_elem = _kargs(self.device, COMPUTE_STREAM, "[8192, 1, 1]", "[128, 1, 1]", 26, 0)
        self.compute_ns = np.zeros(self.c.steps, dtype=np.int64)

    # ---------------------------------------------------------------------------- primitives
    def us(self, value: float) -> int:
        """``value`` µs in ns, jittered (lognormal, mean 1, sigma ``jitter``; one stream)."""
        j = self.c.jitter
        if j == 0:
            return round(value * 1000.0)
        if self.ji >= len(self.jit):
            self.jit = self.rng.lognormal(-j * j / 2, j, JITTER_BLOCK)
            self.ji = 0
        f = float(self.jit[self.ji])
        self.ji += 1
        return round(value * 1000.0 * f)

    def cpu_event(
        self, cat: str, name: str, lane: str, start: int, end: int, args: str = ""
    ) -> int:
        ext = self.next_ext
        self.next_ext += 1
        self.events.append(Event("cpu", cat, name, lane, start, end, ext=ext, args=args))
        return ext

    def runtime(self, name: str, lane: str, start: int, end: int, ext: int, cbid: int,
                launch: bool = True) -> int:  # fmt: skip
        corr = self.next_corr
        self.next_corr += 8
        self.events.append(Event("runtime", "cuda_runtime", name, lane, start, end, ext=ext,
                                 corr=corr, flow=launch, args=f', "cbid": {cbid}'))  # fmt: skip
        return corr

    def op(self, lane: str, chain: list[str], kernel: str, dur: int, kargs: str,
           cat: str = "kernel", stream: str = "compute") -> None:  # fmt: skip
        """Nested CPU ops ``chain`` (outer first) at the CPU cursor, the innermost launching
        ``kernel`` (``dur`` ns) on ``stream``; the cursor moves past the ops."""
        per = self.c.cpu_op_us / (2 * len(chain) + 1)
        starts = []
        t = self.cpu + self.us(2)
        for _ in chain:
            starts.append(t)
            t += self.us(per)
        r0, r1 = t, t + self.us(self.c.launch_us)
        ks = max(r0 + self.lat, self.free[stream])
        ke = ks + dur
        self.free[stream] = ke
        t = r1
        ends = []
        for _ in chain:
            t += self.us(per)
            ends.append(t)
        ext = 0
        for name, s, e in zip(chain, starts, reversed(ends), strict=True):
            ext = self.cpu_event("cpu_op", name, lane, s, e)
        runtime = "cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync"
        corr = self.runtime(runtime, lane, r0, r1, ext, 211 if cat == "kernel" else 41)
        self.events.append(Event("gpu", cat, kernel, stream, ks, ke, ext=ext, corr=corr,
                                 args=kargs))  # fmt: skip
        if cat == "kernel" and stream == "compute":
            self.compute_ns[self.step] += dur
        self.cpu = t

    def compute(self, lane: str, chain: list[str], kernel: str, base_us: float, work: float,
                kargs: str) -> None:  # fmt: skip
        """A compute kernel of ``base_us`` x ``work`` (data factor) x the slow-worker factor."""
        self.op(lane, chain, kernel, round(self.us(base_us) * work * self.scale), kargs)

    # ------------------------------------------------------------------------ communication
    def settle(self, lane: str) -> Generator[Post | Wait, Any, int]:
        """Wait for the op in flight on ``lane`` (its kernel is recorded then); its end."""
        if lane not in self.pending:
            return self.free[lane]
        rdv, kernel = self.pending.pop(lane)
        end = yield Wait(rdv)
        kernel.end = end
        self.free[lane] = end
        return end

    def post(self, lane: str, cpu_lane: str, op: CollOp, names: tuple[str, str], group: Any,
             nbytes: int, key: tuple[Any, ...], seq: int, peer: int, kind: str,
             info: dict[str, Any]) -> Generator[Post | Wait, Any, Rendezvous]:  # fmt: skip
        """Record the CPU side of an NCCL op, post its arrival; the kernel is in flight on
        ``lane`` (``settle`` ends it)."""
        yield from self.settle(lane)
        rpc, kern = comm_args(op, group, nbytes, rank=self.rank, seq=seq, peer=peer,
                              peer_args=self.c.p2p_peer_args)  # fmt: skip
        per = self.c.cpu_op_us / 5
        a0 = self.cpu + self.us(3)
        a1 = a0 + self.us(per)
        a2 = a1 + self.us(per)
        w0 = a2 + self.us(per / 2)
        w1 = w0 + self.us(1.0)
        l0 = w1 + self.us(per / 2)
        l1 = l0 + self.us(self.c.launch_us)
        e2 = l1 + self.us(per / 2)
        e1 = e2 + self.us(per / 2)
        e0 = e1 + self.us(per)
        self.cpu_event("cpu_op", names[0], cpu_lane, a0, e0)
        self.cpu_event("cpu_op", "record_param_comms", cpu_lane, a1, e1, args=rpc)
        ext = self.cpu_event("user_annotation", names[1], cpu_lane, a2, e2)
        self.runtime("cudaStreamWaitEvent", cpu_lane, w0, w1, ext, 147, launch=False)
        corr = self.runtime("cudaLaunchKernel", cpu_lane, l0, l1, ext, 211)
        self.cpu = e0
        ready = max(l0 + self.lat, self.free["compute"], self.free[lane])
        kargs = _kargs(self.device, STREAMS[lane], "[32, 1, 1]", "[640, 1, 1]", 96, 87328)
        kernel = Event("gpu", "kernel", kernel_name(op, nbytes), lane, ready, ready, ext=ext,
                       corr=corr, args=kargs + kern)  # fmt: skip
        self.events.append(kernel)
        xfer = transfer_ns(self.c, op, group.ranks if peer < 0 else (self.rank, peer), nbytes)
        info = {"op": op.value, "kind": kind, "step": self.step, "bytes": nbytes, **info}
        members = len(group.ranks) if peer < 0 else 2
        rdv = yield Post(key, members, xfer, self.rank, ready, info)
        self.pending[lane] = (rdv, kernel)
        return rdv

    def collective(self, role: Role, op: CollOp, nbytes: int, kind: str, cpu_lane: str,
                   wait: bool = True) -> Generator[Post | Wait, Any, None]:  # fmt: skip
        """A collective of the rank's ``role`` group (none for a group of one); with ``wait`` the
        compute stream waits for it."""
        group = self.b.layout.group(role, self.rank)
        if group is None or len(group.ranks) == 1:
            return
        seq = self.seq.get(group.name, 0) + 1
        self.seq[group.name] = seq
        lane = ROLE_LANE[role]
        info = {"group": group.name, "desc": group.desc, "seq": seq, "ranks": list(group.ranks)}
        yield from self.post(lane, cpu_lane, op, (COLL_NAMES[op].c10d, COLL_NAMES[op].work),
                             group, nbytes, ("c", group.name, seq), seq, -1, kind, info)  # fmt: skip
        if wait:
            end = yield from self.settle(lane)
            self.free["compute"] = max(self.free["compute"], end)

    def exchange(self, ops: list[tuple[CollOp, int, int]]) -> Generator[Post | Wait, Any, None]:
        """One p2p exchange with a neighbouring stage (forward direction first on each pair
        stream), then ``torch.cuda.synchronize`` (Megatron's batch_p2p_sync)."""
        group = self.b.layout.group(Role.PP, self.rank)
        assert group is not None
        me = self.co.pp
        fwd = sorted(ops, key=lambda o: (o[1] > me) != (o[0] is CollOp.SEND))
        for op, stage, mb in fwd:
            peer = group.ranks[stage]
            src, dst = (self.rank, peer) if op is CollOp.SEND else (peer, self.rank)
            k = self.p2p_count.get((src, dst), 0)
            self.p2p_count[(src, dst)] = k + 1
            seq = self.seq.get("p2p:" + group.name, 0) + 1
            self.seq["p2p:" + group.name] = seq
            lane = "pp_next" if stage > me else "pp_prev"
            what = "activation" if (op is CollOp.SEND) == (stage > me) else "gradient"
            info = {"group": group.name, "src": src, "dst": dst, "mb": mb, "what": what}
            names = p2p_names(op, me, stage)
            yield from self.post(lane, "main", op, (names.c10d, names.work), group,
                                 self.c.activation_bytes, ("p", src, dst, k), seq, peer, what,
                                 info)  # fmt: skip
            yield from self.settle(lane)
        yield from self.device_sync("cudaDeviceSynchronize", 0)

    def device_sync(self, name: str, ext: int) -> Generator[Post | Wait, Any, None]:
        """The CPU waits for every stream (what is in flight is settled first)."""
        for lane in list(self.pending):
            yield from self.settle(lane)
        y0 = self.cpu + self.us(1)
        done = max(self.free.values())
        y1 = max(y0 + self.us(2), done + self.us(3))
        self.runtime(name, "main", y0, y1, ext, 131 if name == "cudaStreamSynchronize" else 165,
                     launch=False)  # fmt: skip
        self.cpu = y1
        self.free["compute"] = max(self.free["compute"], done)

    # ------------------------------------------------------------------------------ program
    def program(self) -> Program:
        """Every step of this rank (the module docstring)."""
        for s in range(self.c.steps):
            yield from self.train_step(s)

    def train_step(self, s: int) -> Program:
        c, co = self.c, self.co
        self.step = s
        self.scale = float(self.b.slow_factor[s, self.rank])
        first_stage, last_stage = co.pp == 0, co.pp == c.pp - 1
        start = self.cpu
        step_event = Event("cpu", "user_annotation", f"ProfilerStep#{c.first_step + s}", "main",
                           start, start)  # fmt: skip
        step_event.ext = self.next_ext
        self.next_ext += 1
        self.events.append(step_event)
        z0 = start + self.us(5)
        z1 = z0 + self.us(20)
        self.cpu_event("user_annotation", "Optimizer.zero_grad#DistributedOptimizer.zero_grad",
                       "main", z0, z1)  # fmt: skip
        d0 = z1 + self.us(5)
        d1 = d0 + self.us(c.input_ms * 1000) + int(self.b.input_extra[self.rank])
        self.cpu_event("user_annotation", DATALOADER, "main", d0, d1)
        self.cpu = d1
        self.op("main", ["aten::to", "aten::_to_copy", "aten::copy_"], H2D,
                self.us(c.input_bytes / (c.pcie_gbps * 1e9) * 1e6),
                f', "device": {self.device}, "context": 1, "stream": {COMPUTE_STREAM}, '
                f'"bytes": {c.input_bytes}', cat="gpu_memcpy")  # fmt: skip
        layers = c.layers_of_stage(co.pp)
        work = self.b.data_factor[s, co.dp]
        gc = self.b.gc_at.get((self.rank, s))
        for action, arg in schedule(Schedule(c.schedule), c.pp, co.pp, c.microbatches):
            if action == "X":
                yield from self.exchange(arg)
                continue
            mb = int(arg)
            begin = self.free["compute"]
            if action == "F":
                if gc is not None and gc[0] == mb:
                    self.b.gc.append({"rank": self.rank, "step": s, "mb": mb,
                                      "start_ns": self.cpu, "ns": gc[1]})  # fmt: skip
                    if c.gc_events:  # as torch writes it (with_stack, record_python_gc_info)
                        self.cpu_event("python_function", GC_EVENT_NAME, "main", self.cpu,
                                       self.cpu + gc[1])  # fmt: skip
                    self.cpu += gc[1]
                yield from self.forward(layers, float(work[mb]), first_stage, last_stage)
            else:
                last_mb = mb == c.microbatches - 1  # the last backward in both schedules
                yield from self.backward(layers, float(work[mb]), first_stage, last_stage, last_mb)
            self.phases.append(Phase(s, action, mb, begin, self.free["compute"]))
        yield from self.finalize(first_stage, last_stage)
        # loss.item(): a device-to-host copy the CPU waits for (the step's end)
        i0 = self.cpu + self.us(5)
        self.cpu = i0 + self.us(3)
        self.op("main", ["aten::_local_scalar_dense"], D2H, self.us(2),
                f', "device": {self.device}, "context": 1, "stream": {COMPUTE_STREAM}, '
                '"bytes": 4', cat="gpu_memcpy")  # fmt: skip
        yield from self.device_sync("cudaStreamSynchronize", self.events[-1].ext)
        self.cpu += self.us(8)
        self.cpu_event("cpu_op", "aten::item", "main", i0, self.cpu - self.us(2))
        step_event.end = self.cpu
        self.b.step_start[s, self.rank] = start
        self.b.step_end[s, self.rank] = self.cpu

    def forward(self, layers: int, work: float, first: bool, last: bool) -> Program:
        c = self.c
        if first:
            self.compute("main", ["aten::embedding", "aten::index_select"], EMBEDDING_FWD,
                         c.relu_kernel_us, work, self.k_elem)  # fmt: skip
            yield from self.collective(Role.TP, CollOp.ALLREDUCE, c.activation_bytes, "tp", "main")
        for _ in range(layers):
            if c.fsdp:
                yield from self.collective(Role.DP, CollOp.ALL_GATHER,
                                           c.layer_bytes // c.dp_size(), "fsdp_param", "main")  # fmt: skip
            for _half in range(2):  # attention, then MLP: column- then row-parallel GEMMs
                self.compute("main", ["aten::linear", "aten::addmm"], GEMM_FWD,
                             c.fwd_kernel_us, work, self.k_gemm)  # fmt: skip
                yield from self.collective(Role.TP, CollOp.ALLREDUCE, c.activation_bytes, "tp",
                                           "main")  # fmt: skip
        if last:
            self.compute("main", ["aten::cross_entropy_loss", "aten::_log_softmax"], SOFTMAX_FWD,
                         c.loss_kernel_us, work, self.k_elem)  # fmt: skip

    def backward(self, layers: int, work: float, first: bool, last: bool,
                 last_mb: bool) -> Program:  # fmt: skip
        c = self.c
        lane = "autograd"
        if last:
            self.compute(lane, ["autograd::engine::evaluate_function: LogSoftmaxBackward0",
                                "aten::_log_softmax_backward_data"], SOFTMAX_BWD,
                         c.loss_kernel_us, work, self.k_elem)  # fmt: skip
        sizes = c.stage_buckets(self.co.pp)
        bucket_of = [min(len(sizes) - 1, i * len(sizes) // layers) for i in range(layers)]
        for pos in range(layers):
            if c.fsdp:
                yield from self.collective(Role.DP, CollOp.ALL_GATHER,
                                           c.layer_bytes // c.dp_size(), "fsdp_param", lane)  # fmt: skip
            for _half in range(2):  # MLP, then attention: two GEMMs each (input and weight grad)
                for g in range(2):
                    self.compute(lane, ["autograd::engine::evaluate_function: AddmmBackward0",
                                        "AddmmBackward0", "aten::mm"], GEMM_BWD[g],
                                 c.fwd_kernel_us, work, self.k_gemm)  # fmt: skip
                yield from self.collective(Role.TP, CollOp.ALLREDUCE, c.activation_bytes, "tp",
                                           lane)  # fmt: skip
            if not last_mb:
                continue
            if c.fsdp:
                yield from self.collective(Role.DP, CollOp.REDUCE_SCATTER, c.layer_bytes,
                                           "fsdp_grad", lane, wait=False)  # fmt: skip
            elif pos == layers - 1 or bucket_of[pos + 1] != bucket_of[pos]:
                op = CollOp.REDUCE_SCATTER if c.dist_optimizer else CollOp.ALLREDUCE
                yield from self.collective(Role.DP, op, sizes[bucket_of[pos]], "dp_grad", lane,
                                           wait=False)  # fmt: skip
        if first:
            self.compute(lane, ["autograd::engine::evaluate_function: EmbeddingBackward0",
                                "aten::embedding_dense_backward"], EMBEDDING_BWD,
                         c.relu_kernel_us, work, self.k_elem)  # fmt: skip

    def finalize(self, first: bool, last: bool) -> Program:
        """finalize_model_grads, grad norm, optimizer, parameter all-gather."""
        c = self.c
        end = yield from self.settle("dp")
        self.free["compute"] = max(self.free["compute"], end)
        if c.pp > 1 and not c.fsdp and (first or last):
            yield from self.collective(Role.EMBEDDING, CollOp.ALLREDUCE, c.embedding_bytes,
                                       "embedding", "main")  # fmt: skip
        self.op("main", ["aten::linalg_vector_norm"], NORM_KERNEL, self.us(c.relu_kernel_us),
                self.k_elem)  # fmt: skip
        norm_role = Role.WORLD if (c.dist_optimizer or c.fsdp) else Role.MODEL
        yield from self.collective(norm_role, CollOp.ALLREDUCE, 4, "grad_norm", "main")
        o0 = self.cpu + self.us(10)
        self.cpu = o0 + self.us(15)
        for _ in c.stage_buckets(self.co.pp):
            self.compute("main", ["aten::_foreach_add_"], OPTIMIZER, c.optimizer_kernel_us, 1.0,
                         self.k_elem)  # fmt: skip
        self.cpu += self.us(10)
        self.cpu_event("user_annotation", "Optimizer.step#DistributedOptimizer.step", "main", o0,
                       self.cpu)  # fmt: skip
        if c.dist_optimizer and not c.fsdp:
            for size in c.stage_buckets(self.co.pp):
                yield from self.collective(Role.DP, CollOp.ALL_GATHER, size // c.dp_size(),
                                           "dp_param", "main")  # fmt: skip


class _Build:
    """What the ranks share: config, layout, fault draws, and the per-step figures they fill."""

    def __init__(self, config: SynthConfig) -> None:
        c = config
        self.c = c
        self.layout = layout_of(c)
        S, R = c.steps, c.ranks
        self.step_start = np.zeros((S, R), dtype=np.int64)
        self.step_end = np.zeros((S, R), dtype=np.int64)
        self.pids = np.random.default_rng(c.seed).integers(1000, 4_000_000, R)
        faults = np.random.default_rng([c.seed, 2])
        self.slow_factor = np.ones((S, R))
        self.slow_steps: dict[int, list[int]] = {}
        for rank, factor, frac in c.slow_worker:
            k = max(1, round(frac * S))
            chosen = sorted(int(s) for s in faults.choice(S, size=k, replace=False))
            self.slow_steps[rank] = chosen
            self.slow_factor[chosen, rank] = factor
        self.input_extra = np.zeros(R, dtype=np.int64)
        for rank, extra_ms in c.slow_input:
            self.input_extra[rank] += round(extra_ms * 1e6)
        gc_rng = np.random.default_rng([c.seed, 3])
        self.gc_at: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, ms, frac in c.gc_pause:
            k = max(1, round(frac * S))
            for s in sorted(int(s) for s in gc_rng.choice(S, size=k, replace=False)):
                self.gc_at[(rank, s)] = (int(gc_rng.integers(c.microbatches)), round(ms * 1e6))
        self.gc: list[dict[str, int]] = []
        shape = (S, c.dp_size(), c.microbatches)
        draws = np.random.default_rng([c.seed, 4]).standard_normal(shape)
        self.data_factor = np.exp(c.data_imbalance * draws) if c.data_imbalance else np.ones(shape)


def simulate_parallel(config: SynthConfig) -> ParallelJob:
    """Simulate a tensor x pipeline x data parallel job (no files)."""
    config.validate()
    b = _Build(config)
    ranks = {r: _Rank(b, r) for r in range(config.ranks)}
    resolved = run({r: rk.program() for r, rk in ranks.items()})
    return ParallelJob(
        config=config,
        layout=b.layout,
        events=[ranks[r].events for r in range(config.ranks)],
        step_start=b.step_start,
        step_end=b.step_end,
        compute_ns=np.stack([ranks[r].compute_ns for r in range(config.ranks)], axis=1),
        rendezvous=resolved,
        phases=[ranks[r].phases for r in range(config.ranks)],
        slow_steps=b.slow_steps,
        gc=b.gc,
        data_factor=b.data_factor,
        pids=b.pids,
    )
