"""Ranks and process groups of a tensor x pipeline x data parallel job, as Megatron-Core (or, for
FSDP, torchtitan's DeviceMesh) creates them.

Rank order (Megatron's default ``tp-cp-ep-dp-pp``, cp = ep = 1): the TP index varies fastest,
then DP, then PP: ``global = tp + dp*TP + pp*TP*DP``. A process group's c10d name is
``str(group_count)``: a counter every rank advances on every ``new_group`` call, for groups it is
not in as well (gloo groups included), so one group has one name on all of its members; ``"0"``
is the default group (``default_pg``).

Megatron-Core creation order (``initialize_model_parallel``; no experts, cp = 1, gloo groups
on): per DP-with-CP group ``DATA_PARALLEL_GROUP_WITH_CP`` then its ``_GLOO`` twin; per DP group
``DATA_PARALLEL_GROUP`` and ``_GLOO``; ``CONTEXT_PARALLEL_GROUP`` (one rank each);
``MODEL_PARALLEL_GROUP`` (tp-pp); ``TENSOR_MODEL_PARALLEL_GROUP``; per PP group
``PIPELINE_MODEL_PARALLEL_GROUP``, ``EMBEDDING_GROUP`` (first and last stage),
``POSITION_EMBEDDING_GROUP`` (first stage); then ``TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP``,
``TENSOR_AND_DATA_PARALLEL_GROUP``, ``TENSOR_AND_CONTEXT_PARALLEL_GROUP``. Expert groups come
after those and are left out (no group used here follows them).

FSDP jobs take torchtitan's mesh ``[pp, dp_shard, tp]`` (dims of size 1 left out): per dim, in
that order, one group per slice with the description ``mesh_<dim>``; a dim as large as the world
uses the default group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

#: The default process group's name and description (torch).
DEFAULT_PG_NAME = "0"
DEFAULT_PG_DESC = "default_pg"


class Role(StrEnum):
    """What a job uses a process group for."""

    WORLD = "world"
    TP = "tp"
    DP = "dp"
    PP = "pp"
    EMBEDDING = "embedding"
    MODEL = "model"
    """tensor x pipeline (Megatron's MODEL_PARALLEL_GROUP: the grad norm without the
    distributed optimizer)"""


@dataclass(frozen=True)
class Group:
    """One process group: c10d name (creation counter), description, global ranks, backend."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    backend: str = "nccl"

    def rank_of(self, global_rank: int) -> int:
        """The group rank of ``global_rank``."""
        return self.ranks.index(global_rank)


@dataclass(frozen=True)
class Coords:
    """A rank's place in the layout (tensor, data and pipeline index)."""

    tp: int
    dp: int
    pp: int


@dataclass
class Layout:
    """The job's ranks and groups: ``groups`` in creation order, ``roles[(role, rank)]`` the
    group a rank uses for ``role`` (absent: the rank takes no part, e.g. no embedding group in
    the middle stages)."""

    tp: int
    pp: int
    dp: int
    groups: list[Group] = field(default_factory=list)
    roles: dict[tuple[Role, int], Group] = field(default_factory=dict)

    @property
    def world(self) -> int:
        """Number of ranks."""
        return self.tp * self.pp * self.dp

    def rank(self, tp: int, dp: int, pp: int) -> int:
        """Global rank of coordinates (Megatron order)."""
        return tp + dp * self.tp + pp * self.tp * self.dp

    def coords(self, rank: int) -> Coords:
        """Coordinates of a global rank."""
        return Coords(rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp))

    def group(self, role: Role, rank: int) -> Group | None:
        """The group ``rank`` uses for ``role`` (None: not part of one)."""
        return self.roles.get((role, rank))

    def member_of(self, rank: int) -> list[Group]:
        """Groups ``rank`` is in, in creation order (the trace's ``distributedInfo.pg_config``)."""
        return [g for g in self.groups if rank in g.ranks]

    def _slices(self, varying: str) -> list[tuple[int, ...]]:
        """Rank lists along the dims in ``varying`` (letters of "tdp"), fastest first, one list per
        value of the other dims (Megatron's RankGenerator.get_ranks order)."""
        sizes = {"t": self.tp, "d": self.dp, "p": self.pp}
        fixed = [d for d in "tdp" if d not in varying]
        out = []
        for outer in _product([sizes[d] for d in fixed]):
            pin = dict(zip(fixed, outer, strict=True))
            ranks = []
            for inner in _product([sizes[d] for d in varying]):
                pos = {**pin, **dict(zip(varying, inner, strict=True))}
                ranks.append(self.rank(pos["t"], pos["d"], pos["p"]))
            out.append(tuple(ranks))
        return out


