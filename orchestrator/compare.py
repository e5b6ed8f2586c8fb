"""``rankscope compare BASE NEW``: what changed between two runs, and a CI gate on it.

BASE and NEW are run directories, folders of traces or stores (merged first when needed, as
``rankscope analyze`` does). Both are analysed, compared by
:func:`rankscope.analysis.conclude.compare.compare` (pure), and rendered: the terminal table
(regressions red, improvements green, noise grey), ``--json`` and ``--markdown`` (a CI job
summary or PR comment) by ``analysis/render/compare.py``, ``--html`` (self-contained) by
``analysis/render/compare_html.py``. ``--fail-above PCT`` and the ``[thresholds]``
of ``--config FILE`` make it a gate: exit 1 when a job-level KPI is worse than its threshold —
by a one-sided Welch t test on the per-step means, or, with fewer than 3 steps a run, by the
threshold alone (said loudly) — 0 otherwise; every rendering names the rule that decided.
Method and formats: docs/compare.md.

This module is the command: its arguments, the settings from flags and ``--config``, resolving
the two runs and the gate; the renderings live beside it and are re-exported here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rankscope.analysis.render.compare import JSON_SCHEMA as JSON_SCHEMA
from rankscope.analysis.render.compare import JSON_VERSION as JSON_VERSION
from rankscope.analysis.render.compare import MARK as MARK
from rankscope.analysis.render.compare import OP_HEADERS as OP_HEADERS
from rankscope.analysis.render.compare import STYLE as STYLE
from rankscope.analysis.render.compare import fmt_p as fmt_p
from rankscope.analysis.render.compare import fmt_pct as fmt_pct
from rankscope.analysis.render.compare import fmt_value as fmt_value
from rankscope.analysis.render.compare import gate_line as gate_line
from rankscope.analysis.render.compare import gate_rule as gate_rule
from rankscope.analysis.render.compare import headline as headline
from rankscope.analysis.render.compare import op_cells as op_cells
from rankscope.analysis.render.compare import print_comparison as print_comparison
from rankscope.analysis.render.compare import render_markdown as render_markdown
from rankscope.analysis.render.compare import shown_kpi_rows as shown_kpi_rows
from rankscope.analysis.render.compare import to_json as to_json
from rankscope.analysis.render.compare_html import render_html as render_html
from rankscope.errors import InputFileError, UsageError

if TYPE_CHECKING:
    from rankscope.analysis.conclude.compare import GateConfig

#: Exit status when the gate fails (a gated KPI worse than its threshold).
EXIT_REGRESSION = 1
#: Terminal width when stdout is not a terminal.
PIPE_WIDTH = 120


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope compare`` (import-light)."""
    parser.add_argument("base", type=Path, help="BASE: a run directory or trace.h5")
    parser.add_argument("new", type=Path, help="NEW: a run directory or trace.h5")
    parser.add_argument(
        "--base-runs",
        type=Path,
        nargs="+",
        default=[],
        metavar="RUN",
        help="more runs with BASE's settings: the gate then tests run means, seeing the "
        "run-to-run noise (docs/compare.md)",
    )
    parser.add_argument(
        "--new-runs",
        type=Path,
        nargs="+",
        default=[],
        metavar="RUN",
        help="more runs with NEW's settings (as --base-runs)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the comparison as JSON")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write a self-contained page")
    parser.add_argument(
        "--markdown", type=Path, metavar="FILE", help="write a Markdown summary (CI, PR comment)"
    )
    parser.add_argument(
        "--fail-above",
        metavar="PCT",
        help="exit 1 when a headline KPI (step time, throughput, peak memory, FLOP/s, MFU) is "
        "worse than PCT (5%% or 5): a one-sided Welch t test of 'more than PCT worse' on the "
        "per-step means (the threshold alone, said so, below 3 steps a run)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML: fail_above, alpha, gate_alpha, run_noise, min_change and per-KPI "
        "[thresholds] (docs/compare.md)",
    )
    parser.add_argument(
        "--alpha", type=float, metavar="P", help="family-wise false-alarm rate (0.05)"
    )
    parser.add_argument(
        "--gate-alpha",
        type=float,
        metavar="P",
        help="the gate's false-alarm level per comparison (0.01: it is asked on every commit)",
    )
    parser.add_argument(
        "--run-noise",
        metavar="PCT",
        help="run-to-run noise of the machine the gate allows for (e.g. 12%%: how much the mean "
        "step time of same-settings runs varies beyond their step noise; measure it with "
        "benchmarks/compare_noise.py); default 0: step noise only",
    )
    parser.add_argument("--min-change", metavar="PCT", help="smallest change called one (3%%)")
    parser.add_argument(
        "--samples-per-step",
        type=float,
        metavar="N",
        help="samples (or tokens) per step and rank, for the throughput KPI",
    )
    parser.add_argument(
        "--sample-unit", default="samples", metavar="WORD", help="what a sample is (samples)"
    )
    parser.add_argument(
        "--flops-per-step", type=float, metavar="N", help="FLOPs per step and rank (FLOP/s, MFU)"
    )
    parser.add_argument(
        "--device-name", metavar="NAME", help="accelerator name for its peak FLOP/s (H100 SXM)"
    )
    parser.add_argument(
        "--top-ops", type=int, default=8, metavar="N", help="ops shown per direction (8)"
    )


# -- configuration ---------------------------------------------------------------------------


_D = TypeVar("_D", float, None)


