"""Which GPU kernels are communication: the vocabulary of communication kernels, by library.

A kernel that moves data between GPUs is communication whatever library launched it, but only
NCCL's (and RCCL's, which keeps NCCL's names) say so in a way every tool knows: HTA's rule is
``^nccl.*Kernel``. Expert-parallel training and inference move most of their bytes with other
kernels (DeepEP's dispatch / combine, NVSHMEM's on-stream collectives, custom all-reduce kernels of
inference engines, Transformer Engine's userbuffers, MSCCL++); read with HTA's rule they are
compute. :data:`COMM_KERNEL_FAMILIES` names them, each with the source file its names come from
(docs/communication-kernels.md has the same table for readers), and
:class:`CommKernelSettings` adds a user's own (``--comm-kernel REGEX``, the config file's
``comm_kernels`` key).

Two questions per kernel, answered here once at merge time (``vocabulary.classify`` asks the
first, ``event_columns`` the second):

* *Is it communication?* Then its kind is ``KERNEL_COMM`` and every breakdown counts it as
  communication (compute vs communication, overlap, KPIs, stragglers' causes).
* *Can the merge match it across ranks?* Only kernels of a family whose kernels are collectives
  of a process group, named by the kernel (NCCL's ``ncclDevKernel_AllReduce_…``) and launched
  under a ``record_param_comms`` that names their group — :attr:`CommKernelFamily.collective`.
  The others (DeepEP's dispatch sends a data-dependent set of tokens to a data-dependent set of
  peers; NVSHMEM and the custom all-reduces run outside c10d, on the compute stream among other
  kernels) carry no group and no sequence number; matching them by call order could pair
  different operations, and their ends need not agree across ranks, which the clock alignment
  assumes of a collective. They stay communication time that is not split into waiting and
  transfer, and the analysis says how much (``unmatched_comm``).

Import-light: ``re``, ``os``, ``dataclasses`` and ``enum`` only (``tomllib`` when a config file
is read), so ``rankscope merge --help`` pays nothing for it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import re
from pathlib import Path

from rankscope.config_flags import flag
from rankscope.errors import UsageError

#: Kineto writes a kernel's demangled signature; a C++ kernel's starts with its return type.
RETURN_TYPE = r"(?:void\s+)?"
#: Environment variable naming the config file (else :data:`DEFAULT_CONFIG_PATH`).
ENV_CONFIG = "RANKSCOPE_CONFIG"
#: The config file read when :data:`ENV_CONFIG` is unset (absent: no user patterns).
DEFAULT_CONFIG_PATH = Path("~/.config/rankscope/rankscope.toml")
#: The store's root attribute: the user's patterns it was merged with (a list; absent: none).
COMM_KERNELS_ATTR = "comm_kernels"
#: The config file's key: a list of regular expressions, as ``--comm-kernel`` takes them.
CONFIG_KEY = "comm_kernels"


class CommLibrary(enum.StrEnum):
    """The library a communication kernel belongs to (what the docs and the report name)."""

    NCCL = "NCCL/RCCL"
    DEEPEP = "DeepEP"
    NVSHMEM = "NVSHMEM"
    MSCCLPP = "MSCCL++"
    VLLM = "vLLM custom all-reduce"
    TRTLLM = "TensorRT-LLM all-reduce"
    USERBUFFERS = "userbuffers"
    USER = "user pattern"


@dataclasses.dataclass(frozen=True)
class CommKernelFamily:
    """The kernels of one library, by name."""

    library: CommLibrary
    """Whose kernels these are."""
    pattern: str
    """Regular expression matched at the start of the kernel's name (after a ``void`` return
    type, :data:`RETURN_TYPE`)."""
    source: str
    """Where the names come from (repository and file), for the docs and for the next reader."""
    collective: bool = False
    """Its kernels are collectives of a process group that the merge matches across ranks (the
    op in the name, group and sequence number from ``record_param_comms``)."""


#: The communication kernels known without configuration (docs/communication-kernels.md).
COMM_KERNEL_FAMILIES: tuple[CommKernelFamily, ...] = (
    # NVIDIA/nccl src/device/generate.py (ncclDevKernel_*), older src/collectives/device
    # (ncclKernel_*); ROCm/rccl keeps the names (ncclDevKernel_Generic …). HTA's own rule.
    CommKernelFamily(CommLibrary.NCCL, r"nccl.*Kernel", "NVIDIA/nccl, ROCm/rccl", collective=True),
    # deepseek-ai/DeepEP csrc/kernels/intranode.cu (deep_ep::intranode::notify_dispatch,
    # cached_notify_dispatch, dispatch, cached_notify_combine, combine), internode.cu
    # (deep_ep::internode::notify_dispatch, dispatch, cached_notify, combine), internode_ll.cu
    # (deep_ep::internode_ll::dispatch, combine, clean_low_latency_buffer). ``dpsk::ep::`` is the
    # namespace of a DeepEP build seen in a real H800 trace (issue 28). get_dispatch_layout only
    # counts tokens per rank on this GPU: compute.
    CommKernelFamily(
        CommLibrary.DEEPEP,
        r"(?:deep_ep|dpsk::ep)::(?:intranode|internode|internode_ll)::(?!get_dispatch_layout)\w",
        "deepseek-ai/DeepEP csrc/kernels/intranode.cu, internode.cu, internode_ll.cu",
    ),
    # NVIDIA NVSHMEM src/host/coll/*/*.cu: the host-initiated collectives on a stream launch
    # <op>_on_stream_kernel (alltoall_on_stream_kernel, barrier_on_stream_kernel,
    # sync_all_on_stream_kernel, fcollect_on_stream_kernel, broadcast_on_stream_kernel, …);
    # pytorch/pytorch torch/csrc/distributed/c10d/symm_mem/nvshmem_extension.cu: torch's
    # NVSHMEM all-to-all (c10d::nvshmem_extension::allToAllV, exchangeSplitAndOffset, …).
    CommKernelFamily(
        CommLibrary.NVSHMEM,
        r"\w+_on_stream_kernel\b|c10d::nvshmem_extension::\w",
        "NVIDIA NVSHMEM src/host/coll/alltoall/alltoall.cu (and the other on-stream "
        "collectives); pytorch/pytorch torch/csrc/distributed/c10d/symm_mem/nvshmem_extension.cu",
    ),
    # microsoft/mscclpp apps/nccl/src/allreduce.hpp (allreduce7 … allreduce11, allreduceAllPairs,
    # allreducePacket), allgather.hpp (allgather6, allgather8), broadcast.hpp (broadcast6): the
    # kernels of its NCCL-API shim, in the global namespace.
    CommKernelFamily(
        CommLibrary.MSCCLPP,
        r"(?:mscclpp::)?(?:allreduce|allgather|broadcast|reducescatter)(?:\d+|AllPairs|Packet)\b",
        "microsoft/mscclpp apps/nccl/src/allreduce.hpp, allgather.hpp, broadcast.hpp",
    ),
    # vllm-project/vllm csrc/custom_all_reduce.cuh (vllm::cross_device_reduce_1stage / _2stage;
    # SGLang's copy keeps the names).
    CommKernelFamily(
        CommLibrary.VLLM,
        r"(?:vllm::)?cross_device_reduce_\w+",
        "vllm-project/vllm csrc/custom_all_reduce.cuh",
    ),
    # NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/customAllReduceKernels.cu
    # (tensorrt_llm::kernels::oneShotAllReduceKernel, twoShotAllReduceKernel) and
    # communicationKernels/ (allReduceFusionKernels, mnnvlTwoShotAllreduceKernels, …).
    CommKernelFamily(
        CommLibrary.TRTLLM,
        r"tensorrt_llm::kernels::(?:\w+::)*\w*(?:[Aa]ll[Rr]educe|allreduce)\w*",
        "NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/customAllReduceKernels.cu",
    ),
    # NVIDIA/TransformerEngine transformer_engine/common/comm_gemm_overlap/userbuffers/
    # userbuffers.cu (userbuffers_fp16_sum_inplace_gpu_rr_rs, userbuffers_fp16_sum_inplace_gpu_rw,
    # kuserbuffers_pullsend, kuserbuffers_pushrecv, …); TensorRT-LLM's copy is in namespace
    # tensorrt_llm::kernels::ub.
    CommKernelFamily(
        CommLibrary.USERBUFFERS,
        r"(?:\w+::)*k?userbuffers_\w+",
        "NVIDIA/TransformerEngine transformer_engine/common/comm_gemm_overlap/userbuffers/"
        "userbuffers.cu",
    ),
)


def _regex(text: str) -> str:
    """A ``--comm-kernel`` value checked to compile (argparse words the failure)."""
    try:
        re.compile(text)
    except re.error as exc:
        raise ValueError(f"not a regular expression ({exc})") from None
    return text


@dataclasses.dataclass(frozen=True)
class CommKernelSettings:
    """Communication kernels beyond :data:`COMM_KERNEL_FAMILIES`; ``merge`` and ``analyze``
    spell them as flags (generated by ``rankscope.config_flags.Flags``)."""

    comm_kernel: tuple[str, ...] = dataclasses.field(
        default=(), metadata=flag(metavar="REGEX", parse=_regex)
    )
    """(regular expression): also count GPU kernels whose name this matches (``re.search``) as
    communication; they are not matched across ranks (docs/communication-kernels.md). Added to
    the config file's comm_kernels list."""


