"""One verdict per rank: what bounds it, with the numbers behind it.

Inputs are small: the whole-run row of each rank's breakdown
(:func:`rankscope.analysis.compute.breakdown.rank_breakdown`, ``step == WHOLE_RUN_STEP``) and the per-rank
wait/transfer totals (:func:`rankscope.analysis.compute.collectives.wait_totals`).

Rule (``docs/analysis.md``): shares of the profiled time — compute (with memory copies), exposed
communication, input (DataLoader), idle/host gaps. A rank whose recorded activity is below
``IDLE_BUSY_SHARE`` of its time is *idle*. Otherwise the largest share names the verdict; exposed
communication is split into wait and transfer in proportion to the rank's collective wait and
transfer totals, and the larger half names it (``communication-bound (wait)`` /
``(transfer)``). Idle time inside the steps is host-bound time: the device (GPU) or the main
thread (CPU) had nothing recorded to do because the host did not hand it work in time.
"""

from __future__ import annotations

import enum

import pandas as pd

#: Below this share of recorded activity a rank is "idle".
IDLE_BUSY_SHARE = 0.05


class Verdict(enum.StrEnum):
    """What bounds a rank."""

    COMPUTE = "compute-bound"
    COMM_WAIT = "communication-bound (wait)"
    COMM_TRANSFER = "communication-bound (transfer)"
    INPUT = "input-bound"
    HOST = "host-bound"
    IDLE = "idle"


#: Columns of :func:`verdicts`.
VERDICT_COLUMNS: dict[str, str] = {
    "rank": "int32",
    "verdict": "str",
    "total_s": "float64",
    "compute_share": "float64",
    "comm_exposed_share": "float64",
    "comm_wait_share": "float64",  # exposed comm attributed to waiting for other ranks
    "comm_transfer_share": "float64",
    "input_share": "float64",
    "idle_share": "float64",
    "reason": "str",
}


def verdicts(whole: pd.DataFrame, totals: pd.DataFrame) -> pd.DataFrame:
    """A verdict per rank (``VERDICT_COLUMNS``); ``whole`` holds one breakdown row per rank."""
    tot = totals.set_index("rank") if len(totals) else pd.DataFrame()
    rows = []
    for r in whole.itertuples(index=False):
        total = max(int(r.total_ns), 1)
        compute = (r.compute_ns + r.memory_ns + r.other_ns) / total
        exposed = r.comm_exposed_ns / total
        inp = r.input_ns / total if r.device == "cpu" else min(r.input_ns, r.idle_ns) / total
        idle = r.idle_ns / total - (inp if r.device != "cpu" else 0.0)
        wait = float(tot.loc[r.rank, "comm_wait_ns"]) if len(tot) and r.rank in tot.index else 0.0
        xfer = (
            float(tot.loc[r.rank, "comm_transfer_ns"]) if len(tot) and r.rank in tot.index else 0.0
        )
        wait_part = exposed * (wait / (wait + xfer)) if wait + xfer > 0 else 0.0
        xfer_part = exposed - wait_part
        busy = compute + exposed + inp
        shares = {
            Verdict.COMPUTE: compute,
            Verdict.COMM_WAIT if wait_part >= xfer_part else Verdict.COMM_TRANSFER: exposed,
            Verdict.INPUT: inp,
            Verdict.HOST: idle,
        }
        verdict = Verdict.IDLE if busy < IDLE_BUSY_SHARE else max(shares, key=lambda v: shares[v])
        reason = (
            f"compute {compute:.0%}, exposed comm {exposed:.0%} (wait {wait_part:.0%}, "
            f"transfer {xfer_part:.0%}), input {inp:.0%}, idle/host {idle:.0%} "
            f"of {total / 1e9:.3f} s"
        )
        rows.append(
            {
                "rank": int(r.rank),
                "verdict": str(verdict),
                "total_s": total / 1e9,
                "compute_share": compute,
                "comm_exposed_share": exposed,
                "comm_wait_share": wait_part,
                "comm_transfer_share": xfer_part,
                "input_share": inp,
                "idle_share": idle,
                "reason": reason,
            }
        )
    out = pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
    return out.astype({k: v for k, v in VERDICT_COLUMNS.items() if v != "str"})