def _product(sizes: list[int]) -> list[tuple[int, ...]]:
    """All index tuples of ``sizes``, the FIRST index varying fastest."""
    out: list[tuple[int, ...]] = [()]
    for n in sizes:
        out = [(*prev, i) for i in range(n) for prev in out]
    return out


def megatron_layout(tp: int, pp: int, dp: int) -> Layout:
    """The groups Megatron-Core creates, in its order (module docstring)."""
    lay = Layout(tp, pp, dp)
    world = tuple(range(lay.world))
    lay.groups.append(Group(DEFAULT_PG_NAME, DEFAULT_PG_DESC, world))
    counter = 1

    def new(desc: str, ranks: tuple[int, ...], backend: str = "nccl") -> Group:
        nonlocal counter
        g = Group(str(counter), desc, ranks, backend)
        counter += 1
        lay.groups.append(g)
        return g

    for ranks in lay._slices("d"):
        new("DATA_PARALLEL_GROUP_WITH_CP", ranks)
        new("DATA_PARALLEL_GROUP_WITH_CP_GLOO", ranks, "gloo")
    for ranks in lay._slices("d"):
        g = new("DATA_PARALLEL_GROUP", ranks)
        new("DATA_PARALLEL_GROUP_GLOO", ranks, "gloo")
        _assign(lay, Role.DP, g)
    for r in world:  # cp = 1: one group per rank
        new("CONTEXT_PARALLEL_GROUP", (r,))
    for ranks in lay._slices("tp"):
        _assign(lay, Role.MODEL, new("MODEL_PARALLEL_GROUP", ranks))
    for ranks in lay._slices("t"):
        _assign(lay, Role.TP, new("TENSOR_MODEL_PARALLEL_GROUP", ranks))
    for ranks in lay._slices("p"):
        _assign(lay, Role.PP, new("PIPELINE_MODEL_PARALLEL_GROUP", ranks))
        ends = (ranks[0], ranks[-1]) if len(ranks) > 1 else (ranks[0],)
        _assign(lay, Role.EMBEDDING, new("EMBEDDING_GROUP", ends))
        new("POSITION_EMBEDDING_GROUP", (ranks[0],))
    for ranks in lay._slices("td"):
        new("TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", ranks)
    for ranks in lay._slices("td"):
        new("TENSOR_AND_DATA_PARALLEL_GROUP", ranks)
    for ranks in lay._slices("t"):
        new("TENSOR_AND_CONTEXT_PARALLEL_GROUP", ranks)
    _assign(lay, Role.WORLD, lay.groups[0])
    return lay


def torchtitan_layout(tp: int, pp: int, dp: int) -> Layout:
    """torchtitan's DeviceMesh groups for FSDP (dp_shard) x TP x PP (module docstring)."""
    lay = Layout(tp, pp, dp)
    world = tuple(range(lay.world))
    default = Group(DEFAULT_PG_NAME, DEFAULT_PG_DESC, world)
    lay.groups.append(default)
    counter = 1
    for letter, dim, role, size in (("p", "pp", Role.PP, pp), ("d", "dp_shard", Role.DP, dp),
                                    ("t", "tp", Role.TP, tp)):  # fmt: skip
        if size == 1:
            continue
        if size == lay.world:
            _assign(lay, role, default)
            continue
        for ranks in lay._slices(letter):
            g = Group(str(counter), f"mesh_{dim}", ranks)
            counter += 1
            lay.groups.append(g)
            _assign(lay, role, g)
    _assign(lay, Role.WORLD, default)
    return lay


def _assign(lay: Layout, role: Role, group: Group) -> None:
    for r in group.ranks:
        lay.roles[(role, r)] = group