@dataclasses.dataclass(frozen=True)
class CommVocabulary:
    """The families in force for one merge: the built-in ones and the user's patterns.

    Picklable (it travels to the merge's worker processes); the compiled rules are built once
    per process.
    """

    user_patterns: tuple[str, ...] = ()
    """The user's regular expressions (``--comm-kernel``, the config file), searched anywhere
    in the name."""

    @functools.cached_property
    def _builtin(self) -> tuple[re.Pattern[str], re.Pattern[str]]:
        """(every built-in family, the collective ones) as one anchored alternation each."""
        every = "|".join(f"(?:{f.pattern})" for f in COMM_KERNEL_FAMILIES)
        coll = "|".join(f"(?:{f.pattern})" for f in COMM_KERNEL_FAMILIES if f.collective)
        return re.compile(f"{RETURN_TYPE}(?:{every})"), re.compile(f"{RETURN_TYPE}(?:{coll})")

    @functools.cached_property
    def _user(self) -> re.Pattern[str] | None:
        if not self.user_patterns:
            return None
        return re.compile("|".join(f"(?:{p})" for p in self.user_patterns))

    def is_comm(self, name: str) -> bool:
        """A kernel of this name is communication."""
        user = self._user
        return bool(self._builtin[0].match(name)) or (user is not None and bool(user.search(name)))

    def is_collective(self, name: str) -> bool:
        """A kernel of this name is a collective the merge matches across ranks (NCCL's)."""
        return bool(self._builtin[1].match(name))

    def library(self, name: str) -> CommLibrary | None:
        """The library of a communication kernel's name (None: not communication)."""
        for fam in COMM_KERNEL_FAMILIES:
            if re.match(f"{RETURN_TYPE}(?:{fam.pattern})", name):
                return fam.library
        user = self._user
        return CommLibrary.USER if user is not None and user.search(name) else None


