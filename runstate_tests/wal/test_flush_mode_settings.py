"""RUNSTATE_WAL_FLUSH_MODE and RUNSTATE_WAL_FLUSH_RUN_BUDGET_S: read once into the WAL resource, a bad value
refused in one line, and an always-on run that could outlive the stale-run bound refused."""

from __future__ import annotations

import pytest

from runstate.config import ConfigError, Settings
from runstate.defs.resources import wal_resource


def test_the_mode_and_the_budget_reach_the_wal_resource():
    settings = Settings.from_env(
        {"RUNSTATE_WAL_FLUSH_MODE": "always-on", "RUNSTATE_WAL_FLUSH_RUN_BUDGET_S": "90"}
    )

    resource = wal_resource(settings)

    assert resource.flush_always_on and resource.flush_run_budget_s == 90
    assert not wal_resource(Settings.from_env({"RUNSTATE_WAL_FLUSH_MODE": "on-demand"})).flush_always_on


@pytest.mark.parametrize(
    "name, raw",
    [
        ("RUNSTATE_WAL_FLUSH_MODE", "always"),
        ("RUNSTATE_WAL_FLUSH_MODE", "ALWAYS-ON"),
        ("RUNSTATE_WAL_FLUSH_RUN_BUDGET_S", "5"),
        ("RUNSTATE_WAL_FLUSH_RUN_BUDGET_S", "nan"),
        ("RUNSTATE_WAL_FLUSH_RUN_BUDGET_S", "soon"),
    ],
)
def test_a_bad_value_is_refused_in_one_line(name, raw):
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({name: raw})

    assert name in str(refused.value) and "\n" not in str(refused.value)


def test_a_budget_past_the_stale_run_bound_is_refused_when_always_on():
    settings = Settings.from_env(
        {"RUNSTATE_WAL_FLUSH_MODE": "always-on", "RUNSTATE_WAL_FLUSH_RUN_BUDGET_S": "400"}
    )

    with pytest.raises(ValueError, match="must be under half of stale_run_seconds"):
        wal_resource(settings)
