"""Every code block of the README runs (issue 53).

The blocks run in order, as a reader would run them after `make demo`, against a database, a moto server,
a WAL table and a bucket of the test's own (given through the RUNSTATE_* variables, as `runstate services
up` gives them through `.env`): a python block in a fresh interpreter, a sh block line by line as
commands. A block that cannot run here (`make demo` itself, `runstate dev`) says so in its info string,
```sh no-run```, and the test keeps their number to the few it knows.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
# Blocks whose info string says they do not run here: the set-up itself and the long-running UI.
EXPECTED_NO_RUN = 2
RUNNABLE = {"python", "sh"}

pytestmark = [pytest.mark.timeout(900)]


@dataclass(frozen=True)
class Block:
    language: str
    options: tuple[str, ...]
    code: str
    line: int  # the README line of its opening fence

    @property
    def runs(self) -> bool:
        return "no-run" not in self.options


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, with their info strings."""
    found: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = re.match(r"^```(\S*)\s*(.*)$", lines[index])
        if not opening:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        code = "\n".join(lines[index + 1 : end]) + "\n"
        found.append(Block(opening[1], tuple(opening[2].split()), code, index + 1))
        index = end + 1
    return found


def commands(code: str) -> list[list[str]]:
    """A sh block's commands, one a line (comments and blank lines dropped), as argv."""
    return [argv for line in code.splitlines() if (argv := shlex.split(line, comments=True))]


def test_blocks_are_read_with_their_info_strings():
    text = "a\n```python\nprint(1)\n```\n```sh no-run\nmake demo\n```\n"

    assert blocks(text) == [
        Block("python", (), "print(1)\n", 2),
        Block("sh", ("no-run",), "make demo\n", 5),
    ]
    assert commands("runstate wal read --dataset x  # a comment\n\n# only a comment\n") == [
        ["runstate", "wal", "read", "--dataset", "x"]
    ]


def test_every_block_runs_or_says_it_does_not():
    found = blocks(README.read_text())

    assert all(block.language in RUNNABLE for block in found), [(b.line, b.language) for b in found]
    assert sum(not block.runs for block in found) == EXPECTED_NO_RUN, "a new no-run block: make it run"
    assert {block.language for block in found if block.runs} == RUNNABLE
    assert "make test" in next(block.code for block in found if not block.runs)


@pytest.fixture
def readme_env(fresh_database: str, moto_endpoint: str, tmp_path: Path) -> dict[str, str]:
    """The environment `make demo` leaves a reader in: services up, the schemas and the WAL table made."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SNOWFLAKE_", "RUNSTATE_", "DAGSTER_"))}
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        RUNSTATE_HOME=str(tmp_path),
        DAGSTER_HOME=str(dagster_home),
        DAGSTER_TELEMETRY_ENABLED="false",
        RUNSTATE_PG_URL=fresh_database,
        DAGSTER_PG_URL=fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1),
        RUNSTATE_AWS_ENDPOINT_URL=moto_endpoint,
        RUNSTATE_WAL_TABLE=f"readme_wal_{tmp_path.name[-8:]}",
        RUNSTATE_BLOB_BUCKET=f"readme-blobs-{os.getpid()}-{tmp_path.name[-8:]}".lower().replace("_", "-"),
    )
    _run(["runstate", "db", "upgrade"], env, tmp_path)  # what `services up` ran
    return env


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # a dozen processes, each importing dagster: a minute
def test_every_readme_block_runs(readme_env: dict[str, str], tmp_path: Path):
    outputs: list[str] = []
    for block in (block for block in blocks(README.read_text()) if block.runs):
        if block.language == "python":
            argvs = [[sys.executable, "-c", block.code]]
        else:
            argvs = [[str(BIN / argv[0]), *argv[1:]] for argv in commands(block.code)]
        for argv in argvs:
            done = _run(argv, readme_env, tmp_path)
            what = f"README line {block.line}: {shlex.join(argv)[:200]}"
            assert done.returncode == 0, f"{what} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
            outputs.append(done.stdout)

    # The blocks did what their prose says, not only exit 0.
    text = "\n".join(outputs)
    assert "RUNNING SUCCESS" in text  # the run's projection: running, its step succeeded
    assert "{'o-1': {'total': 12.5}, 'o-2': {'total': 3}}" in text  # the deleted key is gone
    assert "refused:" in text and "queued " in text
    assert '"sku1": {' in text and '"qty": 2' in text  # `runstate wal read` after the CLI's flush