#: The vocabulary without user patterns.
DEFAULT_VOCABULARY = CommVocabulary()


def config_path() -> Path:
    """The config file: ``$RANKSCOPE_CONFIG`` or ``~/.config/rankscope/rankscope.toml``."""
    return Path(os.environ.get(ENV_CONFIG) or DEFAULT_CONFIG_PATH).expanduser()


def config_patterns(path: Path | None = None) -> tuple[str, ...]:
    """The config file's ``comm_kernels`` list (empty without the file or the key); one-line
    errors naming the file. A file named by ``$RANKSCOPE_CONFIG`` must exist."""
    path = path or config_path()
    if not path.exists():
        if os.environ.get(ENV_CONFIG):
            raise UsageError(f"{path}: config file not found (from ${ENV_CONFIG})")
        return ()
    import tomllib  # only for a file: 2.5 ms of every merge's start otherwise

    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the config file ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from None
    value = doc.get(CONFIG_KEY, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f'{path}: {CONFIG_KEY} must be a list of regular expressions ["…"]')
    for v in value:
        try:
            re.compile(v)
        except re.error as exc:
            raise UsageError(
                f"{path}: {CONFIG_KEY}: {v!r} is not a regular expression ({exc})"
            ) from None
    return tuple(value)


def vocabulary(settings: CommKernelSettings | None = None) -> CommVocabulary:
    """The vocabulary of one merge: the config file's patterns, then the flags'."""
    flags = settings.comm_kernel if settings is not None else ()
    return CommVocabulary(tuple(dict.fromkeys((*config_patterns(), *flags))))
