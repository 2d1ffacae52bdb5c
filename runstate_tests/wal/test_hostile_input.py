"""Hostile input to the WAL's validators, the API and `runstate wal append`: every input either succeeds
and reads back, or gets one line of error with nothing written (never a traceback, never a partial write)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runstate.config import settings as runstate_settings
from runstate.wal import (
    Change,
    DatasetReader,
    WalEncodingError,
    WalError,
    WalInputError,
    WalProducer,
    flush_dataset,
    state_document,
)
from runstate.wal.changes import MAX_VALUE_DEPTH, parse_upsert
from runstate.wal.source import _pending_key

from .helpers import item_count


def nested(depth: int) -> Any:
    value: Any = 0
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.mark.parametrize("dataset_id", ["orders\n", "orders\r\n", "\norders"])
def test_a_dataset_id_with_a_newline_is_refused_and_nothing_written(wal, dataset_id):
    with pytest.raises(WalInputError, match="dataset id"):
        WalProducer(wal.dynamodb, wal.table).append(dataset_id, [Change.upsert("k", 1)])

    assert item_count(wal.dynamodb, wal.table) == 0


def test_a_client_token_with_a_trailing_newline_is_refused_and_nothing_written(wal):
    with pytest.raises(WalInputError, match="client token 'tok\\\\n' is invalid"):
        WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("k", 1)], client_token="tok\n")

    assert item_count(wal.dynamodb, wal.table) == 0


def test_a_stream_record_of_a_dataset_id_with_a_newline_is_not_work():
    record = {
        "dynamodb": {
            "NewImage": {"DatasetId": {"S": "orders\n"}, "SeqNo": {"N": "1"}, "StatusIdx": {"S": "Pending"}}
        }
    }

    assert _pending_key(record) is None


@pytest.mark.parametrize("depth", [MAX_VALUE_DEPTH + 1, 995, 5000])
def test_json_nested_too_deep_is_refused_with_the_limit(depth):
    with pytest.raises(WalInputError, match=f"nested deeper than {MAX_VALUE_DEPTH} levels"):
        Change.upsert("k", nested(depth))
    with pytest.raises(WalInputError, match=f"nested deeper than {MAX_VALUE_DEPTH} levels"):
        parse_upsert("k=" + "[" * depth + "]" * depth)


def test_json_nested_up_to_the_limit_is_stored_and_read_back(wal):
    value = nested(MAX_VALUE_DEPTH)
    producer = WalProducer(wal.dynamodb, wal.table)

    seq = producer.append("orders", [Change.upsert("k", value)])
    table, blobs = wal.owners()
    flush_dataset(table, blobs, "orders", [seq])

    assert DatasetReader.of(blobs, "orders").state() == {"k": value}


def test_a_change_built_by_hand_is_checked_too_and_nothing_written(wal):
    producer = WalProducer(wal.dynamodb, wal.table)

    with pytest.raises(WalInputError, match="nested deeper"):
        producer.append("orders", [Change("upsert", "k", nested(2000))])
    with pytest.raises(WalEncodingError, match="UTF-8 cannot encode"):
        producer.append("orders", [Change("upsert", "k", "\ud800")])

    assert item_count(wal.dynamodb, wal.table) == 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: Change.upsert("k", "\ud800"),
        lambda: Change.upsert("k", {"a": ["x\udfffy"]}),
        lambda: Change.upsert("\ud800", 1),
        lambda: Change.delete("k\udc80"),
        lambda: parse_upsert('k="\\ud800"'),
    ],
)
def test_a_lone_surrogate_is_a_clear_wal_encoding_error(make):
    with pytest.raises(WalEncodingError, match="UTF-8 cannot encode") as error:
        make()

    assert "\n" not in str(error.value)


def test_the_int_key_1_and_the_str_key_1_stay_apart_in_the_json_document():
    document = state_document("orders", 2, {1: "int", "1": "str", 10: "ten", 2: "two"})

    assert json.loads(json.dumps(document, sort_keys=True)) == {
        "dataset": "orders",
        "version": 2,
        "state": {"1": "str"},
        "int_state": {"1": "int", "2": "two", "10": "ten"},
    }


# --- properties -------------------------------------------------------------------------------------------

HOSTILE_TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            "\n",
            "orders\n",
            "a/b",
            "../x",
            "#token#x",
            "\x00",
            "\ud800",
            "a\udfffb",
            "x" * 70,
            "ok-id",
            "ok.id_2",
            "ünï",
            "\u202e",
            "a b",
            "a=b",
        ]
    ),
)
JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    HOSTILE_TEXT,
)
VALUES = st.one_of(
    st.recursive(
        JSON_LEAVES,
        lambda children: (
            st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
        ),
        max_leaves=12,
    ),
    st.integers(min_value=0, max_value=1200).map(nested),
    st.sets(st.integers(), max_size=2),  # not JSON at all
)
KEYS = st.one_of(HOSTILE_TEXT, st.integers(min_value=-(2**64), max_value=2**64), st.booleans(), st.none())
TOKENS = st.one_of(st.none(), HOSTILE_TEXT)
PROPERTY_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _read_back(wal, dataset_id: str, seq: int) -> dict:
    table, blobs = wal.owners()
    flush_dataset(table, blobs, dataset_id, [seq])
    return DatasetReader.of(blobs, dataset_id).state()


@PROPERTY_SETTINGS
@given(dataset_id=HOSTILE_TEXT, key=KEYS, value=VALUES, token=TOKENS)
def test_the_api_either_stores_and_reads_back_or_refuses_in_one_line_writing_nothing(
    wal, dataset_id, key, value, token
):
    before = item_count(wal.dynamodb, wal.table)
    try:
        change = Change.upsert(key, value)
        seq = WalProducer(wal.dynamodb, wal.table).append(dataset_id, [change], client_token=token)
    except WalError as error:
        assert "\n" not in str(error) and str(error)
        assert item_count(wal.dynamodb, wal.table) == before
        return
    assert _read_back(wal, dataset_id, seq)[key] == json.loads(json.dumps(value))


@pytest.fixture
def cli(wal, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("RUNSTATE_AWS_ENDPOINT_URL", wal.endpoint)
    monkeypatch.setenv("RUNSTATE_WAL_TABLE", wal.table)
    monkeypatch.setenv("RUNSTATE_BLOB_BUCKET", wal.bucket)
    monkeypatch.setenv("RUNSTATE_BLOB_PREFIX", wal.prefix)
    runstate_settings.cache_clear()
    yield CliRunner()
    runstate_settings.cache_clear()


RAW_JSON = st.one_of(
    VALUES.map(lambda value: json.dumps(value, default=list)),
    st.text(max_size=20),
    st.integers(min_value=0, max_value=3000).map(lambda n: "[" * n + "]" * n),
    st.sampled_from(['"\\ud800"', "NaN", "1e999", "9" * 5000, "{", '{"a":1}{', "\ud800"]),
)


@PROPERTY_SETTINGS
@given(dataset_id=HOSTILE_TEXT, key=HOSTILE_TEXT, raw=RAW_JSON, token=TOKENS)
def test_wal_append_either_stores_and_reads_back_or_prints_one_error_line_writing_nothing(
    wal, cli, dataset_id, key, raw, token
):
    from runstate.cli import main

    before = item_count(wal.dynamodb, wal.table)
    args = ["wal", "append", "--dataset", dataset_id, "--upsert", f"{key}={raw}"]
    if token is not None:
        args += ["--client-token", token]

    result = cli.invoke(main, args)

    assert "Traceback" not in result.output and not isinstance(
        result.exception, (RecursionError, UnicodeError)
    )
    if result.exit_code != 0:
        errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, result.output
        assert item_count(wal.dynamodb, wal.table) == before
        return
    assert result.exception is None
    seq = int(result.output.rsplit(" ", 1)[1])
    parsed_key, _, parsed_raw = f"{key}={raw}".partition("=")
    assert _read_back(wal, dataset_id, seq)[parsed_key] == json.loads(parsed_raw)
