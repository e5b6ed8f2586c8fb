"""Ground truth of a parallel job (``truth.json``): layout, groups, faults, step times and the
counterfactual of each fault.

The counterfactual of a fault is the same job simulated again without it: same seed, same
random draws (jitter, which steps are slow, the other faults), so the difference is the fault's
cost. Data imbalance's counterfactual is every microbatch at the median drawn work factor.
Stage imbalance's is the stage at ``layers / pp`` layers (its extra layers' jitter is not
drawn, so that stage's other draws shift: within the jitter, not more).

A step's time is the job's: the last rank's ProfilerStep end minus the first rank's start.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
from rankscope.orchestrator.synth.config import FaultClass, SynthConfig
from rankscope.orchestrator.synth.truth import _host_name, clock_params

if TYPE_CHECKING:
    from rankscope.orchestrator.synth.parallel import ParallelJob


def step_times(job: ParallelJob) -> list[int]:
    """Each step's time (ns): last end - first start over the ranks."""
    return [int(v) for v in job.step_end.max(axis=1) - job.step_start.min(axis=1)]


def _mean(values: list[int]) -> int:
    return round(sum(values) / len(values))


def _faults(config: SynthConfig, job: ParallelJob) -> list[dict[str, Any]]:
    """One entry per fault with what to remove for its counterfactual (``_remove``)."""
    c = config
    lay = job.layout
    first = c.first_step
    out: list[dict[str, Any]] = []
    for rank, factor, frac in c.slow_worker:
        co = lay.coords(rank)
        out.append({
            "class": FaultClass.SLOW_WORKER.value, "cause": "own compute", "ranks": [rank],
            "coords": [{"tp": co.tp, "dp": co.dp, "pp": co.pp}], "factor": factor,
            "fraction": frac, "slow_steps": [first + s for s in job.slow_steps[rank]],
            "_remove": {"slow_worker": [w for w in c.slow_worker if w[0] != rank]},
        })  # fmt: skip
    for rank, extra in c.slow_input:
        co = lay.coords(rank)
        out.append({
            "class": FaultClass.SLOW_WORKER.value, "cause": "input", "ranks": [rank],
            "coords": [{"tp": co.tp, "dp": co.dp, "pp": co.pp}], "extra_ms": extra,
            "fraction": 1.0, "slow_steps": [first + s for s in range(c.steps)],
            "_remove": {"slow_input": [w for w in c.slow_input if w[0] != rank]},
        })  # fmt: skip
    base = c.layers // c.pp
    for stage, layers in c.stage_layers:
        if layers == base:
            continue
        out.append({
            "class": FaultClass.STAGE_IMBALANCE.value, "cause": "more layers" if layers > base
            else "fewer layers", "stage": stage,
            "ranks": [r for r in range(c.ranks) if lay.coords(r).pp == stage],
            "layers": layers, "balanced_layers": base,
            "_remove": {"stage_layers": [x for x in c.stage_layers if x[0] != stage]},
        })  # fmt: skip
    if c.data_imbalance > 0:
        f = job.data_factor
        worst = [
            {"step": first + s, "dp": int(d), "mb": int(m), "factor": float(f[s, d, m])}
            for s in range(c.steps)
            for d, m in [divmod(int(f[s].argmax()), f.shape[2])]
        ]
        out.append({
            "class": FaultClass.DATA_IMBALANCE.value, "cause": "sequence length", "ranks": [],
            "sigma": c.data_imbalance, "median_factor": float(_median(f)),
            "heaviest_per_step": worst, "_remove": {"data_imbalance": 0.0},
        })  # fmt: skip
    for a, b, factor in c.slow_host_link:
        out.append({
            "class": FaultClass.SLOW_LINK.value, "cause": "link", "hosts": [a, b],
            "factor": factor, "ranks": [],
            "_remove": {"slow_host_link": [x for x in c.slow_host_link if x[:2] != (a, b)]},
        })  # fmt: skip
    if c.slow_link != 1.0:
        out.append({"class": FaultClass.SLOW_LINK.value, "cause": "link", "hosts": "all",
                    "factor": c.slow_link, "ranks": [], "_remove": {"slow_link": 1.0}})  # fmt: skip
    for rank, ms, frac in c.gc_pause:
        pauses = [{**g, "step": first + g["step"]} for g in job.gc if g["rank"] == rank]
        out.append({
            "class": FaultClass.GC_PAUSE.value, "cause": "gc", "ranks": [rank], "ms": ms,
            "fraction": frac, "pauses": pauses,
            "_remove": {"gc_pause": [x for x in c.gc_pause if x[0] != rank]},
        })  # fmt: skip
    return out


def _median(values: Any) -> float:
    return float(np.median(values))


