"""The `.env` block of `runstate services up`: values round-trip, and a user's own line wins (issue 25.9)."""

from __future__ import annotations

import re
from pathlib import Path

import boto3
import pytest
from dagster._core.secrets.env_file import get_env_var_dict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from services_helpers import clean_env

from runstate.config import Settings, read_env_file
from runstate.services.env_file import ENV_BLOCK_START, remove_env_block, write_env_file
from runstate.services.state import ServiceError

# Every character a value may hold on one line of `.env`.
ONE_LINE_TEXT = st.text(
    st.characters(exclude_characters="\n\r\0", codec="utf-8"), max_size=40
) | st.sampled_from(["${HOME}", "$HOME", "a${b", "${a:b}", "\\${x}"])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RUNSTATE_HOME", str(tmp_path))
    return tmp_path


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=ONE_LINE_TEXT)
def test_every_value_reads_back_as_written_by_runstate_and_by_dagster_or_is_refused(home, value):
    try:
        write_env_file({"RUNSTATE_BLOB_PREFIX": value})
    except ServiceError:
        assert re.search(r"\$\{[^}]*\}", value)  # dotenv would expand it: there is no escape
        return

    assert read_env_file()["RUNSTATE_BLOB_PREFIX"] == value
    assert get_env_var_dict(str(home))["RUNSTATE_BLOB_PREFIX"] == value


@pytest.mark.parametrize("value", ["C:\\\\data\\\\", "a\\b", "it's", "$HOME", "p w#d", "\\'"])
def test_backslashes_quotes_and_dollars_round_trip(home, value):
    write_env_file({"RUNSTATE_BLOB_PREFIX": value})

    assert Settings.from_env({}).blob_prefix == value


@pytest.mark.parametrize("value", ["a\nB=1", "a\rb", "${HOME}"])
def test_a_value_dotenv_cannot_read_back_is_refused_and_nothing_written(home, value):
    with pytest.raises(ServiceError, match="cannot be written to .env"):
        write_env_file({"RUNSTATE_BLOB_PREFIX": value})

    assert not (home / ".env").exists()


def test_a_users_own_line_wins_over_the_block_for_every_reader(home):
    (home / ".env").write_text("# mine\nAWS_DEFAULT_REGION=eu-west-1\n")

    write_env_file({"AWS_DEFAULT_REGION": "us-east-1", "RUNSTATE_WAL_TABLE": "wal"})

    text = (home / ".env").read_text()
    assert "us-east-1" not in text
    assert read_env_file() == {"AWS_DEFAULT_REGION": "eu-west-1", "RUNSTATE_WAL_TABLE": "wal"}
    assert get_env_var_dict(str(home))["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert Settings.from_env({}).aws_region == "eu-west-1"
    remove_env_block()
    assert (home / ".env").read_text() == "# mine\nAWS_DEFAULT_REGION=eu-west-1\n"


def test_the_process_environment_still_wins_over_the_users_line(home):
    (home / ".env").write_text("AWS_DEFAULT_REGION=eu-west-1\n")

    assert Settings.from_env({"AWS_DEFAULT_REGION": "ap-south-1"}).aws_region == "ap-south-1"


def test_a_users_line_with_a_form_feed_is_kept_byte_for_byte(home):
    mine = "MY_NOTE='a\x0cb\u2028c'\n"
    (home / ".env").write_text(mine)

    write_env_file({"RUNSTATE_WAL_TABLE": "wal"})
    remove_env_block()

    assert (home / ".env").read_text() == mine


@pytest.mark.slow
def test_up_keeps_the_users_region_and_prepares_the_wal_there(services_home, runstate_cli, fresh_database):
    (services_home / ".env").write_text("AWS_DEFAULT_REGION=eu-west-1\n")
    env = clean_env(services_home, RUNSTATE_PG_URL=fresh_database)
    env.pop("AWS_DEFAULT_REGION", None)

    up = runstate_cli("services", "up", env=env)

    assert up.returncode == 0, up.stderr
    assert "your own line wins for AWS_DEFAULT_REGION" in up.stdout
    block = (services_home / ".env").read_text().split(ENV_BLOCK_START)[1]
    assert "AWS_DEFAULT_REGION" not in block
    written = read_env_file(services_home / ".env")
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=written["RUNSTATE_AWS_ENDPOINT_URL"],
        region_name="eu-west-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    assert "runstate_wal" in dynamodb.list_tables()["TableNames"]
    status = runstate_cli("wal", "status", env=env)
    assert status.returncode == 0, status.stderr
