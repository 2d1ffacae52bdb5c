"""`runstate wal append|tick|read|status` through click's CliRunner, against the test's own table and bucket."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from runstate.cli import main
from runstate.config import settings
from runstate.wal import Change
from runstate_tests.wal.shell import WalWorld


def run(wal_cli: CliRunner, *args: str) -> tuple[int, str]:
    result = wal_cli.invoke(main, ["wal", *args], catch_exceptions=False)
    return result.exit_code, result.output


def test_append_tick_read_status_end_to_end(wal_cli: CliRunner, world: WalWorld) -> None:
    assert run(
        wal_cli, "append", "--dataset", "orders", "--upsert", 'sku1={"qty": 2}', "--upsert", "sku2=5"
    ) == (
        0,
        "orders seq 1\n",
    )
    assert run(wal_cli, "append", "--dataset", "orders", "--delete", "sku2") == (0, "orders seq 2\n")
    code, before = run(wal_cli, "status")
    assert code == 0 and "orders" in before and before.split("\n")[1].split()[1] == "2"  # 2 pending

    code, ticked = run(wal_cli, "tick")
    assert code == 0 and "requested 1 run(s): 1 succeeded, 0 failed" in ticked

    code, read = run(wal_cli, "read", "--dataset", "orders")
    assert code == 0 and json.loads(read) == {
        "dataset": "orders",
        "version": 2,
        "state": {"sku1": {"qty": 2}},
        "int_state": {},
    }
    code, after = run(wal_cli, "status", "--json")
    [row] = json.loads(after)
    assert (
        row["dataset_id"],
        row["pending_count"],
        row["oldest_pending_age_s"],
        row["last_applied_seq"],
    ) == ("orders", 0, None, 2)


def test_a_second_tick_with_nothing_pending_says_so(wal_cli: CliRunner) -> None:
    run(wal_cli, "append", "--dataset", "orders", "--upsert", "a=1")
    run(wal_cli, "tick")

    code, output = run(wal_cli, "tick")

    assert code == 0 and "skipped: no pending WAL rows" in output and "requested 0 run(s)" in output


def test_append_with_a_client_token_twice_writes_one_row(wal_cli: CliRunner, world: WalWorld) -> None:
    first = run(wal_cli, "append", "--dataset", "orders", "--upsert", "a=1", "--client-token", "req-42")
    second = run(wal_cli, "append", "--dataset", "orders", "--upsert", "a=1", "--client-token", "req-42")

    assert first == second == (0, "orders seq 1\n")
    assert list(world.statuses("orders")) == [1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset", "../orders", "--upsert", "a=1"], "dataset id '../orders' is invalid"),
        (["--dataset", "orders", "--upsert", "a=not json"], "value of 'a' is not JSON"),
        (["--dataset", "orders", "--upsert", "novalue"], "is not KEY=JSON"),
        (["--dataset", "orders"], "at least one --upsert"),
        (["--dataset", "orders", "--upsert", "big=" + json.dumps("x" * 500_000)], "400"),
        (["--dataset", "orders\n", "--upsert", "a=1"], "dataset id 'orders\\n' is invalid"),
        (
            ["--dataset", "orders", "--upsert", "a=1", "--client-token", "t\n"],
            "client token 't\\n' is invalid",
        ),
        (
            ["--dataset", "orders", "--upsert", "deep=" + "[" * 995 + "]" * 995],
            "nested deeper than 64 levels",
        ),
        (["--dataset", "orders", "--upsert", "deep=" + "[" * 65 + "]" * 65], "nested deeper than 64 levels"),
        (["--dataset", "orders", "--upsert", 'a="\\ud800"'], "UTF-8 cannot encode"),
        (["--dataset", "orders", "--upsert", "a=1", "--delete", "\ud800"], "UTF-8 cannot encode"),
    ],
)
def test_bad_append_is_refused_with_a_clear_error_and_nothing_written(
    wal_cli: CliRunner, world: WalWorld, args: list[str], message: str
) -> None:
    code, output = run(wal_cli, "append", *args)

    assert code != 0 and message in output
    assert "Traceback" not in output and [line for line in output.splitlines() if line.startswith("Error:")]
    assert world.statuses("orders") == {} and world.statuses("orders\n") == {}


def test_read_keeps_the_int_key_1_and_the_str_key_1_apart(wal_cli: CliRunner, world: WalWorld) -> None:
    world.producer().append("orders", [Change.upsert(1, "int"), Change.upsert("1", "str")])
    run(wal_cli, "tick")

    code, output = run(wal_cli, "read", "--dataset", "orders")

    assert code == 0
    document = json.loads(output)
    assert (document["state"], document["int_state"]) == ({"1": "str"}, {"1": "int"})


def test_read_of_a_corrupt_blob_names_the_blob(wal_cli: CliRunner, world: WalWorld) -> None:
    run(wal_cli, "append", "--dataset", "orders", "--upsert", "a=1")
    run(wal_cli, "tick")
    [delta] = world.blob_keys("orders")
    world.s3.put_object(Bucket=world.bucket, Key=delta, Body=b"corrupted")

    code, output = run(wal_cli, "read", "--dataset", "orders")

    assert code == 1 and delta in output and "checksum mismatch" in output


def test_read_of_a_dataset_whose_manifest_is_gone_names_it_instead_of_printing_nothing(
    wal_cli: CliRunner, world: WalWorld
) -> None:
    run(wal_cli, "append", "--dataset", "orders", "--upsert", "a=1")
    run(wal_cli, "tick")
    manifest = f"{world.prefix}orders/manifest.json"
    world.s3.delete_object(Bucket=world.bucket, Key=manifest)

    code, output = run(wal_cli, "read", "--dataset", "orders")

    assert code == 1
    assert output.strip() == (
        f"Error: dataset 'orders': manifest {manifest} is missing, but its WAL rows up to seq 1 are "
        "applied: the blobs were lost or deleted"
    )


def test_read_of_a_dataset_never_flushed_is_still_empty(wal_cli: CliRunner) -> None:
    run(wal_cli, "append", "--dataset", "orders", "--upsert", "a=1")

    code, output = run(wal_cli, "read", "--dataset", "orders")

    assert code == 0 and json.loads(output)["version"] == 0


def test_a_missing_wal_table_is_named_with_the_fix(
    wal_cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNSTATE_WAL_TABLE", "no_such_wal_table")
    settings.cache_clear()

    code, output = run(wal_cli, "status")

    assert (
        code == 1 and "WAL table 'no_such_wal_table' not found" in output and "runstate services up" in output
    )


def test_append_read_and_status_never_import_dagster_or_pyarrow_before_they_need_it(world: WalWorld) -> None:
    """Nor psycopg: the error roots the CLI imports before every verb include the maintenance package's
    and the services package's, which loaded it (`wal status` took 0.46 s with it, 0.37 s without)."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from runstate.cli import main\n"
        "for args in (['wal', 'append', '--dataset', 'orders', '--upsert', 'a=1'], ['wal', 'status'],\n"
        "             ['wal', 'read', '--dataset', 'orders']):\n"
        "    assert CliRunner().invoke(main, args).exit_code == 0, args\n"
        "heavy = ('dagster', 'pyarrow', 'pyspark', 'snowflake.connector', 'psycopg')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    env = {
        **os.environ,
        "RUNSTATE_AWS_ENDPOINT_URL": world.endpoint,
        "RUNSTATE_WAL_TABLE": world.table,
        "RUNSTATE_BLOB_BUCKET": world.bucket,
        "RUNSTATE_BLOB_PREFIX": world.prefix,
    }

    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
