"""`make docs` builds: mkdocs with mkdocstrings, strict, with an API reference of the public API (issue 53).

A broken link or cross-reference fails the strict build; the API pages document every name each core
package exports.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).parent / "mkdocs"
PUBLIC_PACKAGES = ("eventstore", "wal", "maintenance")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,
    )


def _config_over(docs: Path, tmp_path: Path) -> Path:
    """The project's mkdocs.yml over another copy of docs/ (the code documented is still the checkout's)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT)]
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_docs_site_builds_strictly_with_every_public_name(tmp_path: Path):
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")

    assert done.returncode == 0, done.stderr[-4000:]
    for package in PUBLIC_PACKAGES:
        page = (tmp_path / "site" / "api" / package / "index.html").read_text()
        exported = importlib.import_module(f"runstate.{package}").__all__
        missing = [name for name in exported if f'id="runstate.{package}.{name}"' not in page]
        assert missing == [], f"runstate.{package}: not in the API reference"


def test_a_broken_reference_fails_the_build(tmp_path: Path):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    index = docs / "index.md"
    broken = {
        "[the store][runstate.eventstore.NoSuchStore]": "runstate.eventstore.NoSuchStore",  # no such object
        "[operations](NO_SUCH_PAGE.md)": "NO_SUCH_PAGE.md",  # no such page
    }
    index.write_text(index.read_text() + "".join(f"\nSee {link}.\n" for link in broken))

    done = _build(_config_over(docs, tmp_path), tmp_path / "site")

    assert done.returncode != 0, done.stderr[-4000:]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 2 and all(any(name in w for w in warnings) for name in broken.values()), warnings
