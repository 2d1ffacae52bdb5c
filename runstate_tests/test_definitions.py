"""The whole code location loads, with every asset, check, job, sensor and schedule the issues name."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from runstate.config import Settings
from runstate.definitions import defs
from runstate.defs.maintenance.assets import INVENTORY_CRON
from runstate.defs.tags import SPARK_POOL
from runstate.defs.wal.checks import WAL_LAG_CRON

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
    """Each run is a process that loads the code location: schedules that fire together pile up (the
    AutomationConditions on a cron count as schedules here)."""
    schedules = defs.get_repository_def().schedule_defs
    starts = {schedule.name: _day_starts(schedule.cron_schedule) for schedule in schedules}
    starts.update(table_inventory=_day_starts(INVENTORY_CRON), wal_lag=_day_starts(WAL_LAG_CRON))

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


def _checkout_command(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    bin_dir = Path(sys.executable).parent
    # An empty home: loading needs no storage. VIRTUAL_ENV: dg warns when it differs from the project's.
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "VIRTUAL_ENV": str(bin_dir.parent)}
    result = subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_dg_check_defs_and_dagster_definitions_validate_pass_in_the_checkout(tmp_path):
    checked = _checkout_command(tmp_path, "dg", "check", "defs")
    validated = _checkout_command(tmp_path, "dagster", "definitions", "validate", "-w", "workspace.yaml")

    assert "All definitions loaded successfully" in checked.stdout + checked.stderr
    assert "All code locations passed validation" in validated.stdout + validated.stderr


def test_dg_list_defs_lists_the_code_location(tmp_path):
    listed = json.loads(_checkout_command(tmp_path, "dg", "list", "defs", "--json").stdout)

    assert ASSETS <= {asset["asset_key"] for asset in listed["assets"]}
    assert {"spark_pool_sensor", "runstate_instance_check", "runstate_automation"} <= {
        sensor["name"] for sensor in listed["sensors"]
    }


def _spark_steps() -> dict[str, dg.OpDefinition]:
    """Every op (asset ops included) of the code location that takes the `spark` resource."""
    return {
        op.name: op
        for job in defs.get_repository_def().get_all_jobs()
        for op in job.graph.iterate_op_defs()
        if "spark" in op.required_resource_keys
    }


def test_every_step_that_takes_spark_is_in_the_spark_pool_and_ends_its_jvm():
    steps = _spark_steps()

    assert {"merge_datasets", "dataset_tables", "table_inventory", "table_health"} <= set(steps)
    assert {"run_maintenance_worker", "run_orchestrator", "sync_table_health"} <= set(steps)
    assert {name: op.pool for name, op in steps.items()} == dict.fromkeys(steps, SPARK_POOL)
    ends = {
        name: getattr(op.compute_fn.decorated_fn, "ends_spark_session", False) for name, op in steps.items()
    }
    assert ends == dict.fromkeys(steps, True)


def test_the_assets_people_watch_have_freshness_policies_and_the_tables_follow_the_merge_interval():
    from runstate.defs import dataset_tables

    graph = defs.get_repository_def().asset_graph
    policies = {
        name: graph.get(dg.AssetKey(name)).freshness_policy
        for name in (
            "dataset_tables",
            "dataset_snapshots",
            "run_snapshots",
            "table_health",
            "table_inventory",
        )
    }
    slow = dataset_tables.build_defs(Settings.from_env({"RUNSTATE_DATASET_MERGE_INTERVAL_S": "300"}))
    [slow_tables] = slow.assets
    slow_policy = next(iter(slow_tables.specs)).freshness_policy

    assert all(policies.values()), policies
    assert policies["dataset_tables"].fail_window.to_timedelta().total_seconds() == 600  # 10 x 60 s
    assert slow_policy.fail_window.to_timedelta().total_seconds() == 3000
    assert slow_policy.warn_window.to_timedelta().total_seconds() == 900


def test_the_cron_rules_are_automation_conditions_that_a_running_sensor_evaluates():
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    sensor = repo.get_sensor_def("runstate_automation")
    wal_lag = next(key for key in graph.asset_check_keys if key.name == "wal_lag")

    assert graph.get(dg.AssetKey("table_inventory")).automation_condition is not None
    assert graph.get(wal_lag).automation_condition is not None
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert not {"table_inventory_sync", "wal_lag_schedule"} & {s.name for s in repo.schedule_defs}
    assert "default_automation_condition_sensor" not in {s.name for s in repo.sensor_defs}


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


def _imported_names(path: Path, root: Path = ROOT) -> set[str]:
    """`_imported_modules`, plus `module.name` for each `from module import name` (which may be a
    submodule: `from runstate import definitions`)."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found = _imported_modules(path, package)
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _importers(paths: list[Path], forbidden: tuple[str, ...], root: Path = ROOT) -> dict[str, list[str]]:
    """File -> the forbidden modules (or their submodules) it imports, at any depth."""
    offending = {}
    for path in paths:
        bad = {
            name
            for name in _imported_names(path, root)
            if any(name == module or name.startswith(module + ".") for module in forbidden)
        }
        if bad:
            offending[str(path.relative_to(root))] = sorted(bad)
    return offending


def test_the_cli_reaches_the_dagster_shell_only_through_the_commands():
    """Issue 40.2: the CLI parses, prints and exits; what it runs is in runstate.commands."""
    cli = sorted((ROOT / "runstate" / "cli").glob("*.py"))

    assert cli and _importers(cli, ("runstate.defs", "runstate.definitions")) == {}


def test_nothing_in_the_package_imports_the_code_location_entry_point():
    """runstate.definitions is for workspace.yaml and `dagster dev -m`; inside, build_definitions lives
    in runstate.defs.location."""
    package = [
        p for p in sorted((ROOT / "runstate").rglob("*.py")) if p != ROOT / "runstate" / "definitions.py"
    ]

    assert _importers(package, ("runstate.definitions",)) == {}


def test_the_dagster_shell_imports_neither_the_commands_nor_the_cli():
    """The commands sit between the CLI and the shell: runstate.defs never points back up."""
    shell = sorted((ROOT / "runstate" / "defs").rglob("*.py"))

    assert _importers(shell, ("runstate.commands", "runstate.cli")) == {}


def test_the_layer_scan_sees_a_submodule_imported_by_name_inside_a_function(tmp_path):
    source = tmp_path / "runstate" / "cli" / "module.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "def f():\n    from runstate import definitions\n    from runstate.defs.tags import X\n"
    )

    offending = _importers([source], ("runstate.defs", "runstate.definitions"), root=tmp_path)

    assert offending == {
        "runstate/cli/module.py": ["runstate.definitions", "runstate.defs.tags", "runstate.defs.tags.X"]
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
