"""The whole code location loads, with every asset, check, job, sensor and schedule the issues name."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runstate.definitions import defs

ROOT = Path(__file__).resolve().parent.parent

ASSETS = {"run_snapshots", "dataset_snapshots", "table_health", "table_inventory"}
JOBS = {"append_events", "flush_wal", "iceberg_maintenance", "submit_maintenance"}
SENSORS = {"wal_sensor", "maintenance_queue_sensor", "run_recorder"}
SCHEDULES = {"maintenance_orchestrator"}
CHECKS = {"table_is_healthy"}


def test_definitions_resolve_with_every_named_definition():
    repo = defs.get_repository_def()
    asset_names = {key.to_user_string() for key in repo.asset_graph.get_all_asset_keys()}
    assert ASSETS <= asset_names
    assert JOBS <= {job.name for job in repo.get_all_jobs()}
    assert SENSORS <= {sensor.name for sensor in repo.sensor_defs}
    assert SCHEDULES <= {schedule.name for schedule in repo.schedule_defs}
    check_names = {key.name for key in repo.asset_graph.asset_check_keys}
    assert CHECKS <= check_names


def test_no_two_schedules_start_in_the_same_minute():
    """Each run is a process that loads the code location: schedules that fire together pile up."""
    schedules = defs.get_repository_def().schedule_defs
    starts = {schedule.name: _day_starts(schedule.cron_schedule) for schedule in schedules}

    clashes = [
        (a, b, sorted(starts[a] & starts[b])[:3])
        for a in starts
        for b in starts
        if a < b and starts[a] & starts[b]
    ]

    assert len(starts) >= 9 and clashes == []


def _day_starts(cron: str) -> set[tuple[int, int]]:
    """The (hour, minute) pairs of a day on which a cron of plain minute and hour fields fires."""
    minute, hour, day, month, weekday = cron.split()
    assert (day, month, weekday) == ("*", "*", "*"), cron
    return {(h, m) for h in _cron_field(hour, 24) for m in _cron_field(minute, 60)}


def _cron_field(text: str, size: int) -> set[int]:
    span, _, step = text.partition("/")
    if span == "*":
        first, last = 0, size - 1
    elif "-" in span:
        first, last = (int(part) for part in span.split("-"))
    else:
        first = last = int(span)
    return set(range(first, last + 1, int(step or 1)))


def test_core_packages_never_import_dagster():
    code = (
        "import sys, runstate.eventstore, runstate.wal, runstate.maintenance; "
        "sys.exit(1 if any(m == 'dagster' or m.startswith('dagster.') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_dagster_definitions_validate_passes(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}  # an empty home: validation needs no storage
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_job_has_a_description_for_the_launchpad():
    for job in defs.get_repository_def().get_all_jobs():
        if not job.name.startswith("__"):
            assert job.description, f"job {job.name} has no description"


CORE_DOMAINS = ("eventstore", "wal", "maintenance")
HEAVY_MODULES = ("snowflake.connector", "pyarrow")


def _imported_modules(path: Path, package: str) -> set[str]:
    """Every module a file imports, relative ones resolved against its package, at any depth (lazy too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.add(node.module)
    return found


@pytest.mark.parametrize("domain", CORE_DOMAINS)
def test_a_core_domain_imports_neither_dagster_nor_another_domain(domain):
    others = [f"runstate.{other}" for other in CORE_DOMAINS if other != domain]
    offending = {}
    for path in sorted((ROOT / "runstate" / domain).rglob("*.py")):
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
        bad = {
            name
            for name in _imported_modules(path, package)
            if name.split(".")[0] == "dagster"
            or name.startswith("dagster_")
            or any(name == other or name.startswith(other + ".") for other in others)
        }
        if bad:
            offending[str(path.relative_to(ROOT))] = sorted(bad)

    assert offending == {}


def test_the_import_scan_sees_lazy_and_relative_imports(tmp_path):
    """The test above could not fail if the scan missed imports inside functions or relative ones."""
    source = tmp_path / "module.py"
    source.write_text(
        "def f():\n    import dagster\n    from ..wal import flush\n    from . import sibling\n"
    )

    assert _imported_modules(source, "runstate.eventstore") == {
        "dagster",
        "runstate.wal",
        "runstate.eventstore",
    }


def test_loading_the_code_location_imports_no_snowflake_connector_or_arrow_and_starts_no_jvm():
    # dagster-pyspark's resource imports pyspark's Python package (~0.13 s); the JVM starts on first use.
    code = (
        "import sys, runstate.definitions; from pyspark import SparkContext; "
        f"print(','.join(m for m in {HEAVY_MODULES!r} if m in sys.modules), SparkContext._gateway)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["None"]


def _import_time_edges(path: Path, package: str, modules: set[str]) -> set[str]:
    """The modules of `modules` that `path` imports when it is imported: its module-level imports
    (`from pkg import sub` imports `pkg.sub`; a package's own `__init__` runs first anyway, so it counts
    only when a name is taken from it). TYPE_CHECKING blocks and imports inside functions are left out."""
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, node.module] if node.module else parts)
                for alias in node.names:  # a submodule, or a name the module (or package) defines
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody)

    visit(ast.parse(path.read_text(), filename=str(path)).body)
    return found & modules


@pytest.mark.parametrize("domain", CORE_DOMAINS)
def test_a_core_domain_has_no_import_cycle(domain):
    """A cycle works only in one import order and breaks the day a module moves; none inside a domain."""
    files = {}
    for path in sorted((ROOT / "runstate" / domain).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = (path, name if parts[-1] == "__init__" else ".".join(parts[:-1]))
    edges = {
        name: _import_time_edges(path, package, set(files)) - {name}
        for name, (path, package) in files.items()
    }
    cycles = []

    def walk(name: str, trail: list[str]) -> None:
        for nxt in sorted(edges[name]):
            if nxt in trail:
                cycles.append(trail[trail.index(nxt) :] + [nxt])
            elif nxt not in done:
                walk(nxt, [*trail, nxt])
        done.add(name)

    done: set[str] = set()
    for name in sorted(edges):
        if name not in done:
            walk(name, [name])

    assert cycles == []
