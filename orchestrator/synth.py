"""``rankscope synth OUT_DIR``: a synthetic multi-GPU DDP job's Kineto traces, with ground truth.

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

Why one module of ~1110 lines: the synthetic job generator is one model (configuration,
simulation, truth, Kineto writer) that must stay independent of the analysis it tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankscope.errors import UsageError

if TYPE_CHECKING:
    import numpy as np

#: Kineto's base time: the start of the current "trimonth" (libkineto ChromeTraceBaseTime).
TRIMONTH_S = 7889238
#: The files the generator writes in OUT_DIR (and replaces with --overwrite).
RANK_FILE = "rank-{rank}.json.gz"
RANK_FILE_PATTERN = re.compile(r"^rank-\d+\.json\.gz$")
TRUTH_FILE = "truth.json"
#: GPU streams: compute (the default stream as torch's profiler shows it) and NCCL.
COMPUTE_STREAM = 7
NCCL_STREAM = 20
#: Kineto truncates long "Process Group Ranks" lists after this many ranks.
RANKS_TRUNCATE = 30
NCCL_VERSION = "2.21.5"
DATALOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


@dataclass
class SynthConfig:
    """One synthetic job. Times are ms or µs as the field names say; the truth is in ns."""

    ranks: int = 8
    """number of ranks (GPUs) in the job"""
    ranks_per_host: int = 8
    """GPUs per host; rank r runs on host r // ranks_per_host as local rank r % ranks_per_host"""
    steps: int = 5
    """profiled training steps (ProfilerStep ranges) per rank"""
    first_step: int = 0
    """number N of the first ProfilerStep#N (a profiler schedule's wait + warmup steps)"""
    seed: int = 0
    """seed of the random generator (jitter, which steps a straggler is slow in, pids)"""
    layers: int = 8
    """linear layers of the model (forward: GEMM + ReLU each; backward: two GEMMs + ReLU grad)"""
    fwd_kernel_us: float = 600.0
    """forward GEMM kernel time per layer (each backward GEMM takes the same)"""
    relu_kernel_us: float = 40.0
    """ReLU kernel time per layer (forward and backward)"""
    loss_kernel_us: float = 30.0
    """each of the two loss kernels (forward and backward)"""
    optimizer_kernel_us: float = 120.0
    """one optimizer (foreach) kernel per bucket"""
    cpu_op_us: float = 12.0
    """CPU time of one aten op around its kernel launch (split over the nested ranges)"""
    launch_us: float = 5.0
    """cudaLaunchKernel CPU time"""
    launch_latency_us: float = 4.0
    """earliest a kernel starts after its launch call began"""
    input_ms: float = 3.0
    """DataLoader __next__ time per step (before slow input)"""
    input_bytes: int = 8 << 20
    """bytes of the batch copied host to device each step"""
    pcie_gbps: float = 24.0
    """host-to-device copy bandwidth, GB/s (1e9 bytes/s)"""
    buckets: int = 4
    """DDP gradient buckets (one all-reduce each, in backward); layers are split evenly"""
    bucket_bytes: tuple[int, ...] = (25 << 20,)
    """bytes of each bucket (comma list, first bucket first; the last size repeats)"""
    link_gbps: float = 50.0
    """bus bandwidth of the ring all-reduce per rank, GB/s (1e9 bytes/s)"""
    link_latency_us: float = 15.0
    """fixed latency of every collective"""
    slow_link: float = 1.0
    """factor on every transfer time (a slow network: nobody's fault)"""
    metric_allreduce: bool = True
    """all-reduce the loss (one float) after the optimizer, then read it (loss.item())"""
    jitter: float = 0.02
    """relative random variation (lognormal sigma) of every kernel, CPU op and input time"""
    stragglers: list[tuple[int, float, float]] = field(default_factory=list)
    """(rank, extra ms, fraction): the rank's backward GEMMs take EXTRA_MS more per step in that
    fraction of steps (default 1; which steps: drawn by the seed, written to the truth)"""
    slow_input: list[tuple[int, float]] = field(default_factory=list)
    """(rank, extra ms): the rank's DataLoader takes EXTRA_MS more in every step"""
    clock_offset: list[tuple[int, float]] = field(default_factory=list)
    """(host, ms): the host's clock reads MS ahead of true time (written timestamps shift)"""
    clock_drift: list[tuple[int, float]] = field(default_factory=list)
    """(host, ppm): the host's clock runs PPM parts per million fast (from the first step's
    start)"""
    start_ns: int = 1_767_225_600_000_000_000
    """true time of the first step's start, ns since the Unix epoch (2026-01-01 UTC)"""

    def hosts(self) -> int:
        """Number of hosts."""
        return -(-self.ranks // self.ranks_per_host)

    def validate(self) -> None:
        """Raise :class:`UsageError` (one line) on values that make no job."""
        for name in ("ranks", "ranks_per_host", "steps", "layers", "buckets"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{_flag(name)}: must be at least 1, got {getattr(self, name)}")
        if self.first_step < 0:
            raise UsageError(f"--first-step: must be >= 0, got {self.first_step}")
        positive = ("link_gbps", "pcie_gbps", "slow_link")
        for name in positive:
            if not getattr(self, name) > 0:
                raise UsageError(f"--{_flag(name)}: must be > 0, got {getattr(self, name)}")
        nonneg = (
            "fwd_kernel_us", "relu_kernel_us", "loss_kernel_us", "optimizer_kernel_us",
            "cpu_op_us", "launch_us", "launch_latency_us", "input_ms", "link_latency_us",
            "jitter", "input_bytes",
        )  # fmt: skip
        for name in nonneg:
            if not getattr(self, name) >= 0:
                raise UsageError(f"--{_flag(name)}: must be >= 0, got {getattr(self, name)}")
        if self.jitter > 1:
            raise UsageError(f"--jitter: a relative variation up to 1, got {self.jitter}")
        if not self.bucket_bytes or any(b < 1 for b in self.bucket_bytes):
            raise UsageError(f"--bucket-bytes: sizes must be >= 1 byte, got {self.bucket_bytes}")
        if self.buckets > self.layers:
            raise UsageError(
                f"--buckets: at most one per layer ({self.layers}), got {self.buckets}"
            )
        seen: set[int] = set()
        for rank, extra, frac in self.stragglers:
            self._check_rank("--straggler", rank)
            if rank in seen:
                raise UsageError(f"--straggler: rank {rank} given twice")
            seen.add(rank)
            if not extra > 0:
                raise UsageError(f"--straggler: extra ms must be > 0, got {extra} (rank {rank})")
            if not 0 < frac <= 1:
                raise UsageError(f"--straggler: fraction must be in (0, 1], got {frac}")
        seen = set()
        for rank, extra in self.slow_input:
            self._check_rank("--slow-input", rank)
            if rank in seen:
                raise UsageError(f"--slow-input: rank {rank} given twice")
            seen.add(rank)
            if not extra > 0:
                raise UsageError(f"--slow-input: extra ms must be > 0, got {extra} (rank {rank})")
        for flag, pairs in (
            ("--clock-offset", self.clock_offset),
            ("--clock-drift", self.clock_drift),
        ):
            hosts = [h for h, _ in pairs]
            for h in hosts:
                if not 0 <= h < self.hosts():
                    raise UsageError(
                        f"{flag}: host {h} not in the job (hosts 0..{self.hosts() - 1})"
                    )
            if len(set(hosts)) != len(hosts):
                raise UsageError(f"{flag}: a host is given twice")
        if any(abs(ppm) > 1000 for _, ppm in self.clock_drift):
            raise UsageError("--clock-drift: at most 1000 ppm")

    def _check_rank(self, flag: str, rank: int) -> None:
        if not 0 <= rank < self.ranks:
            raise UsageError(f"{flag}: rank {rank} not in the job (ranks 0..{self.ranks - 1})")

    def bucket_sizes(self) -> list[int]:
        """Bytes of each of the ``buckets`` buckets (the last given size repeats)."""
        sizes = list(self.bucket_bytes)
        return [sizes[min(k, len(sizes) - 1)] for k in range(self.buckets)]

    def to_json(self) -> dict[str, Any]:
        """The configuration as JSON values (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["bucket_bytes"] = list(self.bucket_bytes)
        for key in ("stragglers", "slow_input", "clock_offset", "clock_drift"):
            out[key] = [list(v) for v in getattr(self, key)]
        return out


# ------------------------------------------------------------------------------ command line
def _flag(name: str) -> str:
    return name.replace("_", "-")


def _field_docs() -> dict[str, str]:
    """The attribute docstrings of :class:`SynthConfig` (the CLI's help), read from the source."""
    import ast
    import inspect
    import itertools

    try:
        tree = ast.parse(inspect.getsource(SynthConfig).lstrip())
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split()).replace("%", "%%")
    return docs


def _tuple_parser(flag: str, arity: tuple[int, int], kinds: tuple[type, ...], defaults: tuple):
    """A parser of ``A:B[:C]`` values (``arity`` = (least, most) parts) raising UsageError."""

    def parse(text: str) -> tuple:
        parts = text.split(":")
        if not arity[0] <= len(parts) <= arity[1]:
            raise UsageError(f"{flag}: expected {_METAVARS[flag]}, got {text!r}")
        try:
            values = [kind(p) for kind, p in zip(kinds, parts, strict=False)]
        except ValueError:
            raise UsageError(f"{flag}: expected {_METAVARS[flag]}, got {text!r}") from None
        return (*values, *defaults[len(values) - arity[0] :])

    return parse


_METAVARS = {
    "--straggler": "RANK:EXTRA_MS[:FRACTION]",
    "--slow-input": "RANK:EXTRA_MS",
    "--clock-offset": "HOST:MS",
    "--clock-drift": "HOST:PPM",
}
_LIST_FIELDS = {
    "stragglers": (
        "--straggler",
        _tuple_parser("--straggler", (2, 3), (int, float, float), (1.0,)),
    ),
    "slow_input": ("--slow-input", _tuple_parser("--slow-input", (2, 2), (int, float), ())),
    "clock_offset": ("--clock-offset", _tuple_parser("--clock-offset", (2, 2), (int, float), ())),
    "clock_drift": ("--clock-drift", _tuple_parser("--clock-drift", (2, 2), (int, float), ())),
}


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope synth``: one flag per :class:`SynthConfig` field (import-light)."""
    parser.add_argument("out", type=Path, metavar="OUT_DIR", help="folder to write the job into")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the rank files and truth.json of an earlier job in OUT_DIR",
    )
    docs = _field_docs()
    defaults = SynthConfig()
    for f in dataclasses.fields(SynthConfig):
        default = getattr(defaults, f.name)
        help_text = docs.get(f.name, "")
        if f.name in _LIST_FIELDS:
            flag, _ = _LIST_FIELDS[f.name]
            parser.add_argument(
                flag,
                dest=f.name,
                action="append",
                default=[],
                metavar=_METAVARS[flag],
                help=help_text.split(": ", 1)[-1] + " (repeatable)",
            )
        elif f.name == "bucket_bytes":
            parser.add_argument(
                "--bucket-bytes",
                dest=f.name,
                metavar="N[,N...]",
                default=",".join(str(b) for b in default),
                help=f"{help_text} (default {','.join(str(b) for b in default)})",
            )
        elif isinstance(default, bool):
            parser.add_argument(
                f"--{_flag(f.name)}",
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"{help_text} (default {'on' if default else 'off'})",
            )
        else:
            parser.add_argument(
                f"--{_flag(f.name)}",
                dest=f.name,
                metavar=type(default).__name__.upper(),
                default=None,
                help=f"{help_text} (default {default})",
            )


def config_from_args(args: argparse.Namespace) -> SynthConfig:
    """The :class:`SynthConfig` of parsed arguments (UsageError, one line, on a bad value)."""
    values: dict[str, Any] = {}
    defaults = SynthConfig()
    for f in dataclasses.fields(SynthConfig):
        raw = getattr(args, f.name, None)
        if f.name in _LIST_FIELDS:
            _, parse = _LIST_FIELDS[f.name]
            values[f.name] = [parse(v) for v in raw or []]
        elif f.name == "bucket_bytes":
            try:
                values[f.name] = tuple(int(v) for v in str(raw).split(",") if v.strip())
            except ValueError:
                raise UsageError(f"--bucket-bytes: expected N[,N...] bytes, got {raw!r}") from None
        elif raw is None:
            continue
        elif isinstance(getattr(defaults, f.name), bool):
            values[f.name] = bool(raw)
        else:
            kind = type(getattr(defaults, f.name))
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise UsageError(
                    f"--{_flag(f.name)}: expected {'an integer' if kind is int else 'a number'}, "
                    f"got {raw!r}"
                ) from None
    config = SynthConfig(**values)
    config.validate()
    return config


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rankscope synth``."""
    import time

    config = config_from_args(args)
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a folder")
    if out.is_dir() and not args.overwrite:
        old = [p.name for p in out.iterdir() if RANK_FILE_PATTERN.match(p.name)]
        if old or (out / TRUTH_FILE).exists():
            raise UsageError(
                f"{out}: holds a job already (rank files, truth.json); --overwrite replaces it"
            )
    t0 = time.perf_counter()
    summary = generate(config, out, overwrite=args.overwrite)
    seconds = time.perf_counter() - t0
    print(
        f"wrote {config.ranks} rank traces ({config.steps} steps, {summary['events']:,} events, "
        f"{summary['bytes'] / 1e6:.1f} MB) and {TRUTH_FILE} to {out} in {seconds:.1f} s"
    )
    return 0


# --------------------------------------------------------------------------------- simulation
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
        import numpy as np

        self.np = np
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
        np = self.np
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
        return self.np.stack(self.starts), self.np.stack(self.ends)

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
        np = self.np
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
    import numpy as np

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


# ------------------------------------------------------------------------------------- truth
def clock_params(config: SynthConfig) -> tuple[np.ndarray, np.ndarray]:
    """(offset ns [ranks], drift ppm [ranks]) of each rank's host clock."""
    import numpy as np

    host = np.arange(config.ranks) // config.ranks_per_host
    off_h = np.zeros(config.hosts())
    ppm_h = np.zeros(config.hosts())
    for h, ms in config.clock_offset:
        off_h[h] = ms
    for h, ppm in config.clock_drift:
        ppm_h[h] = ppm
    return np.rint(off_h[host] * 1e6).astype(np.int64), ppm_h[host]


def host_clock(config: SynthConfig, t: np.ndarray, offset: Any, ppm: Any) -> np.ndarray:
    """What a host clock (offset ns, drift ppm) reads at true times ``t`` (int64 ns)."""
    import numpy as np

    drift = np.rint((t - config.start_ns).astype(np.float64) * (np.asarray(ppm) * 1e-6))
    return t + offset + drift.astype(np.int64)


def truth(job: Job) -> dict[str, Any]:
    """Ground truth of ``job`` (see docs/synth.md, "truth.json")."""
    import numpy as np

    c = job.config
    R, S = c.ranks, c.steps
    kinds = np.array([t.kind for t in job.templates])
    lanes = np.array([t.lane for t in job.templates])
    cats = np.array([t.cat for t in job.templates])
    gpu = kinds == "gpu"
    on_compute = gpu & (lanes == "compute")
    is_kernel = on_compute & (cats == "kernel")
    is_nccl = gpu & (lanes == "nccl")
    dur = job.end - job.start  # [S, E, R]
    compute = dur[:, is_kernel, :].sum(axis=1)  # one stream: no overlap
    memcpy = dur[:, on_compute & ~is_kernel, :].sum(axis=1)
    comm = dur[:, is_nccl, :].sum(axis=1)
    # NCCL time overlapped by compute-stream work (intervals on one stream never overlap)
    cs, ce = job.start[:, on_compute, :][:, :, None, :], job.end[:, on_compute, :][:, :, None, :]
    ns, ne = job.start[:, is_nccl, :][:, None, :, :], job.end[:, is_nccl, :][:, None, :, :]
    overlap = np.clip(np.minimum(ce, ne) - np.maximum(cs, ns), 0, None).sum(axis=(1, 2))
    span = job.step_end - job.step_start
    busy = compute + memcpy + comm - overlap
    idle = span - busy
    exposed = comm - overlap
    wait = np.zeros((S, R), dtype=np.int64)
    coll_out = []
    first = c.first_step
    for i, coll in enumerate(job.collectives):
        arrival = coll["arrival"]
        last = int(arrival.max())
        wait[coll["step"]] += last - arrival
        coll_out.append({
            "id": i, "step": first + coll["step"], "seq": i + 1, "op": "allreduce",
            "group": "0", "kind": coll["kind"], "bucket": coll["bucket"], "bytes": coll["bytes"],
            "transfer_ns": coll["transfer"], "end_ns": int(coll["end"][0]),
            "last_rank": int(np.argmax(arrival)),
            "arrival_ns": [int(v) for v in arrival],
        })  # fmt: skip
    offset, ppm = clock_params(c)
    ranks = []
    for r in range(R):
        ranks.append({
            "rank": r, "host": r // c.ranks_per_host, "host_name": _host_name(r // c.ranks_per_host),
            "local_rank": r % c.ranks_per_host, "pid": int(job.pids[r]),
            "clock_offset_ns": int(offset[r]), "clock_drift_ppm": float(ppm[r]),
            "offset_to_rank0_ns": int(offset[0] - offset[r]),
            "compute_ns": int(compute[:, r].sum()), "memcpy_ns": int(memcpy[:, r].sum()),
            "comm_ns": int(comm[:, r].sum()), "exposed_comm_ns": int(exposed[:, r].sum()),
            "idle_ns": int(idle[:, r].sum()), "input_ns": int(job.input_ns[:, r].sum()),
            "wait_ns": int(wait[:, r].sum()), "span_ns": int(span[:, r].sum()),
            "steps": {
                "step": list(range(first, first + S)),
                "start_ns": job.step_start[:, r].tolist(), "end_ns": job.step_end[:, r].tolist(),
                "compute_ns": compute[:, r].tolist(), "memcpy_ns": memcpy[:, r].tolist(),
                "comm_ns": comm[:, r].tolist(), "exposed_comm_ns": exposed[:, r].tolist(),
                "idle_ns": idle[:, r].tolist(), "input_ns": job.input_ns[:, r].tolist(),
                "wait_ns": wait[:, r].tolist(),
            },
        })  # fmt: skip
    stragglers = [
        {"rank": rank, "cause": "own compute", "extra_ms": extra, "fraction": frac,
         "slow_steps": [first + s for s in job.slow_steps[rank]]}
        for rank, extra, frac in c.stragglers
    ] + [
        {"rank": rank, "cause": "input", "extra_ms": extra, "fraction": 1.0,
         "slow_steps": list(range(first, first + S))}
        for rank, extra in c.slow_input
    ]  # fmt: skip
    return {
        "generator": "rankscope synth",
        "units": "ns on the true clock (Unix epoch) unless the name says otherwise",
        "config": c.to_json(),
        "world_size": R,
        "hosts": c.hosts(),
        "t0_ns": c.start_ns,
        "stragglers": sorted(stragglers, key=lambda d: d["rank"]),
        "ranks": ranks,
        "collectives": coll_out,
    }


def _host_name(host: int) -> str:
    return f"node{host:03d}"


# ------------------------------------------------------------------------------------ writer
def _json_str(text: str) -> str:
    import json

    return json.dumps(text)


def _device_properties(devices: int) -> str:
    entries = []
    for d in range(devices):
        entries.append(
            f'\n    {{\n      "id": {d}, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045280768,\n'
            '      "computeMajor": 9, "computeMinor": 0,\n'
            '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
            '      "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,\n'
            '      "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233472,\n'
            '      "numSms": 132, "sharedMemPerBlockOptin": 232448\n    }'
        )
    return ",".join(entries)


def _formats(job: Job, rank: int) -> list[str]:
    """Per template, the %-format text of its event (and flow) for ``rank``."""
    c = job.config
    pid = int(job.pids[rank])
    device = rank % c.ranks_per_host
    tids = {"main": pid, "autograd": pid + 61, "compute": COMPUTE_STREAM, "nccl": NCCL_STREAM}
    out = []
    for t in job.templates:
        name = _json_str(t.name).replace("%", "%%")
        if t.name == "ProfilerStep#":
            name = '"ProfilerStep#%(n)d"'
        lane_pid = device if t.kind == "gpu" else pid
        tid = tids[t.lane]
        ids = ""
        if t.kind == "cpu":
            ids = '"External id": %(x)d'
        elif t.kind == "runtime":
            ids = '"External id": %(x)d, "correlation": %(c)d' if t.ext else '"correlation": %(c)d'
        else:
            ids = '"External id": %(x)d' if t.ext else ""
        args = t.args.replace('"device": 0,', f'"device": {device},').replace("%", "%%")
        if t.kind == "gpu":
            args = args.replace('"stream":', '"correlation": %(c)d, "stream":', 1)
        if t.coll >= 0:
            args += f', "Rank": {rank}, "Seq": %(q)d'
        body = (ids + args) if ids else args.lstrip(", ")
        text = (
            f'\n  {{\n    "ph": "X", "cat": "{t.cat}", "name": {name}, "pid": {lane_pid}, "tid": {tid},\n'
            '    "ts": %(tq)d.%(tm)03d, "dur": %(dq)d.%(dm)03d,\n'
            f'    "args": {{\n      {body}\n    }}\n  }},'
        )
        if t.kind == "runtime" and t.flow:
            text += (
                f'\n  {{\n    "ph": "s", "id": %(c)d, "pid": {pid}, "tid": {tid}, "ts": %(tq)d.%(tm)03d,\n'
                '    "cat": "ac2g", "name": "ac2g"\n  },'
            )
        elif t.kind == "gpu":
            text += (
                f'\n  {{\n    "ph": "f", "id": %(c)d, "pid": {device}, "tid": {tid}, "ts": %(tq)d.%(tm)03d,\n'
                '    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  },'
            )
        out.append(text)
    return out


def _metadata(job: Job, rank: int, ts: str) -> str:
    c = job.config
    pid = int(job.pids[rank])
    device = rank % c.ranks_per_host
    parts = []

    def meta(name: str, p: int | str, tid: int | str, key: str, value: str) -> None:
        parts.append(
            f'\n  {{\n    "name": "{name}", "ph": "M", "ts": {ts}, "pid": {p}, "tid": {tid},\n'
            f'    "args": {{\n      "{key}": {value}\n    }}\n  }},'
        )

    meta("process_name", pid, 0, "name", '"python3"')
    meta("process_labels", pid, 0, "labels", '"CPU"')
    meta("process_sort_index", pid, 0, "sort_index", str(pid))
    meta("process_name", device, 0, "name", '"python3"')
    meta("process_labels", device, 0, "labels", f'"GPU {device}"')
    meta("process_sort_index", device, 0, "sort_index", str(0x1000000 + device))
    for tid, label in ((pid, "python3"), (pid + 61, "pt_autograd_0")):
        meta("thread_name", pid, tid, "name", f'"thread {tid} ({label})"')
        meta("thread_sort_index", pid, tid, "sort_index", str(tid))
    for stream in (COMPUTE_STREAM, NCCL_STREAM):
        meta("thread_name", device, stream, "name", f'"stream {stream} "')
        meta("thread_sort_index", device, stream, "sort_index", str(stream))
    return "".join(parts)


def render_rank(job: Job, rank: int, base_ns: int) -> tuple[bytes, int]:
    """The Kineto JSON text of ``rank`` (timestamps on its host clock) and its event count."""
    import numpy as np

    c = job.config
    offset, ppm = clock_params(c)
    start = job.start[:, :, rank]
    end = job.end[:, :, rank]
    # the host clock, relative to Kineto's base time
    rs = host_clock(c, start, offset[rank], ppm[rank]) - base_ns
    re_ = host_clock(c, end, offset[rank], ppm[rank]) - base_ns
    d = re_ - rs
    tq, tm = np.divmod(rs, 1000)
    dq, dm = np.divmod(d, 1000)
    fmts = _formats(job, rank)
    corr_stride = max((t.corr for t in job.templates), default=0) + 8
    ext_stride = max((t.ext for t in job.templates), default=0) + 8
    corr_base = 1_000_000 + rank  # keep ids apart from External ids, as Kineto's are
    colls = np.array([t.coll for t in job.templates])
    exts = np.array([t.ext for t in job.templates])
    corrs = np.array([t.corr for t in job.templates])
    pieces = []
    events = 0
    for s in range(c.steps):
        xs = (exts + s * ext_stride).tolist()
        cs = (corrs + s * corr_stride + corr_base).tolist()
        qs = (colls + s * job.coll_per_step + 1).tolist()
        n = c.first_step + s
        for e, (fmt, a, b, p, q, x, cc, sq) in enumerate(
            zip(fmts, tq[s].tolist(), tm[s].tolist(), dq[s].tolist(), dm[s].tolist(), xs, cs, qs,
                strict=True)
        ):  # fmt: skip
            pieces.append(
                fmt % {"tq": a, "tm": b, "dq": p, "dm": q, "x": x, "c": cc, "q": sq, "n": n}
            )
            events += 1 + (job.templates[e].kind == "gpu" or job.templates[e].flow)
    first = int(rs.min())
    last = int((rs + d).max())
    first_ts = f"{first // 1000}.{first % 1000:03d}"
    span = last - first
    trace_span = (
        f'\n  {{\n    "ph": "X", "cat": "Trace", "ts": {first_ts}, "dur": {span // 1000}.{span % 1000:03d},\n'
        '    "pid": "Spans", "tid": "PyTorch Profiler",\n'
        f'    "name": "PyTorch Profiler (0)",\n    "args": {{\n      "Op count": 0\n    }}\n  }},'
        f'\n  {{\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
        f'    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": {first_ts}\n  }},'
    )
    end_ts = f"{last // 1000}.{last % 1000:03d}"
    ranks = ", ".join(str(r) for r in range(c.ranks))
    head = (
        '\n{\n  "schemaVersion": 1,\n  "deviceProperties": ['
        + _device_properties(c.ranks_per_host)
        + "\n  ],"
        + f'\n  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {c.ranks}, '
        f'"pg_count": 1, "pg_config": [{{"pg_name": "0", "pg_desc": "default_pg", '
        f'"backend_config": "cuda:nccl", "pg_size": {c.ranks}, "ranks": [{ranks}]}}], '
        f'"nccl_version": "{NCCL_VERSION}"}},'
        '\n  "cuda_runtime_version": 12040,\n  "cuda_driver_version": 12040,'
        f'\n  "host_name": "{_host_name(rank // c.ranks_per_host)}",'
        '\n  "traceEvents": ['
    )
    tail = (
        f'\n  {{\n    "name": "Record Window End", "ph": "i", "s": "g",\n    "pid": "", "tid": "", "ts": {end_ts}\n  }}\n  ],'
        f'\n  "traceName": "/tmp/traces/{_host_name(rank // c.ranks_per_host)}_{int(job.pids[rank])}.pt.trace.json",'
        f'\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {base_ns}\n}}'
    )
    text = head + _metadata(job, rank, first_ts) + trace_span + "".join(pieces) + tail
    return text.encode(), events + 3


def base_time_ns(config: SynthConfig) -> int:
    """Kineto's ``baseTimeNanoseconds``, the same for every rank: the trimonth boundary at or
    before the earliest host-clock reading (so no timestamp is negative)."""
    offset, _ = clock_params(config)
    earliest = config.start_ns + min(0, int(offset.min())) - 10**9
    return (earliest // 10**9 // TRIMONTH_S) * TRIMONTH_S * 10**9


def generate(config: SynthConfig, out: Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Simulate ``config`` and write ``out/rank-N.json.gz`` for every rank and ``out/truth.json``.

    Deterministic: the same config (seed included) writes byte-identical files. Returns a
    summary ``{"events", "bytes", "files"}``. With ``overwrite``, earlier rank files and
    truth.json in ``out`` are removed first.
    """
    import json
    import os
    import zlib

    job = simulate(config)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for p in out.iterdir():
            if RANK_FILE_PATTERN.match(p.name) or p.name == TRUTH_FILE:
                p.unlink()
    base = base_time_ns(config)
    total_events = 0
    total_bytes = 0
    files = []
    for rank in range(config.ranks):
        text, events = render_rank(job, rank, base)
        total_events += events
        total_bytes += len(text)
        # gzip with a fixed header (no name, mtime 0): byte-identical for the same config
        comp = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        data = comp.compress(text) + comp.flush()
        path = out / RANK_FILE.format(rank=rank)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        files.append(path)
    result = truth(job)
    result["base_time_ns"] = base
    tmp = out / f".{TRUTH_FILE}.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out / TRUTH_FILE)
    return {"events": total_events, "bytes": total_bytes, "files": files}
