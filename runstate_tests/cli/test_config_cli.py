"""The knobs and the global options at the command line: a bad knob is one `Error:` line (exit 1) for every
verb, never a traceback (issue 25.11); --log-level and --log-format follow the verb too (issue 25.15)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from runstate.cli import main
from runstate.config import settings
from runstate_tests.support.cli import leaf_verbs

RUNSTATE = str(Path(sys.executable).parent / "runstate")
KNOBS = [
    "RUNSTATE_WAL_FLUSH_SHARDS",
    "RUNSTATE_WAL_FLUSH_LINGER_S",
    "RUNSTATE_MAINTENANCE_WORKERS",
    "RUNSTATE_APPLY_DELETES_AT",
    "RUNSTATE_COPY_ON_WRITE_MAX_MB",
    "RUNSTATE_DATASET_MERGE_INTERVAL_S",
    "RUNSTATE_EVENTSTORE",
    "RUNSTATE_ICEBERG_CATALOG",
    "RUNSTATE_SPARK_MASTER",
    "RUNSTATE_SPARK_DRIVER_HOST",
    "RUNSTATE_SPARK_CONF",
    "RUNSTATE_AWS_ENDPOINT_URL",
    "RUNSTATE_RUN_DEAD_AFTER_S",
]


@pytest.fixture(autouse=True)
def fresh_settings() -> Iterator[None]:
    settings.cache_clear()
    yield
    settings.cache_clear()
    logging.getLogger("runstate").setLevel(logging.WARNING)


def _invoke(args: list[str], home: Path, **env: str):
    return CliRunner().invoke(main, args, env={"RUNSTATE_HOME": str(home), **env})


def _the_one_error_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), output
    return lines[0]


@pytest.mark.parametrize("verb", [path for path, _ in leaf_verbs(main)], ids=" ".join)
def test_every_verb_refuses_a_bad_knob_before_it_starts(verb, tmp_path):
    # The knobs are checked before the verb parses its own arguments; --help keeps the verb from ever
    # starting here (`dev` or `demo` would start services) should that order ever change.
    result = _invoke([*verb, "--help"], tmp_path, RUNSTATE_WAL_FLUSH_SHARDS="99999999999999999999")

    assert result.exit_code == 1, result.output
    assert "RUNSTATE_WAL_FLUSH_SHARDS must be a whole number from 1 to" in _the_one_error_line(result.output)


@pytest.mark.parametrize(
    "verb, knob, raw",
    [
        (["wal", "status"], "RUNSTATE_WAL_FLUSH_SHARDS", "0"),
        (["wal", "tick"], "RUNSTATE_WAL_FLUSH_LINGER_S", "nan"),
        (["maintenance", "status"], "RUNSTATE_MAINTENANCE_WORKERS", "-1"),
        (["maintenance", "tick"], "RUNSTATE_MAINTENANCE_WORKERS", "abc"),
        (["events", "show", "r1"], "RUNSTATE_SPARK_CONF", '{"spark.executor.memory": null}'),
        (["wal", "status"], "RUNSTATE_AWS_ENDPOINT_URL", "nope"),
        (["wal", "status"], "RUNSTATE_RUN_DEAD_AFTER_S", "1"),
        (["wal", "flush"], "RUNSTATE_RUN_DEAD_AFTER_S", "abc"),  # issue 42.4: it printed a traceback
    ],
)
def test_a_bad_knob_is_one_line_from_the_installed_command(verb, knob, raw, tmp_path):
    # Nothing to reach: a verb that ignored the knob would fail on its first connection instead.
    nowhere = "postgresql://postgres@127.0.0.1:1/nowhere"
    env = {**os.environ, "RUNSTATE_HOME": str(tmp_path), "RUNSTATE_PG_URL": nowhere}
    env.update({"RUNSTATE_AWS_ENDPOINT_URL": "http://127.0.0.1:1", knob: raw})

    result = subprocess.run([RUNSTATE, *verb], env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 1
    assert knob in _the_one_error_line(result.stderr)
    assert result.stdout == ""


@given(knob=st.sampled_from(KNOBS), raw=st.text(max_size=24).filter(lambda raw: "\0" not in raw))
def test_any_value_of_a_knob_is_taken_or_refused_in_one_line(knob, raw):
    home = Path(os.environ.get("TMPDIR", "/tmp")) / "runstate-knobs-nowhere"  # no .env, no services there
    settings.cache_clear()

    result = _invoke(["services", "status"], home, **{knob: raw})

    assert result.exit_code == 1 and not isinstance(result.exception, Exception), result.exception
    line = result.output.strip()
    assert line == "no services recorded: run `runstate services up`" or (
        knob in _the_one_error_line(line)
    ), line


def test_log_level_after_the_verb_is_the_global_option(tmp_path):
    result = _invoke(["services", "status", "--log-level", "DEBUG", "--log-format", "json"], tmp_path)

    assert result.output.strip() == "no services recorded: run `runstate services up`"
    logger = logging.getLogger("runstate")
    assert logger.level == logging.DEBUG
    assert type(logger.handlers[0].formatter).__name__ == "JsonFormatter"


def test_log_level_after_a_verb_with_arguments(pg_database, pg_schema, tmp_path):
    env = {"RUNSTATE_PG_URL": pg_database, "RUNSTATE_SCHEMA": pg_schema, "RUNSTATE_EVENTSTORE": "postgres"}

    result = _invoke(["events", "show", "no-such-run", "--log-level", "DEBUG"], tmp_path, **env)

    assert "No such option" not in result.output
    assert logging.getLogger("runstate").level == logging.DEBUG


def test_a_bad_log_level_after_the_verb_is_a_usage_error(tmp_path):
    result = _invoke(["services", "status", "--log-level", "LOUD"], tmp_path)

    assert result.exit_code == 2
    assert "Invalid value for '--log-level'" in result.output
