"""Adding a Slurm option touches one dataclass field (issue 10): the ``rankscope run`` flag, the
config-file key, the ``RANKSCOPE_SLURM_*`` default and the sbatch parameter are generated from
``SlurmOptions``' fields. No Slurm needed: these are the generated pieces themselves."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from rankscope.launchers.slurm import options as slurm


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    slurm.add_slurm_arguments(parser)
    return parser


def test_every_field_has_its_flag_and_config_key() -> None:
    flags = {a.dest: a for a in _parser()._actions}
    for f in dataclasses.fields(slurm.SlurmOptions):
        dest = next(d for d, n in slurm._FLAG_FIELDS.items() if n == f.name)
        assert dest in flags, f.name
        assert flags[dest].default is None  # "not given": config and environment fill it
        assert (f.name in slurm.CONFIG_KEYS) == f.metadata["config"]
    assert set(slurm.ENV_DEFAULTS) == {"partition", "time", "account", "qos", "constraint"}
    assert slurm.ENV_DEFAULTS["qos"] == "RANKSCOPE_SLURM_QOS"


def test_values_reach_sbatch_from_the_fields() -> None:
    args = _parser().parse_args(
        ["--slurm", "--qos", "high", "--mem", "64G", "--sbatch-arg=--exclusive", "--time", "5"]
    )
    given = {n: getattr(args, d) for d, n in slurm._FLAG_FIELDS.items() if getattr(args, d)}
    opts = slurm.SlurmOptions.from_dict(given)
    params = opts.executor_parameters(4, "job")
    assert params["qos"] == "high" and params["mem"] == "64G" and params["time"] == 5
    assert params["cpus_per_task"] == 4 and params["additional_parameters"]["exclusive"] is True


def test_an_option_submitit_does_not_know_goes_to_sbatch_by_name() -> None:
    """What a new field such as ``reservation`` gets: submitit has no parameter for it."""

    @dataclasses.dataclass(frozen=True)
    class WithReservation(slurm.SlurmOptions):
        reservation: str | None = slurm.option(None, metavar="NAME", help="reservation")

    params = WithReservation(reservation="r1").executor_parameters(2, "job")
    assert "reservation" not in slurm.submitit_parameters()
    assert params["additional_parameters"]["reservation"] == "r1"
    with pytest.raises(ValueError, match="--reservation must be a non-empty word"):
        WithReservation(reservation=" ")


def test_environment_defaults_are_typed_from_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKSCOPE_SLURM_CONFIG", "")
    env = {"RANKSCOPE_SLURM_TIME": "15", "RANKSCOPE_SLURM_QOS": "low", "HOME": "/nonexistent"}
    assert slurm.load_defaults(env) == {"time": 15, "qos": "low"}
    with pytest.raises(slurm.UsageError, match="whole number of minutes"):
        slurm.load_defaults({**env, "RANKSCOPE_SLURM_TIME": "1h"})
