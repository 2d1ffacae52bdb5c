"""The wheel works on its own: built from the package, installed into a fresh virtualenv that cannot see
the checkout, it migrates a scratch database and answers `--help` from another directory.

The fresh environment borrows the project's installed dependencies through a `.pth` line (so nothing is
downloaded), but not the project itself: the project's editable install is a finder that only a
`.pth` file in a site directory starts, and the borrowed folder is not a site directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from runstate import migrations

ROOT = Path(__file__).resolve().parent.parent
# One worker builds the wheel once for both tests.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "runstate", "sql")


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{args}: {result.stdout[-2000:]}{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding only the wheel; returns its bin folder."""
    base = tmp_path_factory.mktemp("wheel")
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    source = base / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    wheels = base / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(source)])
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    site = Path(
        _run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    (site / "project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    [wheel] = wheels.glob("runstate-*.whl")
    _run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", str(wheel)])
    return venv / "bin"


def _elsewhere(tmp_path: Path, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SNOWFLAKE_", "RUNSTATE_", "PYTHON"))}
    return {**clean, "RUNSTATE_HOME": str(tmp_path), **env}


def test_the_installed_package_is_the_wheel_not_the_checkout(installed, tmp_path):
    where = _run(
        [
            str(installed / "python"),
            "-c",
            "import runstate, runstate._sql as s, runstate.spark as k; "
            "print(runstate.__file__, s.__file__, k.LOG_CONFIG.is_file())",
        ],
        cwd=tmp_path,
        env=_elsewhere(tmp_path),
    ).stdout

    assert str(ROOT) not in where and "site-packages" in where
    assert where.split()[-1] == "True"  # the Spark driver's log configuration ships in the wheel


def test_the_wheel_answers_help_and_migrates_a_scratch_database_from_another_directory(
    installed, tmp_path, fresh_database
):
    env = _elsewhere(tmp_path, RUNSTATE_PG_URL=fresh_database, RUNSTATE_SCHEMA="from_wheel")
    runstate = str(installed / "runstate")

    help_text = _run([runstate, "--help"], cwd=tmp_path, env=env).stdout
    upgrade = _run([runstate, "db", "upgrade", "--skip-aws"], cwd=tmp_path, env=env).stdout
    status = _run([runstate, "db", "status"], cwd=tmp_path, env=env).stdout

    assert "db" in help_text and "events" in help_text
    files = {d: len(migrations.discover("postgres", d)) for d in ("eventstore", "maintenance")}
    assert f"postgres from_wheel eventstore: applied {files['eventstore']} migration(s)" in upgrade
    assert f"postgres from_wheel maintenance: applied {files['maintenance']} migration(s)" in upgrade
    assert "PENDING" not in status and status.count("applied") == sum(files.values())