def _fraction(value: Any, what: str) -> float:
    from rankscope.analysis.conclude.compare import parse_fraction

    try:
        return parse_fraction(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what}: expected a percentage like 5% or 5, got {value!r}") from None


def _setting(flag: Any, doc: dict[str, Any], key: str, where: str, default: _D) -> float | _D:
    """A percentage setting: the flag (``--key-with-dashes``) over the config file's ``key`` over
    ``default``; one-line errors naming where the bad value came from."""
    if flag is not None:
        return _fraction(flag, f"--{key.replace('_', '-')}")
    if key in doc:
        return _fraction(doc[key], f"{where}: {key}")
    return default


def load_config(path: Path | None) -> dict[str, Any]:
    """The ``--config`` TOML file as a dict (empty without one); one-line errors."""
    import tomllib

    from rankscope.analysis.conclude.kpis import Kpi

    if path is None:
        return {}
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise InputFileError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputFileError(f"{path}: not valid TOML ({exc})") from None
    known = {"fail_above", "alpha", "gate_alpha", "run_noise", "min_change", "thresholds"}
    extra = sorted(set(doc) - known)
    if extra:
        raise InputFileError(f"{path}: unknown key(s) {', '.join(extra)} (known: {sorted(known)})")
    thresholds = doc.get("thresholds", {})
    if not isinstance(thresholds, dict):
        raise InputFileError(f'{path}: [thresholds] must be a table of KPI = "PCT"')
    names = {str(k) for k in Kpi}
    bad = sorted(set(thresholds) - names)
    if bad:
        raise InputFileError(
            f"{path}: unknown KPI(s) in [thresholds]: {', '.join(bad)} (known: "
            f"{', '.join(sorted(names))})"
        )
    return doc


def configs(args: argparse.Namespace) -> tuple[Any, GateConfig, Any]:
    """(CompareConfig, GateConfig, KpiConfig) from the flags over the config file."""
    from rankscope.analysis.conclude.compare import CompareConfig, GateConfig
    from rankscope.analysis.conclude.kpis import KpiConfig

    doc = load_config(args.config)
    where = str(args.config)
    alpha = args.alpha if args.alpha is not None else doc.get("alpha", 0.05)
    if not isinstance(alpha, int | float) or not 0 < float(alpha) < 1:
        raise UsageError(f"alpha must be between 0 and 1, got {alpha!r}")
    gate_alpha = args.gate_alpha if args.gate_alpha is not None else doc.get("gate_alpha")
    if gate_alpha is None:
        gate_alpha = GateConfig.alpha
    if not isinstance(gate_alpha, int | float) or not 0 < float(gate_alpha) < 1:
        raise UsageError(f"gate_alpha must be between 0 and 1, got {gate_alpha!r}")
    noise = _setting(args.run_noise, doc, "run_noise", where, 0.0)
    min_change = _setting(args.min_change, doc, "min_change", where, CompareConfig.min_change)
    fail_above = _setting(args.fail_above, doc, "fail_above", where, None)
    thresholds = {
        k: _fraction(v, f"{where}: thresholds.{k}") for k, v in doc.get("thresholds", {}).items()
    }
    if args.top_ops < 0:
        raise UsageError(f"--top-ops must be >= 0, got {args.top_ops}")
    if args.samples_per_step is not None and args.samples_per_step <= 0:
        raise UsageError(f"--samples-per-step must be > 0, got {args.samples_per_step}")
    return (
        CompareConfig(alpha=float(alpha), min_change=min_change, top_ops=args.top_ops),
        GateConfig(
            fail_above=fail_above,
            thresholds=thresholds,
            alpha=float(gate_alpha),
            run_noise=noise,
        ),
        KpiConfig(
            samples_per_step=args.samples_per_step,
            sample_unit=args.sample_unit,
            flops_per_step=args.flops_per_step,
            device_name=args.device_name,
        ),
    )


# -- the command -----------------------------------------------------------------------------


def _analysis(path: Path) -> Any:
    from rankscope.analysis.engine.driver import ClusterSpec, analyze
    from rankscope.orchestrator.workflow import resolve_store

    store = resolve_store(path)
    return analyze(store, ClusterSpec(main_is_guarded=True))


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rankscope compare``: 0, or EXIT_REGRESSION when the gate fails."""
    from rankscope.analysis.conclude.compare import compare, gate_checks
    from rankscope.analysis.conclude.kpis import kpis
    from rankscope.launchers import rundir
    from rich.console import Console

    compare_config, gate_config, kpi_config = configs(args)
    gated = gate_config.fail_above is not None or bool(gate_config.thresholds)
    if (args.base_runs or args.new_runs) and not gated:
        raise UsageError("--base-runs / --new-runs are for the gate: give --fail-above or --config")
    base, new = _analysis(args.base), _analysis(args.new)
    c = compare(base, new, compare_config, kpi_config)
    more_base = [kpis(_analysis(r), kpi_config) for r in args.base_runs]
    more_new = [kpis(_analysis(r), kpi_config) for r in args.new_runs]
    checks = gate_checks(c, gate_config, more_base, more_new) if gated else None
    console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
    print_comparison(c, console, checks)
    outputs = [
        (args.json, lambda: json.dumps(to_json(c, checks, gate_config), indent=1) + "\n"),
        (args.html, lambda: render_html(c, checks)),
        (args.markdown, lambda: render_markdown(c, checks)),
    ]
    for path, render in outputs:
        if path is not None:
            rundir.write_bytes_atomic(path, render().encode())
            console.print(f"wrote {path}", highlight=False)
    return EXIT_REGRESSION if any(ch.failed for ch in checks or []) else 0
