"""Dataset ids to table names: stable, collision-free, always a plain identifier."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runstate.wal import WalInputError
from runstate.wal.changes import DATASET_ID_PATTERN
from runstate.wal.dataset_tables import table_ident, table_name

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")  # the maintenance service's rule
dataset_ids = st.from_regex(DATASET_ID_PATTERN, fullmatch=True)


def test_a_plain_lower_case_id_is_its_own_table_name():
    assert table_ident("orders") == "lake.datasets.orders"


@pytest.mark.parametrize(
    "dataset_id, name",
    [
        ("Orders", "orders_b7e8acdd"),
        ("orders.v2", "orders_v2_ace4ce8e"),
        ("9x", "d_9x_49c45e82"),
    ],
)
def test_other_ids_map_to_a_documented_stable_name(dataset_id, name):
    assert table_name(dataset_id) == name


def _look_alikes(dataset_id: str) -> list[str]:
    """Valid ids that differ from `dataset_id` only where the name rule folds: its own table name, case,
    '.', '-' and '_'."""
    variants = [
        table_name(dataset_id),
        dataset_id.lower(),
        dataset_id.upper(),
        dataset_id.replace(".", "_").replace("-", "_"),
        dataset_id.replace("_", "-"),
    ]
    return [v for v in variants if DATASET_ID_PATTERN.fullmatch(v)]


@st.composite
def id_pairs(draw: st.DrawFn) -> tuple[str, str]:
    first = draw(dataset_ids)
    return first, draw(st.one_of(dataset_ids, st.sampled_from(_look_alikes(first))))


@settings(max_examples=300, deadline=None, database=None)
@given(id_pairs())
def test_names_are_identifiers_and_distinct_ids_never_share_one(pair):
    a, b = pair
    assert IDENTIFIER.match(table_name(a)) and IDENTIFIER.match(table_name(b))
    assert (table_name(a) == table_name(b)) == (a == b)


def test_a_plain_id_shaped_like_a_hashed_name_gets_a_hashed_name_of_its_own():
    # `RtColl` is named rtcoll_e120c38d; the plain id `rtcoll_e120c38d` must not land in its table.
    assert table_name("RtColl") == "rtcoll_e120c38d"
    assert table_name("rtcoll_e120c38d") not in {"rtcoll_e120c38d", table_name("RtColl")}


@pytest.mark.parametrize("bad", ["", "a b", "x;drop", "../etc", "a" * 64, "ds'"])
def test_an_invalid_dataset_id_is_refused_before_any_sql(bad):
    with pytest.raises(WalInputError, match="dataset id"):
        table_name(bad)
