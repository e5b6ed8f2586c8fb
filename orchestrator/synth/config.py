"""The configuration of a synthetic job (:class:`SynthConfig`), its enums and file names.

Every field has a docstring: the command line's flags and help are generated from the fields
(:class:`rankscope.config_flags.Flags`, in :mod:`.cli`); a field whose flag is not its name, or
whose value is not one number, says so with :func:`~rankscope.config_flags.flag`. A job is a DDP
job (:mod:`.ddp`, one process group) unless ``tp``, ``pp`` or ``fsdp`` ask for a tensor x
pipeline x data parallel one (:mod:`.parallel`); the fault fields say which kind of job they
apply to (``validate`` refuses the others, one line each).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rankscope.config_flags import colon_tuple, flag, flag_of
from rankscope.errors import UsageError

#: The name torch's profiler gives a Python garbage collection's event (``record_python_gc_info``),
#: spelled here, not taken from the analysis: the generator imitates torch on its own.
GC_EVENT_NAME = "Python GC"
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


def _bucket_sizes(text: str) -> tuple[int, ...]:
    """``--bucket-bytes``: a comma list of byte counts (empty entries skipped)."""
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"expected N[,N...] bytes, got {text!r}") from None


def _items(name: str, metavar: str, *kinds: type, defaults: tuple[Any, ...] = ()) -> Any:
    """The flag of a list of faults, given once per item: ``--NAME A:B[:C]``."""
    return flag(name=name, metavar=metavar, parse=colon_tuple(*kinds, defaults=defaults))


class Schedule(StrEnum):
    """Pipeline schedule of a parallel job (Megatron-Core's names)."""

    ONE_F_ONE_B = "1f1b"
    """warmup ``pp - stage - 1`` forwards, then one forward / one backward, then the cooldown"""
    GPIPE = "gpipe"
    """every microbatch's forward, then every backward (last microbatch first)"""


class FaultClass(StrEnum):
    """What the ground truth says is wrong with a job (``truth.json`` ``fault``)."""

    NONE = "none"
    SLOW_WORKER = "slow_worker"
    STAGE_IMBALANCE = "stage_imbalance"
    DATA_IMBALANCE = "data_imbalance"
    SLOW_LINK = "slow_link"
    GC_PAUSE = "gc_pause"
    MULTIPLE = "multiple"
    """more than one fault: each has its own entry and counterfactual in ``faults``"""


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
    bucket_bytes: tuple[int, ...] = field(
        default=(25 << 20,),
        metadata=flag(metavar="N[,N...]", parse=_bucket_sizes, repeatable=False),
    )
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
    stragglers: list[tuple[int, float, float]] = field(
        default_factory=list,
        metadata=_items(
            "--straggler", "RANK:EXTRA_MS[:FRACTION]", int, float, float, defaults=(1.0,)
        ),
    )
    """(rank, extra ms, fraction): the rank's backward GEMMs take EXTRA_MS more per step in that
    fraction of steps (default 1; which steps: drawn by the seed, written to the truth)"""
    slow_input: list[tuple[int, float]] = field(
        default_factory=list, metadata=_items("--slow-input", "RANK:EXTRA_MS", int, float)
    )
    """(rank, extra ms): the rank's DataLoader takes EXTRA_MS more in every step"""
    clock_offset: list[tuple[int, float]] = field(
        default_factory=list, metadata=_items("--clock-offset", "HOST:MS", int, float)
    )
    """(host, ms): the host's clock reads MS ahead of true time (written timestamps shift)"""
    clock_drift: list[tuple[int, float]] = field(
        default_factory=list, metadata=_items("--clock-drift", "HOST:PPM", int, float)
    )
    """(host, ppm): the host's clock runs PPM parts per million fast (from the first step's
    start)"""
    start_ns: int = 1_767_225_600_000_000_000
    """true time of the first step's start, ns since the Unix epoch (2026-01-01 UTC)"""

    tp: int = 1
    """tensor-parallel size (Megatron order: the TP ranks of a group are consecutive)"""
    pp: int = 1
    """pipeline-parallel stages (a parallel job when tp, pp > 1 or --fsdp; else DDP)"""
    dp: int = 0
    """data-parallel size (0: ranks / (tp x pp)); global rank = tp + dp*TP + pp*TP*DP"""
    microbatches: int = 4
    """microbatches per step and pipeline (parallel jobs)"""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    """pipeline schedule: 1f1b or gpipe (parallel jobs)"""
    fsdp: bool = False
    """FSDP-style sharding: per-layer parameter all-gather (forward and backward) and gradient
    reduce-scatter on the DP group instead of DDP buckets (torchtitan's DeviceMesh groups)"""
    dist_optimizer: bool = True
    """Megatron's distributed optimizer: DP gradient reduce-scatter per bucket and parameter
    all-gather after the optimizer, grad norm on the world group (off: DP all-reduce, grad norm
    on the model-parallel group)"""
    p2p_peer_args: bool = True
    """send/recv record Dst Rank / Src Rank (and Rank) as torch >= 2.4 does (off: older traces
    without the peer)"""
    activation_bytes: int = 4 << 20
    """bytes of one microbatch's activation: pipeline send/recv and each TP all-reduce"""
    layer_bytes: int = 16 << 20
    """parameter bytes of one layer (the FSDP all-gather / reduce-scatter message)"""
    embedding_bytes: int = 16 << 20
    """bytes of the word-embedding gradient all-reduced between first and last stage"""
    nvlink_gbps: float = 200.0
    """bandwidth of groups and pairs inside one host, GB/s (parallel jobs; --link-gbps across
    hosts)"""
    stage_layers: list[tuple[int, int]] = field(
        default_factory=list, metadata=_items("--stage-layers", "STAGE:LAYERS", int, int)
    )
    """(stage, layers): the stage holds LAYERS layers instead of layers / pp (stage imbalance)"""
    slow_worker: list[tuple[int, float, float]] = field(
        default_factory=list,
        metadata=_items(
            "--slow-worker", "RANK:FACTOR[:FRACTION]", int, float, float, defaults=(1.0,)
        ),
    )
    """(rank, factor, fraction): the rank's compute kernels take FACTOR times longer in that
    fraction of steps (default 1; which steps: drawn by the seed) (parallel jobs)"""
    data_imbalance: float = 0.0
    """sigma of a lognormal work factor per (step, dp rank, microbatch) (sequence-length
    imbalance: every stage of that replica computes that microbatch x factor; 0 off)"""
    slow_host_link: list[tuple[int, int, float]] = field(
        default_factory=list,
        metadata=_items("--slow-host-link", "HOST:HOST:FACTOR", int, int, float),
    )
    """(host, host, factor): transfers of groups and pairs spanning both hosts take FACTOR times
    longer (parallel jobs)"""
    gc_pause: list[tuple[int, float, float]] = field(
        default_factory=list,
        metadata=_items("--gc-pause", "RANK:MS[:FRACTION]", int, float, float, defaults=(1.0,)),
    )
    """(rank, ms, fraction): the rank's main thread pauses MS (a garbage collection) before one
    microbatch's forward in that fraction of steps (parallel jobs)"""
    gc_events: bool = True
    """a GC pause is written as the ``Python GC`` event torch records with with_stack and
    record_python_gc_info (off: a bare host gap, as in traces recorded without them)"""

    def hosts(self) -> int:
        """Number of hosts."""
        return -(-self.ranks // self.ranks_per_host)

    def validate(self) -> None:
        """Raise :class:`UsageError` (one line) on values that make no job."""
        for name in ("ranks", "ranks_per_host", "steps", "layers", "buckets"):
            if getattr(self, name) < 1:
                raise UsageError(
                    f"{flag_of(SynthConfig, name)}: must be at least 1, got {getattr(self, name)}"
                )
        if self.first_step < 0:
            raise UsageError(f"--first-step: must be >= 0, got {self.first_step}")
        positive = ("link_gbps", "pcie_gbps", "slow_link")
        for name in positive:
            if not getattr(self, name) > 0:
                raise UsageError(
                    f"{flag_of(SynthConfig, name)}: must be > 0, got {getattr(self, name)}"
                )
        nonneg = (
            "fwd_kernel_us", "relu_kernel_us", "loss_kernel_us", "optimizer_kernel_us",
            "cpu_op_us", "launch_us", "launch_latency_us", "input_ms", "link_latency_us",
            "jitter", "input_bytes",
        )  # fmt: skip
        for name in nonneg:
            if not getattr(self, name) >= 0:
                raise UsageError(
                    f"{flag_of(SynthConfig, name)}: must be >= 0, got {getattr(self, name)}"
                )
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
        for option, pairs in (
            ("--clock-offset", self.clock_offset),
            ("--clock-drift", self.clock_drift),
        ):
            hosts = [h for h, _ in pairs]
            for h in hosts:
                if not 0 <= h < self.hosts():
                    raise UsageError(
                        f"{option}: host {h} not in the job (hosts 0..{self.hosts() - 1})"
                    )
            if len(set(hosts)) != len(hosts):
                raise UsageError(f"{option}: a host is given twice")
        if any(abs(ppm) > 1000 for _, ppm in self.clock_drift):
            raise UsageError("--clock-drift: at most 1000 ppm")
        self._validate_parallel()

    def is_parallel(self) -> bool:
        """A tensor x pipeline x data parallel (or FSDP) job rather than the DDP one."""
        return self.tp > 1 or self.pp > 1 or self.fsdp

    def dp_size(self) -> int:
        """The data-parallel size (``dp``, else ranks / (tp x pp))."""
        return self.dp if self.dp > 0 else self.ranks // max(1, self.tp * self.pp)

    def layers_of_stage(self, stage: int) -> int:
        """Layers on pipeline ``stage`` (``layers / pp`` unless ``stage_layers`` says)."""
        return dict(self.stage_layers).get(stage, self.layers // self.pp)

    def stage_buckets(self, stage: int) -> list[int]:
        """Bytes of the DP gradient buckets of ``stage`` (``buckets``, at most one per layer)."""
        return self.bucket_sizes()[: min(self.buckets, self.layers_of_stage(stage))]

    def _validate_parallel(self) -> None:
        for name in (
            "tp",
            "pp",
            "microbatches",
            "activation_bytes",
            "layer_bytes",
            "embedding_bytes",
        ):
            if getattr(self, name) < 1:
                raise UsageError(
                    f"{flag_of(SynthConfig, name)}: must be at least 1, got {getattr(self, name)}"
                )
        if self.dp < 0:
            raise UsageError(f"--dp: must be >= 0 (0: ranks / (tp x pp)), got {self.dp}")
        if not self.nvlink_gbps > 0:
            raise UsageError(f"--nvlink-gbps: must be > 0, got {self.nvlink_gbps}")
        if not 0 <= self.data_imbalance <= 2:
            raise UsageError(f"--data-imbalance: a sigma in [0, 2], got {self.data_imbalance}")
        try:
            Schedule(self.schedule)
        except ValueError:
            names = ", ".join(s.value for s in Schedule)
            raise UsageError(f"--schedule: one of {names}, got {self.schedule!r}") from None
        parallel_only = {
            "--slow-worker": self.slow_worker, "--stage-layers": self.stage_layers,
            "--slow-host-link": self.slow_host_link, "--gc-pause": self.gc_pause,
            "--data-imbalance": self.data_imbalance,
        }  # fmt: skip
        if not self.is_parallel():
            for flag, value in parallel_only.items():
                if value:
                    raise UsageError(f"{flag}: a parallel job's fault (give --tp, --pp or --fsdp)")
            return
        if self.stragglers:
            raise UsageError("--straggler: DDP jobs only (parallel jobs: --slow-worker)")
        if self.tp * self.pp * self.dp_size() != self.ranks:
            raise UsageError(
                f"--ranks {self.ranks} is not tp x pp x dp = "
                f"{self.tp} x {self.pp} x {self.dp_size()}"
            )
        if self.layers % self.pp:
            raise UsageError(f"--layers: {self.layers} layers do not split over {self.pp} stages")
        for stage, layers in self.stage_layers:
            if not 0 <= stage < self.pp:
                raise UsageError(f"--stage-layers: stage {stage} not in 0..{self.pp - 1}")
            if layers < 1:
                raise UsageError(f"--stage-layers: a stage needs a layer, got {layers}")
        if len({s for s, _ in self.stage_layers}) != len(self.stage_layers):
            raise UsageError("--stage-layers: a stage is given twice")
        for flag, triples in (("--slow-worker", self.slow_worker), ("--gc-pause", self.gc_pause)):
            ranks = [r for r, _, _ in triples]
            if len(set(ranks)) != len(ranks):
                raise UsageError(f"{flag}: a rank is given twice")
            for rank, amount, frac in triples:
                self._check_rank(flag, rank)
                if not amount > (1 if flag == "--slow-worker" else 0):
                    what = "factor must be > 1" if flag == "--slow-worker" else "ms must be > 0"
                    raise UsageError(f"{flag}: {what}, got {amount} (rank {rank})")
                if not 0 < frac <= 1:
                    raise UsageError(f"{flag}: fraction must be in (0, 1], got {frac}")
        for a, b, factor in self.slow_host_link:
            for h in (a, b):
                if not 0 <= h < self.hosts():
                    raise UsageError(
                        f"--slow-host-link: host {h} not in the job (hosts 0..{self.hosts() - 1})"
                    )
            if a == b or not factor > 1:
                raise UsageError(
                    f"--slow-host-link: two different hosts and a factor > 1, got {a}:{b}:{factor}"
                )

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
        out["schedule"] = str(self.schedule)
        for key in (
            "stragglers", "slow_input", "clock_offset", "clock_drift", "stage_layers",
            "slow_worker", "slow_host_link", "gc_pause",
        ):  # fmt: skip
            out[key] = [list(v) for v in getattr(self, key)]
        return out
