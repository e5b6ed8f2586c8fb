"""Ground truth of a synthetic DDP job (``truth.json``) and the host clock model all jobs share.

A host clock reads ``t + offset + drift_ppm * 1e-6 * (t - t0)`` at true time ``t`` (ns); the
truth stays on the true clock (docs/synth.md, "truth.json").

numpy is imported inside the functions: the ``synth`` package loads this module with its
parser, which every ``rankscope --help`` builds (docs/architecture.md, "Deferred imports").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankscope.orchestrator.synth.config import SynthConfig

if TYPE_CHECKING:
    import numpy as np
    from rankscope.orchestrator.synth.ddp import Job


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
