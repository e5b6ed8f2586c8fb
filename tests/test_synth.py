"""The synthetic job generator (``rankscope synth``, orchestrator/synth.py).

Its traces must merge without a problem (every rank, every all-reduce matched on all ranks), the
host clock offsets it writes must come back from the merge, the same seed must write the same
bytes, and its ground truth must obey the physics it claims (a collective ends at one time on
every rank, the last arrival does not wait, a straggler is late in exactly its slow steps).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
import rankscope
from rankscope.errors import UsageError
from rankscope.orchestrator.cli import main as cli
from rankscope.orchestrator.ingest.merge import merge_run_dir
from rankscope.orchestrator.synth import (
    SynthConfig,
    generate,
    simulate,
    transfer_ns,
    truth,
)

#: Clock errors the merge must stay within (µs → ns).
CLOCK_TOLERANCE_NS = 10_000


def _merge(folder: Path, tmp_path: Path) -> Path:
    return merge_run_dir(folder, output=tmp_path / "t.h5", scheduler="synchronous", quiet=True)


def _config(**kw) -> SynthConfig:
    base = dict(ranks=8, ranks_per_host=4, steps=3, seed=3)
    base.update(kw)
    return SynthConfig(**base)


@pytest.mark.parametrize(
    ("ranks", "offsets"),
    [(8, [(1, 0.75)]), (4, [(0, 0.2), (1, -1.5)])],
    ids=["8 ranks", "4 ranks, both hosts shifted"],
)
def test_merges_without_problems_and_clocks_come_back(
    tmp_path: Path, ranks: int, offsets: list[tuple[int, float]]
) -> None:
    cfg = _config(
        ranks=ranks,
        ranks_per_host=ranks // 2,
        stragglers=[(ranks - 1, 3.0, 0.7)],
        clock_offset=offsets,
    )
    job = tmp_path / "job"
    generate(cfg, job)
    assert sorted(p.name for p in job.iterdir()) == sorted(
        [f"rank-{r}.json.gz" for r in range(ranks)] + ["truth.json"]
    )
    t = json.loads((job / "truth.json").read_text())
    with rankscope.open(_merge(job, tmp_path)) as store:
        assert store.problems().empty, store.problems().to_string()
        assert store.ranks == list(range(ranks))
        assert store.world_size == ranks
        # collectives: one row per (collective, rank), every all-reduce on every rank
        coll = store.collectives()
        assert not coll.duplicated(["coll", "rank"]).any()
        per = coll.groupby("coll")["rank"].nunique()
        assert (per == ranks).all()
        assert len(per) == len(t["collectives"]) == cfg.steps * (cfg.buckets + 1)
        assert set(coll["op"]) == {"allreduce"}
        assert sorted(coll.groupby("coll")["bytes"].first()) == sorted(
            c["bytes"] for c in t["collectives"]
        )
        # the clock: rank r's raw clock + offset_ns = rank 0's clock
        clock = store.clock().set_index("rank")
        for r in t["ranks"]:
            err = int(clock.loc[r["rank"], "offset_ns"]) - r["offset_to_rank0_ns"]
            assert abs(err) <= CLOCK_TOLERANCE_NS, (r["rank"], err)
        # aligned NCCL ends agree with the truth's ends (on rank 0's clock)
        rank0 = t["ranks"][0]["clock_offset_ns"]
        ends = coll.sort_values(["coll", "rank"]).groupby("coll")["end"]
        true_ends = sorted(c["end_ns"] + rank0 for c in t["collectives"])
        assert np.abs(np.sort(ends.max().to_numpy()) - true_ends).max() <= CLOCK_TOLERANCE_NS
        assert (ends.max() - ends.min()).max() <= CLOCK_TOLERANCE_NS
        steps = store.steps()
        assert sorted(steps["step"].unique()) == list(range(cfg.steps))
        assert len(steps) == cfg.steps * ranks


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    cfg = _config(ranks=4, ranks_per_host=2, stragglers=[(2, 2.0, 0.5)], clock_drift=[(1, 20.0)])
    generate(cfg, tmp_path / "a")
    generate(cfg, tmp_path / "b")
    for name in [*(f"rank-{r}.json.gz" for r in range(4)), "truth.json"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    generate(_config(ranks=4, ranks_per_host=2, seed=4), tmp_path / "c")
    assert (tmp_path / "a" / "rank-0.json.gz").read_bytes() != (
        tmp_path / "c" / "rank-0.json.gz"
    ).read_bytes()


def test_physics_invariants() -> None:
    cfg = _config(ranks=8, steps=10, stragglers=[(5, 3.0, 0.6)])
    job = simulate(cfg)
    t = truth(job)
    nccl = [i for i, tm in enumerate(job.templates) if tm.kind == "gpu" and tm.lane == "nccl"]
    assert len(nccl) == cfg.buckets + 1
    # every NCCL kernel ends at one time on all ranks; it starts at that rank's arrival
    ends = job.end[:, nccl, :]
    assert (ends == ends[..., :1]).all()
    for c in t["collectives"]:
        arrival = np.array(c["arrival_ns"])
        assert c["end_ns"] == arrival.max() + c["transfer_ns"]
        assert c["transfer_ns"] == transfer_ns(cfg, c["bytes"])
        wait = arrival.max() - arrival
        assert wait[c["last_rank"]] == 0
        assert wait.min() == 0
    # a stream runs one thing at a time (kernels, copies and collectives queue)
    for lane in ("compute", "nccl"):
        idx = [i for i, tm in enumerate(job.templates) if tm.kind == "gpu" and tm.lane == lane]
        start = job.start[:, idx, :].transpose(2, 0, 1).reshape(cfg.ranks, -1)
        end = job.end[:, idx, :].transpose(2, 0, 1).reshape(cfg.ranks, -1)
        order = np.argsort(start, axis=1, kind="stable")
        start, end = np.take_along_axis(start, order, 1), np.take_along_axis(end, order, 1)
        assert (start[:, 1:] >= end[:, :-1]).all(), lane
    # the straggler: slow in exactly round(0.6 * 10) steps, and late at every bucket of those
    (s,) = t["stragglers"]
    assert s["rank"] == 5 and s["cause"] == "own compute"
    assert len(s["slow_steps"]) == 6
    for c in t["collectives"]:
        if c["kind"] != "bucket":
            continue
        arrival = np.array(c["arrival_ns"])
        others = np.delete(arrival, 5)
        late = arrival[5] - np.median(others)
        if c["step"] in s["slow_steps"]:
            assert c["last_rank"] == 5
            assert late > 0.2e6, c  # at least the first bucket's share of 3 ms
        else:
            assert late < 0.2e6, c
    # the busiest rank is the straggler: it computes ~3 ms more in each slow step ...
    steps = t["ranks"][5]["steps"]
    normal = np.median([r["steps"]["compute_ns"] for r in t["ranks"] if r["rank"] != 5], axis=0)
    extra = np.array(steps["compute_ns"]) - normal
    slow = [st in s["slow_steps"] for st in steps["step"]]
    assert np.allclose(extra[slow], 3e6, rtol=0.1)
    assert np.abs(extra[~np.array(slow)]).max() < 0.3e6
    # ... and waits least
    waits = [r["wait_ns"] for r in t["ranks"]]
    assert int(np.argmin(waits)) == 5
    # the step accounting closes: busy + idle = span, exposed <= comm
    for r in t["ranks"]:
        st = r["steps"]
        for i in range(cfg.steps):
            span = st["end_ns"][i] - st["start_ns"][i]
            busy = st["compute_ns"][i] + st["memcpy_ns"][i] + st["exposed_comm_ns"][i]
            assert busy + st["idle_ns"][i] == span
            assert 0 <= st["exposed_comm_ns"][i] <= st["comm_ns"][i]
            assert st["idle_ns"][i] >= st["input_ns"][i]  # the GPU idles while data loads
        assert r["wait_ns"] == sum(st["wait_ns"])


def test_slow_input_and_slow_link() -> None:
    base = simulate(_config(ranks=4, ranks_per_host=2, jitter=0.0))
    slow = simulate(_config(ranks=4, ranks_per_host=2, jitter=0.0, slow_input=[(1, 4.0)]))
    tb, ts = truth(base), truth(slow)
    assert ts["stragglers"] == [
        {"rank": 1, "cause": "input", "extra_ms": 4.0, "fraction": 1.0, "slow_steps": [0, 1, 2]}
    ]
    assert ts["ranks"][1]["input_ns"] - tb["ranks"][1]["input_ns"] == 3 * 4_000_000
    for c in ts["collectives"]:
        if c["kind"] == "bucket":
            assert c["last_rank"] == 1
    # no jitter, no straggler: everyone arrives together, nobody waits
    assert all(r["wait_ns"] == 0 for r in tb["ranks"])
    link = truth(simulate(_config(ranks=4, ranks_per_host=2, jitter=0.0, slow_link=3.0)))
    for a, b in zip(tb["collectives"], link["collectives"], strict=True):
        assert b["transfer_ns"] == pytest.approx(3 * a["transfer_ns"], abs=2)
    assert all(r["wait_ns"] == 0 for r in link["ranks"])


def test_trace_shape(tmp_path: Path) -> None:
    """The torch 2.x details a reader relies on: comm args, flows, distributedInfo, base time."""
    generate(_config(ranks=4, ranks_per_host=2, steps=2, first_step=7), tmp_path)
    trace = json.loads(gzip.decompress((tmp_path / "rank-3.json.gz").read_bytes()))
    assert trace["distributedInfo"]["rank"] == 3
    assert trace["distributedInfo"]["world_size"] == 4
    assert isinstance(trace["baseTimeNanoseconds"], int)
    events = trace["traceEvents"]
    steps = [e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")]
    assert steps == ["ProfilerStep#7", "ProfilerStep#8"]
    rpc = [e for e in events if e.get("name") == "record_param_comms"]
    kernels = [e for e in events if e.get("name", "").startswith("ncclDevKernel_AllReduce")]
    assert len(rpc) == len(kernels) == 2 * 5
    for e in (*rpc, *kernels):
        a = e["args"]
        assert a["Collective name"] == "allreduce" and a["Group size"] == 4
        assert a["Process Group Name"] == "0" and a["Rank"] == 3 and a["dtype"] == "Float"
    assert [e["args"]["Seq"] for e in kernels] == list(range(1, 11))
    # every kernel / memcpy has its launch (same correlation) and an ac2g flow pair
    runtime = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime"}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")]
    assert all(e["args"]["correlation"] in runtime for e in gpu)
    flows = [e for e in events if e.get("cat") == "ac2g"]
    assert len(flows) == 2 * len(gpu)
    assert all(e["pid"] == 1 for e in gpu)  # local rank 1 of its host
    assert {e["tid"] for e in gpu} == {7, 20}
    assert min(e["ts"] for e in events if e.get("ph") == "X") >= 0
    # Kineto's layout: µs with 3 decimals, one event per block (the streaming reader cuts there)
    text = gzip.decompress((tmp_path / "rank-3.json.gz").read_bytes()).decode()
    stamps = re.findall(r'"(?:ts|dur)": ([0-9.]+)', text)
    assert stamps and all(re.fullmatch(r"\d+\.\d{3}", v) for v in stamps)
    assert text.count("\n  },\n  {") == len(events) - 1


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job"
    args = ["synth", str(out), "--ranks", "4", "--ranks-per-host", "2", "--steps", "2"]
    assert cli([*args, "--straggler", "3:2.5:0.5", "--clock-offset", "1:0.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wrote 4 rank traces (2 steps,")
    t = json.loads((out / "truth.json").read_text())
    assert t["config"]["stragglers"] == [[3, 2.5, 0.5]]
    assert t["ranks"][2]["clock_offset_ns"] == 500_000
    assert cli(args) == 2  # a job is there already
    assert "--overwrite" in capsys.readouterr().err
    assert cli([*args, "--overwrite", "--ranks", "2", "--ranks-per-host", "1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "rank-0.json.gz",
        "rank-1.json.gz",
        "truth.json",
    ]
    capsys.readouterr()
    for bad, message in [
        (["--straggler", "9:1"], "--straggler: rank 9 not in the job"),
        (["--straggler", "1:x"], "--straggler: expected RANK:EXTRA_MS[:FRACTION]"),
        (["--straggler", "1:1:1.5"], "--straggler: fraction must be in (0, 1]"),
        (["--slow-input", "1:-2"], "--slow-input: extra ms must be > 0"),
        (["--clock-offset", "5:1"], "--clock-offset: host 5 not in the job"),
        (["--ranks", "many"], "--ranks: expected an integer"),
        (["--link-gbps", "0"], "--link-gbps: must be > 0"),
        (["--bucket-bytes", "1,x"], "--bucket-bytes: expected N[,N...]"),
    ]:
        assert cli(["synth", str(tmp_path / "other"), *bad]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (bad, err)


def test_validate_raises_usage_error() -> None:
    with pytest.raises(UsageError, match="--buckets: at most one per layer"):
        SynthConfig(layers=2, buckets=3).validate()
    with pytest.raises(UsageError, match="given twice"):
        SynthConfig(stragglers=[(1, 1.0, 1.0), (1, 2.0, 1.0)]).validate()