def counterfactual(config: SynthConfig, remove: dict[str, Any]) -> list[int]:
    """Step times of ``config`` with the fields in ``remove`` replaced: the job regenerated
    without those faults (same seed, same draws). Without data imbalance every microbatch's
    work factor is 1, the median of the lognormal the factors are drawn from (the typical
    microbatch; the median of the few factors one job draws varies around it)."""
    from rankscope.orchestrator.synth.parallel import simulate_parallel

    job = simulate_parallel(dataclasses.replace(config, **remove))
    return step_times(job)


def _saving(actual: list[int], fixed: list[int]) -> dict[str, Any]:
    mean, best = _mean(actual), _mean(fixed)
    return {
        "mean_step_ns": best,
        "step_ns": fixed,
        "saving_ns": mean - best,
        "saving_pct": round(100.0 * (mean - best) / mean, 3) if mean else 0.0,
    }


def parallel_truth(job: ParallelJob) -> dict[str, Any]:
    """Ground truth of a parallel job (docs/synth.md, "Parallel jobs")."""
    c = job.config
    lay = job.layout
    first = c.first_step
    steps = step_times(job)
    faults = _faults(c, job)
    remove_all: dict[str, Any] = {}
    for f in faults:
        remove = f.pop("_remove")
        f["counterfactual"] = _saving(steps, counterfactual(c, remove))
        for key, value in remove.items():
            # several faults of one field: remove them all
            remove_all[key] = [] if isinstance(value, list) else value
    if not faults:
        fault = FaultClass.NONE.value
    elif len(faults) == 1:
        fault = faults[0]["class"]
    else:
        fault = FaultClass.MULTIPLE.value
    overall = _saving(steps, counterfactual(c, remove_all) if faults else steps)
    offset, ppm = clock_params(c)
    ranks = []
    for r in range(c.ranks):
        co = lay.coords(r)
        ranks.append({
            "rank": r, "tp": co.tp, "dp": co.dp, "pp": co.pp,
            "host": r // c.ranks_per_host, "host_name": _host_name(r // c.ranks_per_host),
            "local_rank": r % c.ranks_per_host, "pid": int(job.pids[r]),
            "clock_offset_ns": int(offset[r]), "clock_drift_ppm": float(ppm[r]),
            "offset_to_rank0_ns": int(offset[0] - offset[r]),
            "compute_ns": int(job.compute_ns[:, r].sum()),
            "steps": {
                "step": list(range(first, first + c.steps)),
                "start_ns": job.step_start[:, r].tolist(), "end_ns": job.step_end[:, r].tolist(),
                "compute_ns": job.compute_ns[:, r].tolist(),
            },
        })  # fmt: skip
    colls, p2p = [], []
    for rdv in job.rendezvous:
        i = rdv.info
        if i["op"] in ("send", "recv"):
            p2p.append({
                "src": i["src"], "dst": i["dst"], "group": i["group"], "step": first + i["step"],
                "mb": i["mb"], "what": i["what"], "bytes": i["bytes"],
                "send_start_ns": rdv.ready[i["src"]], "recv_start_ns": rdv.ready[i["dst"]],
                "end_ns": rdv.end, "transfer_ns": rdv.transfer,
            })  # fmt: skip
        else:
            arrival = [rdv.ready[r] for r in i["ranks"]]
            colls.append({
                "group": i["group"], "desc": i["desc"], "seq": i["seq"], "op": i["op"],
                "kind": i["kind"], "step": first + i["step"], "bytes": i["bytes"],
                "ranks": i["ranks"], "arrival_ns": arrival, "end_ns": rdv.end,
                "transfer_ns": rdv.transfer, "last_rank": i["ranks"][arrival.index(max(arrival))],
            })  # fmt: skip
    return {
        "generator": "rankscope synth",
        "kind": "parallel",
        "units": "ns on the true clock (Unix epoch) unless the name says otherwise",
        "config": c.to_json(),
        "world_size": c.ranks,
        "hosts": c.hosts(),
        "t0_ns": c.start_ns,
        "layout": {
            "tp": c.tp,
            "pp": c.pp,
            "dp": c.dp_size(),
            "order": "tp-dp-pp",
            "names": "torchtitan" if c.fsdp else "megatron",
            "fsdp": c.fsdp,
            "schedule": str(c.schedule),
            "microbatches": c.microbatches,
            "stage_layers": [c.layers_of_stage(s) for s in range(c.pp)],
        },
        "groups": [
            {"name": g.name, "desc": g.desc, "backend": g.backend, "ranks": list(g.ranks)}
            for g in lay.groups
        ],
        "fault": fault,
        "faults": faults,
        "step_ns": steps,
        "mean_step_ns": _mean(steps),
        "counterfactual": overall,
        "ranks": ranks,
        "collectives": colls,
        "p2p": p2p,
    }
