"""The tensor x pipeline x data parallel jobs of ``rankscope synth`` (orchestrator/synth/parallel.py).

Their groups must be Megatron-Core's (ranks, names, descriptions), ``Seq`` must count per group
on every member alike, every send must meet exactly one recv, each stage must run 1F1B's order,
each fault must change what it claims and nothing else, the counterfactual must be the job
simulated again without the fault, and the traces must merge.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import rankscope
from rankscope.errors import UsageError
from rankscope.orchestrator.ingest.merge import merge_run_dir
from rankscope.orchestrator.synth import SynthConfig, generate, simulate, truth
from rankscope.orchestrator.synth.engine import schedule
from rankscope.orchestrator.synth.parallel import ParallelJob, simulate_parallel
from rankscope.orchestrator.synth.parallel_truth import step_times


def _config(**kw: object) -> SynthConfig:
    base: dict[str, object] = dict(
        ranks=8, ranks_per_host=4, tp=2, pp=2, dp=2, steps=2, seed=5, microbatches=4, layers=4
    )
    base.update(kw)
    return SynthConfig(**base)  # type: ignore[arg-type]


def _trace(folder: Path, rank: int) -> dict:
    return json.loads(gzip.decompress((folder / f"rank-{rank}.json.gz").read_bytes()))


def test_megatron_groups() -> None:
    job = simulate(_config(ranks=16, tp=2, pp=4, dp=2, ranks_per_host=8))
    assert isinstance(job, ParallelJob)
    lay = job.layout
    by_desc: dict[str, list[tuple[int, ...]]] = {}
    for g in lay.groups:
        by_desc.setdefault(g.desc, []).append(g.ranks)
    # Megatron's docstring example: 16 GPUs, TP2 PP4 (DP2)
    assert by_desc["TENSOR_MODEL_PARALLEL_GROUP"] == [(2 * i, 2 * i + 1) for i in range(8)]
    assert by_desc["DATA_PARALLEL_GROUP"] == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11),
                                              (12, 14), (13, 15)]  # fmt: skip
    assert by_desc["PIPELINE_MODEL_PARALLEL_GROUP"] == [(0, 4, 8, 12), (1, 5, 9, 13),
                                                        (2, 6, 10, 14), (3, 7, 11, 15)]  # fmt: skip
    assert by_desc["EMBEDDING_GROUP"] == [(0, 12), (1, 13), (2, 14), (3, 15)]
    assert by_desc["MODEL_PARALLEL_GROUP"] == [(0, 1, 4, 5, 8, 9, 12, 13),
                                               (2, 3, 6, 7, 10, 11, 14, 15)]  # fmt: skip
    # names: the creation counter, "0" the default group; DP-with-CP and gloo twins first
    assert [g.name for g in lay.groups] == [str(i) for i in range(len(lay.groups))]
    assert lay.groups[0].desc == "default_pg" and len(lay.groups[0].ranks) == 16
    assert [g.desc for g in lay.groups[1:3]] == [
        "DATA_PARALLEL_GROUP_WITH_CP",
        "DATA_PARALLEL_GROUP_WITH_CP_GLOO",
    ]
    tp_first = next(g for g in lay.groups if g.desc == "TENSOR_MODEL_PARALLEL_GROUP")
    # 8 DP-with-CP x2, 8 DP x2, 16 CP, 2 MP groups come before it
    assert tp_first.name == str(1 + 16 + 16 + 16 + 2)
    for r in range(16):
        co = lay.coords(r)
        assert r == co.tp + 2 * co.dp + 4 * co.pp


def test_trace_args_seq_and_p2p_pairs(tmp_path: Path) -> None:
    cfg = _config()
    generate(cfg, tmp_path)
    t = json.loads((tmp_path / "truth.json").read_text())
    names = {g["name"]: g for g in t["groups"]}
    seqs: dict[str, dict[int, list[tuple[str, int]]]] = {}
    sends: Counter[tuple[int, int, int]] = Counter()
    recvs: Counter[tuple[int, int, int]] = Counter()
    for rank in range(cfg.ranks):
        trace = _trace(tmp_path, rank)
        info = trace["distributedInfo"]
        assert info["rank"] == rank and info["world_size"] == 8
        assert info["pg_count"] == len(info["pg_config"])
        assert all(rank in pg["ranks"] for pg in info["pg_config"])
        step = -1
        per_step: Counter[tuple[str, int, int]] = Counter()
        events = sorted(
            (e for e in trace["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"]
        )
        for e in events:
            if e["name"].startswith("ProfilerStep#"):
                step = int(e["name"].split("#")[1])
            if e["name"] != "record_param_comms":
                continue
            a = e["args"]
            g = names[a["Process Group Name"]]
            assert a["Process Group Description"] == g["desc"]
            assert a["Process Group Ranks"] == str(g["ranks"])
            assert a["Group size"] == len(g["ranks"])
            if a["Collective name"] in ("send", "recv"):
                key = "Dst Rank" if a["Collective name"] == "send" else "Src Rank"
                peer = a[key]
                assert peer in g["ranks"] and peer != rank
                assert g["desc"] == "PIPELINE_MODEL_PARALLEL_GROUP"
                assert a["Rank"] == g["ranks"].index(peer)  # the peer's group rank (torch)
                pair = (rank, peer) if a["Collective name"] == "send" else (peer, rank)
                k = per_step[(a["Collective name"], *pair)]
                per_step[(a["Collective name"], *pair)] += 1
                (sends if a["Collective name"] == "send" else recvs)[(*pair, step * 100 + k)] += 1
            else:
                assert a["Rank"] == g["ranks"].index(rank)
                seqs.setdefault(g["name"], {}).setdefault(rank, []).append(
                    (a["Collective name"], a["Seq"])
                )
        # NCCL kernels carry what Kineto copies: group and peer, not Seq / Rank
        kernels = [e for e in events if e["name"].startswith("ncclDevKernel_")]
        assert kernels and all("Seq" not in e["args"] and "Rank" not in e["args"] for e in kernels)
        sendrecv = [e for e in kernels if e["name"].startswith("ncclDevKernel_SendRecv")]
        assert all(("Dst Rank" in e["args"]) != ("Src Rank" in e["args"]) for e in sendrecv)
        works = {e["name"].split(" ")[0] for e in events if e["name"].startswith("nccl:")}
        assert {"nccl:send", "nccl:recv", "nccl:all_reduce"} <= works
    # every send has exactly one recv, and the other way round
    assert sends and sends == recvs and set(sends.values()) == {1}
    # Seq counts 1, 2, ... per group on each rank, the same sequence of ops on every member
    for name, per_rank in seqs.items():
        assert sorted(per_rank) == sorted(names[name]["ranks"]), name
        lists = list(per_rank.values())
        assert all(lst == lists[0] for lst in lists), name
        assert [s for _, s in lists[0]] == list(range(1, len(lists[0]) + 1))
    tp_group = next(g for g in t["groups"] if g["desc"] == "TENSOR_MODEL_PARALLEL_GROUP")
    # per microbatch and layer: 2 forward + 2 backward all-reduces; the embedding's on stage 0
    per_step = cfg.microbatches * (cfg.layers // cfg.pp) * 4 + cfg.microbatches
    assert len(seqs[tp_group["name"]][0]) == cfg.steps * per_step
    # older traces: no peer in the args
    generate(dataclasses.replace(cfg, p2p_peer_args=False), tmp_path / "old")
    old = _trace(tmp_path / "old", 1)["traceEvents"]
    p2p = [e for e in old if e.get("args", {}).get("Collective name") in ("send", "recv")]
    assert p2p and not any("Dst Rank" in e["args"] or "Src Rank" in e["args"] for e in p2p)


@pytest.mark.parametrize(("pp", "m"), [(4, 6), (4, 2), (2, 4)])
def test_1f1b_order(pp: int, m: int) -> None:
    job = simulate_parallel(_config(ranks=pp, tp=1, pp=pp, dp=1, microbatches=m, steps=1))
    for rank in range(pp):
        stage = job.layout.coords(rank).pp
        order = [(p.kind, p.mb) for p in job.phases[rank]]
        warm = min(pp - stage - 1, m)
        expect = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            expect += [("F", warm + i), ("B", i)]
        expect += [("B", i) for i in range(m - warm, m)]
        assert order == expect, (stage, order)
        # and the phases ran in that order on the GPU, one after the other
        ends = [p.end for p in job.phases[rank]]
        starts = [p.start for p in job.phases[rank]]
        assert all(b >= a for a, b in zip(ends, starts[1:], strict=False))
    # the schedule's exchanges: stage 1 of 4 receives forward before it sends it on
    acts = schedule(job.config.schedule, 4, 1, 4)
    assert acts[0] == ("X", [(acts[0][1][0][0], 0, 0)])


def _compute(job: ParallelJob) -> np.ndarray:
    return job.compute_ns.sum(axis=0)


def test_slow_worker_stage_imbalance_and_counterfactual() -> None:
    base_cfg = _config(jitter=0.0)
    base = simulate_parallel(base_cfg)
    slow_cfg = dataclasses.replace(base_cfg, slow_worker=[(5, 2.0, 1.0)])
    slow = simulate_parallel(slow_cfg)
    extra = _compute(slow) - _compute(base)
    # only rank 5's compute is longer: x2, all but the grad-norm kernel (one per step)
    norm_ns = round(base_cfg.relu_kernel_us * 1000) * base_cfg.steps
    assert extra[5] == _compute(base)[5] - norm_ns
    assert (np.delete(extra, 5) == 0).all()
    t = truth(slow)
    (fault,) = t["faults"]
    assert t["fault"] == "slow_worker" and fault["ranks"] == [5]
    assert fault["coords"] == [{"tp": 1, "dp": 0, "pp": 1}]
    again = step_times(simulate_parallel(base_cfg))
    cf = fault["counterfactual"]
    assert cf["step_ns"] == again == step_times(base)
    assert cf["saving_ns"] == t["mean_step_ns"] - round(sum(again) / len(again)) > 0
    assert t["counterfactual"]["step_ns"] == again
    # stage imbalance: every rank of stage 1 computes more, the others the same
    imb = simulate_parallel(dataclasses.replace(base_cfg, stage_layers=[(1, 4)]))
    extra = _compute(imb) - _compute(base)
    stage1 = [r for r in range(8) if imb.layout.coords(r).pp == 1]
    assert (extra[stage1] > 0).all() and (np.delete(extra, stage1) == 0).all()
    ti = truth(imb)
    assert ti["fault"] == "stage_imbalance" and ti["faults"][0]["stage"] == 1
    assert ti["faults"][0]["ranks"] == stage1 == [4, 5, 6, 7]
    assert ti["faults"][0]["counterfactual"]["step_ns"] == step_times(base)
    assert ti["faults"][0]["counterfactual"]["saving_pct"] > 10


def test_data_imbalance_moves_and_counterfactual_is_the_job_without_it() -> None:
    cfg = _config(dp=2, data_imbalance=0.6, steps=4, jitter=0.0)
    job = simulate_parallel(cfg)
    f = job.data_factor
    assert f.shape == (4, 2, 4)
    heaviest = {divmod(int(f[s].argmax()), 4) for s in range(4)}
    assert len(heaviest) > 1  # the heavy microbatch is not always on one (dp, mb)
    # a rank's compute in a step follows its replica's work (every stage and tp rank alike)
    base = simulate_parallel(dataclasses.replace(cfg, data_imbalance=0.0))
    for s in range(4):
        for r in range(8):
            co = job.layout.coords(r)
            same = [q for q in range(8) if job.layout.coords(q).pp == co.pp]
            assert set(job.compute_ns[s, same]) == set(job.compute_ns[s, [r, r ^ 2]])
            ratio = (job.compute_ns[s, r] - 0) / base.compute_ns[s, r]
            assert min(f[s, co.dp]) * 0.9 < ratio < max(f[s, co.dp]) * 1.1
        heavy = int(f[s].sum(axis=1).argmax())
        for stage_ranks in ([0, 2], [4, 6]):  # tp 0 of dp 0 and dp 1, per stage
            assert int(np.argmax(job.compute_ns[s, stage_ranks])) == heavy
    t = truth(job)
    (fault,) = t["faults"]
    assert fault["class"] == "data_imbalance" and fault["ranks"] == []
    assert fault["median_factor"] == float(np.median(f))  # told, not used: it scatters
    # every microbatch at factor 1, the median of the lognormal drawn from: the job regenerated
    # without the imbalance (the very job `base` is)
    assert (base.data_factor == 1.0).all()
    assert fault["counterfactual"]["step_ns"] == step_times(base)
    assert [w["step"] for w in fault["heaviest_per_step"]] == [0, 1, 2, 3]


def test_gc_pause_slow_link_and_validation() -> None:
    base_cfg = _config(jitter=0.0)
    base = simulate_parallel(base_cfg)
    gc = simulate_parallel(dataclasses.replace(base_cfg, gc_pause=[(2, 5.0, 0.5)]))
    assert len(gc.gc) == 1 and gc.gc[0]["rank"] == 2 and gc.gc[0]["ns"] == 5_000_000
    assert (_compute(gc) == _compute(base)).all()  # a CPU pause, not GPU work
    assert max(step_times(gc)) > max(step_times(base))
    link = truth(simulate_parallel(dataclasses.replace(base_cfg, slow_host_link=[(0, 1, 4.0)])))
    assert link["fault"] == "slow_link" and link["faults"][0]["hosts"] == [0, 1]
    crossing = [c for c in link["collectives"] if len({r // 4 for r in c["ranks"]}) == 2]
    inside = [c for c in link["collectives"] if len({r // 4 for r in c["ranks"]}) == 1]
    plain = truth(base)
    by_key = {(c["group"], c["seq"]): c["transfer_ns"] for c in plain["collectives"]}
    assert crossing and all(c["transfer_ns"] > 3 * by_key[(c["group"], c["seq"])] for c in crossing)
    assert all(c["transfer_ns"] == by_key[(c["group"], c["seq"])] for c in inside)
    two = truth(simulate_parallel(dataclasses.replace(base_cfg, slow_worker=[(1, 1.5, 1.0)],
                                                      gc_pause=[(2, 5.0, 0.5)])))  # fmt: skip
    assert two["fault"] == "multiple" and len(two["faults"]) == 2
    for bad, message in [
        (dict(ranks=6), "--ranks 6 is not tp x pp x dp"),
        (dict(layers=5), "--layers: 5 layers do not split over 2 stages"),
        (dict(stragglers=[(1, 1.0, 1.0)]), "--straggler: DDP jobs only"),
        (dict(slow_worker=[(9, 2.0, 1.0)]), "--slow-worker: rank 9 not in the job"),
        (dict(slow_worker=[(1, 0.5, 1.0)]), "--slow-worker: factor must be > 1"),
    ]:
        with pytest.raises(UsageError, match=message.replace("(", r"\(")):
            _config(**bad).validate()
    with pytest.raises(UsageError, match="--gc-pause: a parallel job's fault"):
        SynthConfig(gc_pause=[(1, 1.0, 1.0)]).validate()


def test_gpipe_and_fsdp_run() -> None:
    gp = simulate_parallel(_config(schedule="gpipe", steps=1))
    order = [(p.kind, p.mb) for p in gp.phases[0]]
    assert order == [("F", i) for i in range(4)] + [("B", i) for i in range(4)]
    fs = truth(simulate_parallel(_config(fsdp=True, steps=1)))
    assert {g["desc"] for g in fs["groups"]} == {"default_pg", "mesh_pp", "mesh_dp_shard",
                                                 "mesh_tp"}  # fmt: skip
    kinds = Counter((c["kind"], c["op"]) for c in fs["collectives"])
    layers = 2 * 2  # layers per stage x (forward + backward) all-gathers
    dp_groups = 4
    assert kinds[("fsdp_param", "_allgather_base")] == dp_groups * 4 * layers
    assert kinds[("fsdp_grad", "_reduce_scatter_base")] == dp_groups * 2


def test_merge_8_ranks(tmp_path: Path) -> None:
    cfg = _config(slow_worker=[(5, 1.5, 1.0)], clock_offset=[(1, 0.5)])
    job = tmp_path / "job"
    generate(cfg, job)
    t = json.loads((job / "truth.json").read_text())
    with rankscope.open(
        merge_run_dir(job, output=tmp_path / "t.h5", scheduler="synchronous", quiet=True)
    ) as store:
        assert store.problems().empty, store.problems().to_string()
        assert store.ranks == list(range(8))
        assert sorted(store.steps()["step"].unique()) == [0, 1]
        coll = store.collectives()
        # every group collective is matched on all of its members
        sizes = coll[~coll["op"].isin(["send", "recv"])].groupby("coll")["rank"].nunique()
        assert len(sizes) == len(t["collectives"])
        assert sorted(sizes.value_counts().to_dict().items()) == sorted(
            Counter(len(c["ranks"]) for c in t["collectives"]).items()
        )
        clock = store.clock().set_index("rank")
        errors = [
            abs(int(clock.loc[r["rank"], "offset_ns"]) - r["offset_to_rank0_ns"])
            for r in t["ranks"]
        ]
        assert max(errors) < 100_000  # within 0.1 ms of the 0.5 ms offset (issue 24, item 4)
