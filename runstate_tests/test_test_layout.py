"""The suite's layout: test modules and benches share helpers through runstate_tests.support only.

A test module or a conftest imported by another module runs a second time under another name (its
module-level setup, its fixtures registered twice), and ties the importer to another folder's fixtures
file. Fixtures stay in conftest.py files; what they and the tests share is in runstate_tests/support.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "runstate_tests"
BENCH = ROOT / "bench"


def imported_modules(where: Path, source: str) -> list[tuple[int, list[str]]]:
    """(line, dotted name as parts) of every module the file at `where` (relative to the checkout)
    imports, `from X import Y` giving X.Y too (Y may be a module), relative imports resolved against
    the file's package."""
    package = list(where.parent.parts)
    found = []
    for node in ast.walk(ast.parse(source, str(where))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            found.append((node.lineno, module))
            found += [(node.lineno, [*module, alias.name]) for alias in node.names]
    return found


def is_test_module_or_conftest(name: list[str]) -> bool:
    return name[0] == "runstate_tests" and any(
        part == "conftest" or part.startswith("test_") for part in name
    )


def layout_errors(where: Path, source: str) -> list[str]:
    """What is wrong with the imports of `source`, the file at `where` (relative to the checkout): one
    error per import statement at most."""
    errors = {}
    in_bench = where.parent == Path("bench")
    for line, name in imported_modules(where, source):
        at = f"{where}:{line} imports {'.'.join(name)}"
        if is_test_module_or_conftest(name):
            errors.setdefault(
                line, f"{at}: a test module or conftest (move what it shares to runstate_tests/support)"
            )
        elif in_bench and name[0] == "runstate_tests" and name[1:2] != ["support"]:
            errors.setdefault(line, f"{at}: bench/ imports only runstate and runstate_tests.support")
    return list(errors.values())


def checked_files() -> list[Path]:
    return sorted(TESTS.rglob("*.py")) + sorted(BENCH.glob("*.py"))


def test_no_module_imports_a_test_module_or_a_conftest_and_bench_imports_only_support() -> None:
    files = checked_files()
    assert any(path.parent == BENCH for path in files) and len(files) > 100
    errors = [error for path in files for error in layout_errors(path.relative_to(ROOT), path.read_text())]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        (
            "runstate_tests/cli/x.py",
            "from runstate_tests.conftest import unique",
            "a test module or conftest",
        ),
        (
            "runstate_tests/cli/x.py",
            "from runstate_tests.wal import conftest as w",
            "a test module or conftest",
        ),
        ("runstate_tests/wal/x.py", "from .conftest import WalEnv", "a test module or conftest"),
        ("runstate_tests/wal/x.py", "from . import conftest", "a test module or conftest"),
        (
            "runstate_tests/cli/x.py",
            "import runstate_tests.maintenance.test_actions",
            "a test module or conftest",
        ),
        ("runstate_tests/cli/x.py", "from runstate_tests.maintenance.test_actions import f", "a test module"),
        ("bench/x.py", "from runstate_tests.wal.shell import WalWorld", "bench/ imports only"),
        ("bench/x.py", "import runstate_tests", "bench/ imports only"),
        ("bench/x.py", "from runstate_tests.support.devserver import poll", None),
        ("runstate_tests/cli/x.py", "from runstate_tests.support import lake", None),
        ("runstate_tests/wal/x.py", "from .faults import Faults", None),
        ("runstate_tests/cli/x.py", "from runstate.cli import main", None),
    ],
)
def test_the_check_tells_each_kind_of_import(where: str, source: str, expected: str | None) -> None:
    """The check itself, on one line of source at a given place (the tree has none of the wrong kinds left)."""
    errors = layout_errors(Path(where), source)
    if expected is None:
        assert errors == []
    else:
        assert len(errors) == 1 and expected in errors[0], errors
