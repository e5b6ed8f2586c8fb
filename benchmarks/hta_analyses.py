"""Regenerate HTA 0.5.0's figures for its idle-time, launch, queue-length and kernel-sequence
analyses on the real GPU traces in tests/data, into tests/data/hta_reference.json.

    python benchmarks/hta_analyses.py --hta-python /tmp/hta-venv/bin/python   # print
    python benchmarks/hta_analyses.py --write                                 # and store

HTA (PyPI ``HolisticTraceAnalysis==0.5.0``) runs in its own venv (``--hta-python``; create one
with ``python -m venv V && V/bin/pip install HolisticTraceAnalysis==0.5.0 psutil``): it is no
dependency of rankscope nor of its tests. ``tests/test_hta_analyses.py`` compares rankscope's
figures with what this stores (0.5 % for times, exactly for counts). Each set's ``analyses`` key
is replaced; the temporal-breakdown figures beside it (``ranks``) are left as they are.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
REFERENCE = DATA / "hta_reference.json"
HTA_PYTHON = Path("/tmp/hta-venv/bin/python")
#: The sets with GPU kernels (tests/data/README.md).
SETS = (
    "hta/trace_filter_2rank",
    "hta/df_index_resolver",
    "hta/nccl_parser_config",
    "param_dlrm_8rank",
)
#: The operators whose kernel sequences are counted (kernel_sequences.DEFAULT_OPERATORS: HTA's
#: ``operator_name``, a substring; HTA starts from the shallowest matches).
SEQUENCE_OPERATORS = ("aten::", "autograd::engine::evaluate_function")
#: HTA's defaults, stated (the figures depend on them).
MIN_PATTERN_LEN = 3

HTA_SCRIPT = r"""
import json, logging, sys, tempfile
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
folder, operators, min_len = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
a = TraceAnalysis(trace_dir=folder)
out = {}
for rank in sorted(a.t.get_all_traces()):
    r = {}
    idle, _ = a.get_idle_time_breakdown(ranks=[rank], visualize=False)
    streams = {}
    for row in idle.itertuples(index=False):
        streams.setdefault(str(int(row.stream)), {})[str(row.idle_category)] = float(row.idle_time)
    r["idle_time_us"] = streams
    ls = a.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)[rank]
    r["launch_stats"] = {
        "launches": int(len(ls)),
        "cpu_us": float(ls["cpu_duration"].sum()),
        "gpu_us": float(ls["gpu_duration"].sum()),
        "delay_us": float(ls["launch_delay"].sum()),
        "delay_max_us": float(ls["launch_delay"].max()) if len(ls) else 0.0,
        "short_kernels": int(((ls["cpu_duration"] <= 50) & (ls["gpu_duration"] < ls["cpu_duration"])).sum()),
        "runtime_outliers": int((ls["cpu_duration"] > 50).sum()),
        "delay_outliers": int((ls["launch_delay"] > 100).sum()),
    }
    try:
        q = a.get_queue_length_summary(ranks=[rank])
        r["queue_length"] = {
            str(int(s)): {
                "changes": int(row[("queue_length", "count")]),
                "mean": float(row[("queue_length", "mean")]),
                "max": int(row[("queue_length", "max")]),
            }
            for (_, s), row in q.iterrows()
        } if q is not None else {}
    except Exception as e:  # HTA asserts one kernel per launch call
        r["queue_length"] = {"hta_failed": f"{type(e).__name__}: {e}"}
    r["kernel_sequences"] = {}
    for operator in operators:
        with tempfile.TemporaryDirectory() as out_dir:
            try:
                p = a.get_frequent_cuda_kernel_sequences(
                    operator_name=operator, output_dir=out_dir, rank=rank,
                    min_pattern_len=min_len, visualize=False,
                )
                r["kernel_sequences"][operator] = [
                    {"pattern": str(x.pattern), "count": int(x.count)}
                    for x in p.itertuples(index=False)
                ] if len(p) else []
            except Exception as e:
                r["kernel_sequences"][operator] = {"hta_failed": f"{type(e).__name__}: {e}"}
    out[str(rank)] = r
print(json.dumps(out))
"""


def run_hta(name: str, python: Path, operators: list[str]) -> dict[str, object]:
    """HTA's figures on one set (trace files copied alone into a temporary folder)."""
    src = DATA / name
    with tempfile.TemporaryDirectory(prefix="rankscope-hta-") as d:
        for f in sorted(src.iterdir()):
            if f.name.endswith((".json", ".json.gz")):
                shutil.copy2(f, Path(d) / f.name)
        proc = subprocess.run(
            [str(python), "-c", HTA_SCRIPT, d, ",".join(operators), str(MIN_PATTERN_LEN)],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        return {"hta_failed": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return {
        "operators": operators,
        "min_pattern_len": MIN_PATTERN_LEN,
        "ranks": json.loads(proc.stdout.strip().splitlines()[-1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hta-python", type=Path, default=HTA_PYTHON)
    parser.add_argument("--write", action="store_true", help=f"store the figures in {REFERENCE}")
    parser.add_argument("--only", nargs="+", choices=SETS, help="these sets (default: all)")
    parser.add_argument(
        "--operators", nargs="+", default=list(SEQUENCE_OPERATORS), help="kernel-sequence operators"
    )
    args = parser.parse_args()
    if not args.hta_python.exists():
        sys.exit(f"{args.hta_python}: no such interpreter (create the HTA venv first, see --help)")
    figures = {}
    for name in args.only or SETS:
        figures[name] = run_hta(name, args.hta_python, args.operators)
        print(name, json.dumps(figures[name])[:2000])
    ref = json.loads(REFERENCE.read_text())  # read late: another run may have written meanwhile
    for name, fig in figures.items():
        ref["sets"][name]["analyses"] = fig
    if args.write:
        REFERENCE.write_text(json.dumps(ref, indent=1) + "\n")
        print(f"wrote {REFERENCE}")


if __name__ == "__main__":
    main()
