"""The straggler scenario matrix at scale: synthetic jobs with known truth, through rankscope.

    python benchmarks/scenarios.py                   # 256 ranks, every scenario
    python benchmarks/scenarios.py --ranks 32 --only intermittent two-stragglers
    python benchmarks/scenarios.py --hta             # also load one set with HTA 0.5.0
    python benchmarks/scenarios.py --whatif          # the what-if cases of tests/test_whatif.py
    python benchmarks/scenarios.py --layered --ranks 64   # tensor x pipeline x data parallel

For each scenario of ``tests/test_scenarios.py`` (the same definitions): generate the job with
``rankscope synth`` (orchestrator/synth.py; 32 hosts of 8 GPUs at 256 ranks), merge it and
analyse it as whole processes (what a user runs), and print one row: the true stragglers and
causes, what rankscope named, precision and recall, the worst clock error (µs), the worst
compute/exposed-communication error against the truth (%), and the wall seconds of each step.
A figure-printing script, never a test; docs/performance.md records its output.

``--whatif`` runs instead the what-if accuracy cases of ``tests/test_whatif.py`` (``CASES``: a job
and its clean twin, same seed) at ``--ranks`` and prints each predicted saving beside the
measured one (the suite runs every case at 32 ranks; 256 ranks only here: two 256-rank jobs a case).

``--layered`` runs instead the layered cases of ``tests/test_scenarios.py`` (``LAYERED``: balanced,
a slow worker, stage imbalance, data-dependent imbalance; issue 24) in a tensor x pipeline x data
parallel layout of ``--ranks`` (:data:`BENCH_LAYOUTS`), each generated, merged and analysed as
whole processes, then judged like the suite judges its 8- and 32-rank layouts: the class, ranks
or stage named against the truth (precision and recall over the faults named), and the what-if
saving beside the counterfactual's (the same job regenerated without the fault).

``--hta`` loads the 8-rank balanced set with ``HolisticTraceAnalysis==0.5.0`` in its own venv
(benchmarks/merge_vs_hta.py ``--setup-hta`` creates it) and compares HTA's per-rank compute time
with the truth: the generator's traces must be readable by the peer tool too; with ``--layered``
the 8-rank layered (DP 2 x PP 2 x TP 2) balanced set as well.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from timing import whole_process_s

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
HTA_PYTHON = Path("/tmp/hta-venv/bin/python")
if TYPE_CHECKING:
    from test_scenarios import Layout

HTA_SCRIPT = """
import json, sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
df = ta.get_temporal_breakdown(visualize=False)
print(json.dumps({int(r["rank"]): float(r["compute_time(us)"]) for _, r in df.iterrows()}))
"""


def one(root: Path, ranks: int, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    from rankscope.analysis.engine.driver import SYNCHRONOUS, ClusterSpec, analyze
    from rankscope.orchestrator.synth import SynthConfig, generate

    out = root / f"{ranks}-{name}"
    per_host = ranks // 2 if name == "clock-skew-drift" else min(8, ranks)
    t = time.perf_counter()
    generate(SynthConfig(ranks=ranks, ranks_per_host=per_host, steps=10, seed=1, **kwargs), out)
    gen_s = time.perf_counter() - t
    rs = [sys.executable, "-m", "rankscope"]
    merge_s = whole_process_s([*rs, "merge", str(out), "-q"])
    analyze_s = whole_process_s(
        [*rs, "analyze", str(out / "trace.h5"), "--json", str(out / "s.json")]
    )
    truth = json.loads((out / "truth.json").read_text())
    a = analyze(out / "trace.h5", ClusterSpec(scheduler=SYNCHRONOUS))
    s = a.stragglers
    named = {int(r.rank): str(r.cause) for r in s[s["is_straggler"]].itertuples()}
    expected = {int(t["rank"]): t["cause"] for t in truth["stragglers"]}
    right = {r for r in named if expected.get(r) == named[r]}
    clock = a.clock.set_index("rank")["offset_ns"]
    whole = a.whole().set_index("rank")
    clock_err = max(
        abs(int(clock[r["rank"]]) - int(r["offset_to_rank0_ns"])) for r in truth["ranks"]
    )
    part_err = max(
        abs(float(whole.loc[r["rank"], ours]) - r[theirs]) / max(r[theirs], 1)
        for r in truth["ranks"]
        for ours, theirs in (("compute_ns", "compute_ns"), ("comm_exposed_ns", "exposed_comm_ns"))
    )
    shutil.rmtree(out)
    return {
        "scenario": name,
        "truth": ", ".join(f"{r} {c}" for r, c in sorted(expected.items())) or "none",
        "named": ", ".join(f"{r} {c}" for r, c in sorted(named.items())) or "none",
        "precision": len(right) / len(named) if named else 1.0,
        "recall": len(right) / len(expected) if expected else 1.0,
        "clock_err_us": clock_err / 1e3,
        "part_err_pct": 100 * part_err,
        "gen_s": gen_s,
        "merge_s": merge_s,
        "analyze_s": analyze_s,
    }


def hta_check(root: Path, layered: bool = False) -> str:
    from rankscope.orchestrator.synth import SynthConfig, generate
    from test_scenarios import LAYOUTS, generate_layered

    if not HTA_PYTHON.exists():
        return f"HTA: no {HTA_PYTHON} (python benchmarks/merge_vs_hta.py --setup-hta)"
    out = root / ("hta-8-layered" if layered else "hta-8")
    if layered:
        generate_layered(out, 8, "balanced", LAYOUTS[8])
    else:
        generate(SynthConfig(ranks=8, steps=5, seed=1), out)
    truth = json.loads((out / "truth.json").read_text())
    # HTA takes every *.json of its folder as a rank trace: give it the traces alone
    traces = out / "traces"
    traces.mkdir()
    for f in out.glob("rank-*.json.gz"):
        f.rename(traces / f.name)
    proc = subprocess.run(
        [str(HTA_PYTHON), "-c", HTA_SCRIPT, str(traces)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        return f"HTA failed to load the set: {proc.stderr.strip().splitlines()[-1:]}"
    hta = json.loads(proc.stdout.strip().splitlines()[-1])

    def truth_ns(r: dict[str, Any]) -> float:
        # HTA 0.5.0 keeps only GPU events launched before the last ProfilerStep (several steps)
        steps = r["steps"]["compute_ns"]
        return float(sum(steps[:-1]))

    # json keys are strings; HTA's compute time is in µs, the truth's in ns
    err = max(abs(hta[str(r["rank"])] * 1e3 - truth_ns(r)) / truth_ns(r) for r in truth["ranks"])
    which = "layered (DP 2 x PP 2 x TP 2)" if layered else "data-parallel"
    return (
        f"HTA 0.5.0 loads the 8-rank {which} set; its compute time per rank (all steps but the "
        f"last, as HTA counts) is within {100 * err:.3f} % of the truth"
    )


#: ranks -> the benchmark's layered layout: (tp, pp, dp, steps, the slow worker, the heavy stage
#: and its layers); 8 layers in all, so 2 per stage at PP 4 and 1 at PP 8.
BENCH_LAYOUTS: dict[int, Layout] = {
    64: (2, 4, 8, 4, 13, (2, 3)),
    256: (2, 8, 16, 4, 51, (5, 2)),
}


def layered_one(root: Path, ranks: int, name: str) -> dict[str, Any]:
    """One layered case: generated, merged and analysed as whole processes, then judged."""
    from rankscope.analysis.engine import whatif as wi
    from test_scenarios import generate_layered, layered_verdict, links_of, root_causes_of

    out = root / f"{ranks}-{name}"
    t = time.perf_counter()
    generate_layered(out, ranks, name, BENCH_LAYOUTS[ranks])
    gen_s = time.perf_counter() - t
    rs = [sys.executable, "-m", "rankscope"]
    merge_s = whole_process_s([*rs, "merge", str(out), "-q"])
    analyze_s = whole_process_s(
        [*rs, "analyze", str(out / "trace.h5"), "--json", str(out / "s.json")]
    )
    truth = json.loads((out / "truth.json").read_text())
    v = layered_verdict(truth, root_causes_of(out / "trace.h5"), links_of(out / "trace.h5"))
    if v["fault"] is not None and v["fault"]["class"] == "slow_link":  # the CLI's what-if
        rows = json.loads((out / "s.json").read_text())["what_if"]["scenarios"]
        key = wi.SCENARIO_KEYS[wi.SLOW_LINKS_LIKE_OTHERS]
        v["pct"] = next((100 * r["saving_share"] for r in rows if r["kind"] == key), 0.0)
        v["truth_pct"] = v["fault"]["counterfactual"]["saving_pct"]
    shutil.rmtree(out)

    def named(d: dict[str, Any]) -> set[tuple[str, int]]:
        return (
            {("slow worker", int(r)) for r in d["slow_worker"]}
            | {("stage", int(g)) for g in d["stage"]}
            | ({("data imbalance", -1)} if d["data"] else set())
            | {(f"slow link {pair}", -1) for pair in d["link"]}
        )

    want, got = named(v["expected"]), named(v["got"])
    # a group of pairs the job cannot tell apart that holds the true pair names it (the finding
    # says which hosts, and that the pair cannot be told); the table shows the group
    right = {w for w in want if any((g[0].split(" (")[0], g[1]) == w for g in got)}

    def said(items: set[tuple[str, int]]) -> str:
        return ", ".join(k if i < 0 else f"{k} {i}" for k, i in sorted(items)) or "none"

    return {
        "scenario": name,
        "truth": said(want),
        "named": said(got),
        "precision": len(right) / len(got) if got else 1.0,
        "recall": len(right) / len(want) if want else 1.0,
        "pct": v.get("pct", float("nan")),
        "truth_pct": v.get("truth_pct", float("nan")),
        "gen_s": gen_s,
        "merge_s": merge_s,
        "analyze_s": analyze_s,
    }


def layered_table(ranks: int, only: list[str] | None, hta: bool) -> None:
    """The layered cases at ``ranks`` (:data:`BENCH_LAYOUTS`): verdicts, what-if, seconds."""
    from test_scenarios import LAYERED, LINK_CASES

    if ranks not in BENCH_LAYOUTS:
        raise SystemExit(f"--layered: --ranks {ranks}: one of {sorted(BENCH_LAYOUTS)}")
    tp, pp, dp, steps, _, _ = BENCH_LAYOUTS[ranks]
    print(
        f"{ranks} ranks (TP {tp} x PP {pp} x DP {dp}), {steps} steps, load average "
        f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} cores"
    )
    head = (
        "| scenario | truth | named | precision | recall | what-if saving % | counterfactual % "
        "| error % of it | generate s | merge s | analyze s |"
    )
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    root = Path(tempfile.mkdtemp(prefix="rankscope-layered-"))
    try:
        for name in only or [*LAYERED, *LINK_CASES]:
            r = layered_one(root, ranks, name)
            faulty = r["truth_pct"] == r["truth_pct"]  # NaN: no fault, no what-if to judge
            pct, truth_pct, err = (
                (
                    f"{r['pct']:.1f}",
                    f"{r['truth_pct']:.1f}",
                    f"{100 * (r['pct'] - r['truth_pct']) / r['truth_pct']:+.1f}",
                )
                if faulty
                else ("—", "—", "—")
            )
            print(
                f"| {r['scenario']} | {r['truth']} | {r['named']} | {r['precision']:.2f} | "
                f"{r['recall']:.2f} | {pct} | {truth_pct} | {err} | "
                f"{r['gen_s']:.1f} | {r['merge_s']:.1f} | {r['analyze_s']:.1f} |",
                flush=True,
            )
        if hta:
            print(hta_check(root, layered=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def whatif_table(ranks: int, only: list[str] | None) -> None:
    """Predicted vs measured saving (ms per step, mean) of each what-if case at ``ranks``."""
    from test_whatif import CASES, _synth_saving

    print(f"what-if at {ranks} ranks, 10 steps, load average {os.getloadavg()[0]:.1f}")
    print("| case | scenario | measured saving ms/step | predicted ms/step | error % | s |")
    print("|---|---|---|---|---|---|")
    for case in only or list(CASES):
        root = Path(tempfile.mkdtemp(prefix="rankscope-whatif-"))
        try:
            t = time.perf_counter()
            predicted, measured = _synth_saving(root, ranks, case)
            print(
                f"| {case} | {CASES[case][3]} | {measured / 1e6:.3f} | {predicted / 1e6:.3f} | "
                f"{100 * (predicted - measured) / measured:+.1f} | {time.perf_counter() - t:.1f} |",
                flush=True,
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    from test_scenarios import SCENARIOS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--only", nargs="*", default=None, help="scenario names (default: all)")
    ap.add_argument("--hta", action="store_true", help="also load a set with HTA 0.5.0")
    ap.add_argument(
        "--whatif", action="store_true", help="the what-if cases of tests/test_whatif.py instead"
    )
    ap.add_argument(
        "--layered",
        action="store_true",
        help="the layered (TP x PP x DP) cases of tests/test_scenarios.py instead",
    )
    args = ap.parse_args()
    if args.layered:
        layered_table(args.ranks, args.only, args.hta)
        return
    if args.whatif:
        whatif_table(args.ranks, args.only)
        return
    names = args.only or list(SCENARIOS)
    root = Path(tempfile.mkdtemp(prefix="rankscope-scenarios-"))
    print(
        f"{args.ranks} ranks, 10 steps, load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores"
    )
    head = "| scenario | truth | named | precision | recall | clock err µs | compute/comm err % | generate s | merge s | analyze s |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    try:
        for name in names:
            r = one(root, args.ranks, name, SCENARIOS[name])
            print(
                f"| {r['scenario']} | {r['truth']} | {r['named']} | {r['precision']:.2f} | "
                f"{r['recall']:.2f} | {r['clock_err_us']:.2f} | {r['part_err_pct']:.3f} | "
                f"{r['gen_s']:.1f} | {r['merge_s']:.1f} | {r['analyze_s']:.1f} |",
                flush=True,
            )
        if args.hta:
            print(hta_check(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
