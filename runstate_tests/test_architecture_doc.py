"""docs/ARCHITECTURE.md describes the code as it is: every name it cites in backticks exists.

- a dotted `runstate.…` name imports (its module, then its attributes);
- a path (`runstate/…`, `runstate_tests/…`, `sql/…`) is a file or folder of the checkout;
- a CamelCase name, or a name written as a call (`fetch()`, `submit(database, …)`), is defined in
  runstate/ or runstate_tests/ (a class, a function, a method or an assignment), or is Dagster's
  (`AutomationCondition.eager()`);
- a Dagster name beside them (a job, sensor, schedule, asset or check) is in the code location.
"""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
# Backticked text that names no Python object: Iceberg table properties, a package built from sql/.
NOT_PYTHON = {"runstate.maintenance.enabled", "runstate.wal.version", "runstate._sql"}
# Named beside the code: a DynamoDB attribute of the WAL's meta row, a Python builtin, dagster-pyspark's.
NOT_OURS = {"LastAppliedSeq", "ValueError", "LazyPySparkResource"}
DOTTED = re.compile(r"^(runstate(?:\.\w+)+)")
PATH = re.compile(r"^(?:runstate|runstate_tests|sql|docs|bench)/[\w/.<>-]*$")
CAMEL = re.compile(r"^([A-Z][a-z0-9]+[A-Z]\w*)(?:\(.*)?$")
CALL = re.compile(r"^(\w+)\(")


def cited() -> list[str]:
    return sorted(set(re.findall(r"`([^`\n]+)`", DOC.read_text(encoding="utf-8"))))


@cache
def defined_names() -> frozenset[str]:
    """Every class, function, method and assigned name in runstate/ and runstate_tests/."""
    names: set[str] = set()
    for folder in ("runstate", "runstate_tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(node.name)
                elif isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
    import dagster as dg

    names.update(name for name in dir(dg) if not name.startswith("_"))
    names.update(name for name in dir(dg.AutomationCondition) if not name.startswith("_"))
    return frozenset(names)


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_every_dotted_runstate_name_in_the_architecture_doc_imports():
    dotted = {m.group(1) for text in cited() if (m := DOTTED.match(text))} - NOT_PYTHON
    assert len(dotted) > 10  # the doc cites modules; an empty match means the pattern broke
    assert sorted(name for name in dotted if not resolves(name)) == []


def test_every_path_in_the_architecture_doc_exists():
    paths = [text for text in cited() if PATH.match(text) and "<" not in text]
    assert len(paths) > 5
    assert [path for path in paths if not (ROOT / path.rstrip("/")).exists()] == []


def test_every_class_and_call_in_the_architecture_doc_is_defined():
    names = {m.group(1) for text in cited() for m in (CAMEL.match(text), CALL.match(text)) if m}
    assert len(names) > 10
    assert sorted(names - defined_names() - NOT_OURS) == []


@pytest.mark.parametrize("kind", ["job", "sensor", "schedule", "asset"])
def test_the_dagster_names_in_the_architecture_doc_are_in_the_code_location(kind: str):
    from runstate.definitions import defs

    repository = defs.get_repository_def()
    known = {
        "job": {job.name for job in repository.get_all_jobs()},
        "sensor": {sensor.name for sensor in repository.sensor_defs},
        "schedule": {schedule.name for schedule in repository.schedule_defs},
        "asset": {key.path[-1] for key in repository.asset_graph.get_all_asset_keys()},
    }[kind]
    suffix = {"job": "_job", "sensor": "_sensor", "schedule": "_schedule", "asset": ""}[kind]
    if kind == "asset":  # an asset is cited by name alone: check the names the doc calls assets
        words = set(re.findall(r"`(\w+)` (?:asset|assets)\b", DOC.read_text(encoding="utf-8")))
    else:
        words = {text for text in cited() if re.fullmatch(r"\w+" + suffix, text)}
    assert sorted(words - known - defined_names()) == [], f"{kind}s cited but not defined"
