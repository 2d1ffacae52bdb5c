"""Process bookkeeping: default signal dispositions, the caller's environment, pid identity."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from runstate import services
from runstate.services.state import (
    ServiceError,
    ServiceRecord,
    is_running,
    process_start_time,
    require_module,
    spawn_detached,
    stop_process,
)


def test_an_embedded_server_whose_package_is_missing_is_named_with_what_to_install():
    require_module("moto", ("moto", "flask"), "moto[server]")  # installed: nothing to say

    with pytest.raises(ServiceError) as error:
        require_module("moto", ("moto", "no_such_package_of_moto_server"), "moto[server]")

    assert str(error.value) == (
        "moto: not installed in this Python; run `pip install -c requirements.lock -e '.[dev]'` "
        "(it brings moto[server])."
    )


def _ignored_signals(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigIgn line")


def test_detached_children_get_default_sigint_and_sigterm_even_from_a_parent_that_ignores_them(tmp_path):
    # The state a shell's `cmd &` leaves a process in: SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = spawn_detached(
            [sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "child.log"
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        mask = _ignored_signals(child.pid)
        assert not mask & (1 << (signal.SIGINT - 1))
        assert not mask & (1 << (signal.SIGTERM - 1))
    finally:
        stopped = stop_process(child.pid, process_start_time(child.pid), sig=signal.SIGTERM)
    assert stopped and process_start_time(child.pid) is None


def test_a_recorded_pid_reused_by_another_process_is_not_ours(tmp_path):
    child = spawn_detached(
        [sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "child.log"
    )
    try:
        stranger = ServiceRecord(
            "moto",
            "embedded",
            "http://127.0.0.1:1",
            pid=child.pid,
            pid_start=process_start_time(child.pid) + 1,
        )
        assert not is_running(stranger)
        assert stop_process(stranger.pid, stranger.pid_start) is False
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_variables_pointing_at_our_own_services_are_not_the_callers_choice(monkeypatch):
    ours = {"moto": ServiceRecord("moto", "embedded", "http://127.0.0.1:5999", port=5999, pid=1)}
    monkeypatch.setenv("RUNSTATE_AWS_ENDPOINT_URL", "http://127.0.0.1:5999")  # loaded from .runstate/env
    monkeypatch.setenv(
        "RUNSTATE_PG_URL", "postgresql://postgres@db.internal:5432/runstate"
    )  # the caller's own

    caller = services.caller_environment(ours)

    assert "RUNSTATE_AWS_ENDPOINT_URL" not in caller
    assert caller["RUNSTATE_PG_URL"] == "postgresql://postgres@db.internal:5432/runstate"


def test_our_fakesnow_is_recognised_but_a_real_snowflake_host_is_kept(monkeypatch):
    ours = {"fakesnow": ServiceRecord("fakesnow", "embedded", "http://127.0.0.1:6001", port=6001, pid=1)}
    monkeypatch.setenv("SNOWFLAKE_HOST", "127.0.0.1")
    monkeypatch.setenv("SNOWFLAKE_PORT", "6001")
    assert "SNOWFLAKE_HOST" not in services.caller_environment(ours)

    monkeypatch.setenv("SNOWFLAKE_HOST", "acct.snowflakecomputing.com")
    monkeypatch.delenv("SNOWFLAKE_PORT")
    assert services.caller_environment(ours)["SNOWFLAKE_HOST"] == "acct.snowflakecomputing.com"


def test_the_machine_postgres_we_chose_is_not_pinned_by_its_own_env_file_entry(monkeypatch):
    machine = {
        "postgres": ServiceRecord("postgres", "machine", "postgresql://postgres@127.0.0.1:5432/runstate")
    }
    monkeypatch.setenv("RUNSTATE_PG_URL", "postgresql://postgres@127.0.0.1:5432/runstate")
    monkeypatch.setenv("DAGSTER_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/dagster")

    caller = services.caller_environment(machine)

    assert "RUNSTATE_PG_URL" not in caller and "DAGSTER_PG_URL" not in caller


def test_the_env_block_keeps_the_users_lines_and_round_trips_through_dagsters_parser(tmp_path, monkeypatch):
    from dagster._core.secrets.env_file import get_env_var_dict

    from runstate.services.env_file import remove_env_block, write_env_file

    monkeypatch.setenv("RUNSTATE_HOME", str(tmp_path))
    (tmp_path / ".env").write_text("# mine\nMY_TOKEN=abc\n")
    values = {
        "RUNSTATE_PG_URL": "postgresql://postgres:p w#d@127.0.0.1:5432/runstate",
        "SNOWFLAKE_PORT": "6001",
    }

    write_env_file(values)
    write_env_file({**values, "SNOWFLAKE_PORT": "6002"})  # a second `up` replaces the block, never appends

    assert get_env_var_dict(str(tmp_path)) == {"MY_TOKEN": "abc", **values, "SNOWFLAKE_PORT": "6002"}
    remove_env_block()
    assert (tmp_path / ".env").read_text() == "# mine\nMY_TOKEN=abc\n"
