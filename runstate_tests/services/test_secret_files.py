"""The files `runstate services` writes that may hold a password stay the owner's (issue 51.2): a user's 0600
`.env` keeps its mode through `up` and `down`, a new `.env` and `.runstate/services.json` are 0600."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from runstate.config import read_env_file
from runstate.services.env_file import remove_env_block, write_env_file
from runstate.services.state import EXTERNAL, ServiceRecord, load_records, save_records, services_file

PG_URL = "postgresql://runstate:s3cret@127.0.0.1:5432/runstate"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("RUNSTATE_HOME", str(tmp_path))
    # The usual umask: a file created without care would be readable by everyone (0644).
    previous = os.umask(0o022)
    try:
        yield tmp_path
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_users_0600_env_file_stays_0600_through_up_and_down(home):
    env = home / ".env"
    env.write_text("MY_TOKEN=t0ken\n")
    env.chmod(0o600)

    write_env_file({"RUNSTATE_PG_URL": PG_URL})  # what `up` writes
    after_up = mode(env)
    remove_env_block()  # what `down` does; the user's line keeps the file
    after_down = mode(env)

    assert (after_up, after_down) == (0o600, 0o600)
    assert read_env_file() == {"MY_TOKEN": "t0ken"}


def test_a_users_own_mode_for_env_is_kept(home):
    env = home / ".env"
    env.write_text("AWS_DEFAULT_REGION=eu-west-1\n")
    env.chmod(0o640)

    write_env_file({"RUNSTATE_PG_URL": PG_URL})

    assert mode(env) == 0o640


def test_a_new_env_file_is_the_owners_alone(home):
    path = write_env_file({"RUNSTATE_PG_URL": PG_URL})

    assert mode(path) == 0o600
    assert read_env_file()["RUNSTATE_PG_URL"] == PG_URL


def test_services_json_is_the_owners_alone_even_when_an_older_runstate_left_it_0644(home):
    record = ServiceRecord("postgres", EXTERNAL, PG_URL)
    save_records({"postgres": record})
    fresh = mode(services_file())
    services_file().chmod(0o644)  # as written before this fix

    save_records({"postgres": record})

    assert (fresh, mode(services_file())) == (0o600, 0o600)
    assert load_records() == {"postgres": record}
    assert not [p.name for p in services_file().parent.iterdir() if p.name.endswith(".tmp")]
