"""The identifier validator and the action list: pure functions, no services."""

from __future__ import annotations

import pytest

from runstate.maintenance import (
    ACTIONS,
    InvalidIdentifier,
    TableRef,
    UnknownAction,
    parse_table_ref,
    validate_actions,
    validate_identifier,
)

INJECTIONS = [
    "db.t'; DROP TABLE jobs; --",
    'db."t"',
    "db.t;",
    "db.t x",
    "db. t",
    "db.t\n",
    "db.t\t",
    "d b.t",
    "db.t\x00",
    "db.",
    ".t",
    ".",
    "",
    "db",
    "db.t.u",
    "db..t",
    "db.`t`",
    "db.1t",
    "db.t-1",
    "db.tä",
    "db." + "t" * 129,
    "lake.db.t",
]


@pytest.mark.parametrize("text", INJECTIONS)
def test_parse_table_ref_rejects_unsafe_text(text: str) -> None:
    with pytest.raises(InvalidIdentifier):
        parse_table_ref(text)


def test_invalid_identifier_is_a_value_error_that_names_the_part() -> None:
    with pytest.raises(ValueError, match="table name 't;'"):
        parse_table_ref("db.t;")


def test_parse_table_ref_accepts_plain_names_up_to_128_chars() -> None:
    ref = parse_table_ref("Sales_2024._" + "x" * 127)
    assert ref.database == "Sales_2024"
    assert len(ref.table) == 128


def test_table_ref_key_and_quoted_forms() -> None:
    ref = TableRef("db", "orders")
    assert ref.key == "db.orders"
    assert str(ref) == "db.orders"
    assert ref.quoted == "`db`.`orders`"
    assert ref.in_catalog("lake") == "lake.`db`.`orders`"


@pytest.mark.parametrize("database, table", [("db", "t t"), ("d.b", "t"), ("db", ""), ("db", None), (1, "t")])
def test_table_ref_constructor_validates_each_part(database: object, table: object) -> None:
    with pytest.raises(InvalidIdentifier):
        TableRef(database, table)  # type: ignore[arg-type]


def test_validate_identifier_rejects_non_strings() -> None:
    with pytest.raises(InvalidIdentifier, match="must be a string"):
        validate_identifier(b"db")


def test_actions_order_compacts_first_and_removes_orphans_last() -> None:
    assert ACTIONS == (
        "rewrite_data_files",
        "rewrite_position_delete_files",
        "rewrite_manifests",
        "expire_snapshots",
        "remove_orphan_files",
    )


def test_validate_actions_dedupes_and_orders() -> None:
    got = validate_actions(
        ["remove_orphan_files", "expire_snapshots", "rewrite_data_files", "expire_snapshots"]
    )
    assert got == ("rewrite_data_files", "expire_snapshots", "remove_orphan_files")


def test_validate_actions_reads_a_comma_separated_string() -> None:
    assert validate_actions("expire_snapshots, rewrite_manifests") == (
        "rewrite_manifests",
        "expire_snapshots",
    )


@pytest.mark.parametrize(
    "actions", [["vacuum"], ["rewrite_data_files", "DROP TABLE x"], ["Rewrite_Data_Files"], [], "", [None]]
)
def test_validate_actions_rejects_unknown_or_empty(actions: object) -> None:
    with pytest.raises(UnknownAction):
        validate_actions(actions)  # type: ignore[arg-type]
    assert issubclass(UnknownAction, ValueError)
