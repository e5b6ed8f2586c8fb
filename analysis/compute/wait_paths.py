"""The path a slow worker's delay took through a layered job's groups, and the groups' roles.

Computed beside the root cause (:mod:`rankscope.analysis.compute.rootcause` names the path of
each slow worker it finds); worded by :mod:`rankscope.analysis.findings.rootcause_findings`.
Waits are ns; the path's figures are ms per step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

#: How a path names a group, by description (prefix match), else by its size.
ROLE_WORDS: tuple[tuple[str, str], ...] = (
    ("TENSOR_AND_DATA", "TP-DP"),
    ("TENSOR_MODEL_PARALLEL", "TP"),
    ("mesh_tp", "TP"),
    ("DATA_PARALLEL", "DP"),
    ("mesh_dp", "DP"),
    ("PIPELINE_MODEL_PARALLEL", "PP"),
    ("mesh_pp", "PP"),
    ("EMBEDDING", "embedding"),
    ("POSITION_EMBEDDING", "embedding"),
    ("MODEL_PARALLEL", "model-parallel"),
    ("default_pg", "world"),
)
#: Hops of a wait path shown (the first ones carry the delay; later ones mix in other causes).
PATH_HOPS = 3


def group_roles(process_groups: Mapping[int, Any]) -> dict[str, str]:
    """Group name -> role word (ROLE_WORDS) from the ranks' process groups."""
    out: dict[str, str] = {}
    for groups in process_groups.values():
        for g in groups or []:
            desc = str(g.get("desc", ""))
            word = next((w for prefix, w in ROLE_WORDS if desc.startswith(prefix)), "")
            if word:
                out.setdefault(str(g.get("name")), word)
    return out


def wait_path(collectives: pd.DataFrame, rank: int, roles: Mapping[str, str], steps: int) -> str:
    """How ``rank``'s delay reached the others (up to PATH_HOPS hops): where it arrived last and
    who waited there (the op with most waiting), then where those ranks arrived last, ...:
    '1 rank waits in TP allreduce (12.0 ms per step) → 4 ranks wait in DP reducescatter (…)'."""
    co = collectives[["coll", "group", "op", "rank", "start"]]
    last_start = co.groupby("coll")["start"].transform("max")
    first_last = co.assign(_l=last_start).loc[co["start"] == last_start]
    last = first_last.drop_duplicates("coll").set_index("coll")["rank"]
    co = co.assign(last=co["coll"].map(last).to_numpy(), wait=(last_start - co["start"]).to_numpy())
    co = co[(co["wait"] > 0) & (co["rank"] != co["last"])]
    seen, frontier, hops = {rank}, {rank}, []
    for _ in range(PATH_HOPS):
        led = co[co["last"].isin(list(frontier)) & ~co["rank"].isin(list(seen))]
        if not len(led):
            break
        led = led.assign(role=[roles.get(str(g), "") for g in led["group"]])
        by = led.groupby(["role", "op"])["wait"].sum().sort_values(ascending=False)
        role, op = by.index[0]
        top = led[(led["role"] == role) & (led["op"] == op)]
        waiting = set(int(x) for x in np.unique(top["rank"]))
        label = f"{role} {op}".strip()
        n = len(waiting)
        hops.append(
            f"{n} rank{'s' if n != 1 else ''} wait{'' if n != 1 else 's'} in {label} "
            f"({float(by.iloc[0]) / steps / 1e6:.1f} ms per step)"
        )
        seen |= waiting
        frontier = waiting
    return " → ".join(hops)
