"""docs/OPERATIONS.md's CLI list and configuration table, and the docs' sensor interval, hold for the code
(issue 25.15; they moved there from the README in issue 53)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runstate.cli import main
from runstate_tests.support.cli import leaf_verbs

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = (ROOT / "docs" / "OPERATIONS.md").read_text()
DOCS = "\n".join(
    (ROOT / name).read_text() for name in ("README.md", "docs/OPERATIONS.md", "docs/ARCHITECTURE.md")
)


def _section(title: str) -> str:
    return OPERATIONS.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _cli_block() -> str:
    return _section("The CLI").split("```", 2)[1]


@pytest.mark.parametrize("verb", [path for path, _ in leaf_verbs(main)], ids=" ".join)
def test_the_cli_list_names_every_verb(verb):
    *groups, name = verb
    if verb == ("health", "show"):
        name = "DB.TABLE"  # `runstate health DB.TABLE` is how show is called
    lines = [line for line in _cli_block().splitlines() if line.startswith(" ".join(["runstate", *groups]))]

    assert any(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", line.split("  ")[0]) for line in lines), (
        f"`runstate {' '.join(verb)}` is missing from the CLI list of docs/OPERATIONS.md"
    )


def test_every_configuration_variable_in_the_table_is_read_by_runstate():
    source = "\n".join(path.read_text() for path in (ROOT / "runstate").rglob("*.py"))
    table = _section("Configuration reference")
    names = re.findall(r"^\| `([A-Z_]+)`", table, re.M)
    assert len(names) > 20
    for name in names:
        assert f'"{name}"' in source, f"{name} is in the configuration table but read nowhere"


def test_the_wal_sensor_interval_the_docs_give_is_the_sensors():
    from runstate.defs.wal.sensors import SENSOR_INTERVAL_S

    patterns = [
        r"sensor picks up new rows every (\d+) s",
        r"Every (\d+) s `wal_sensor`",
        r"wal_sensor \((\d+) s\)",
        r"the `wal_sensor` does it every\s+(\d+) s",
    ]
    said = {found for pattern in patterns for found in re.findall(pattern, DOCS)}
    said |= set(re.findall(r"wal_sensor's (\d+) s timer", (ROOT / "dagster.yaml").read_text()))

    assert said == {str(SENSOR_INTERVAL_S)}


def test_the_log_options_really_follow_any_verb():
    assert "before or after the verb" in _section("The CLI")
    for verb, command in leaf_verbs(main):
        options = {opt for param in command.params for opt in getattr(param, "opts", [])}
        assert {"--log-level", "--log-format"} <= options, verb
