"""LakeRunReader: a run's events read back from the lake without a JVM (pyiceberg), as fetch gives them."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from runstate.eventstore import EventType, InvalidEvent, NewEvent
from runstate.eventstore.lake import (
    HistoryCatalog,
    HistoryConfig,
    HistoryError,
    LakeRunReader,
    export_due,
    history_lag,
)
from runstate.eventstore.lake.export import commit_events
from runstate.eventstore.lake.source import next_range
from runstate.eventstore.lake.tables import events_position
from runstate.spark import SparkSettings
from runstate_tests.support.lake import append_randomly, exported_to_the_end, feed_from_start

pytestmark = [pytest.mark.spark]


@pytest.fixture
def catalog(spark_settings) -> Iterator[HistoryCatalog]:
    catalog = HistoryCatalog.from_spark_settings(spark_settings)
    yield catalog
    catalog.close()


def test_read_run_gives_what_fetch_gives_page_by_page(spark, own_store, history, catalog):
    append_randomly(own_store, random.Random(21), runs=5, appends=40)
    exported_to_the_end(spark, own_store, history)
    reader = LakeRunReader(catalog, history.namespace)

    for run_id in sorted({event.run_id for event in feed_from_start(own_store)}):
        assert reader.read_run(run_id) == own_store.fetch(run_id)
        assert reader.read_run(run_id, after_seq=2, limit=3) == own_store.fetch(run_id, after_seq=2, limit=3)
    assert reader.read_run("no-such-run") == []
    assert reader.position() == feed_from_start(own_store)[-1].position


def test_before_any_export_there_is_nothing_to_read(catalog, history):
    reader = LakeRunReader(catalog, history.namespace)

    assert reader.read_run("run-00") == [] and reader.position() == 0


@pytest.mark.parametrize(("after_seq", "limit"), [(-1, 10), (0, 0), (0, True), ("1", 10)])
def test_bad_arguments_are_refused_naming_the_field(catalog, history, after_seq, limit):
    with pytest.raises(InvalidEvent, match="after_seq|limit"):
        LakeRunReader(catalog, history.namespace).read_run("run-00", after_seq, limit)


def test_reading_without_spark_needs_the_jdbc_catalog(tmp_path):
    hadoop = SparkSettings(
        catalog_kind="hadoop", pg_url="postgresql://x@127.0.0.1/db", warehouse_dir=tmp_path
    )

    with pytest.raises(HistoryError, match="needs the JDBC catalog"):
        HistoryCatalog.from_spark_settings(hadoop)


def test_runs_left_behind_by_an_export_that_died_before_its_merge_make_an_export_due(
    spark, own_store, history, catalog
):
    """An export killed between its last commit and its runs merge left run_events at the feed's end and
    runs behind: the sensor must still start an export and the lag check must count the runs' lag."""
    append_randomly(own_store, random.Random(4), runs=3, appends=10)
    exported_to_the_end(spark, own_store, history)
    reached = feed_from_start(own_store)[-1].position
    assert export_due(own_store, catalog, history).position is None
    append_randomly(own_store, random.Random(5), runs=3, appends=10)
    snapshot_id, after = events_position(spark, history)
    commit_events(spark, own_store, history, snapshot_id, next_range(own_store, after, 100_000))  # no merge
    assert events_position(spark, history)[1] == feed_from_start(own_store)[-1].position

    assert export_due(own_store, catalog, history).position == reached
    lag = history_lag(own_store, catalog, history)
    assert (lag.position, lag.behind) == (reached, len(own_store.fetch_all(reached, 1000)))

    exported_to_the_end(spark, own_store, history)
    assert export_due(own_store, catalog, history).position is None
    assert history_lag(own_store, catalog, history).behind == 0


def _event_of(store, job: str, n: int) -> None:
    ref = {"dagster_run_id": f"{job}-run", "job_name": job}
    store.append(
        NewEvent(f"{job}-run", EventType.STEP_STARTED, datetime.now(UTC), step_id=f"s{n}", engine_run_ref=ref)
    )


def _of_job(job: str):
    return lambda event: event.engine_run_ref["job_name"] == job


def test_events_that_can_wait_make_no_export_due_until_other_events_come_or_half_the_lag_bound(
    own_store, catalog
):
    """The export runs' own events (the sensor defers them) would make an idle deployment export once a
    minute for ever: they wait for another run's events, or half of max_lag_minutes."""
    history = HistoryConfig(namespace=f"hist_{uuid.uuid4().hex[:10]}", max_lag_minutes=10)  # no tables: 0
    for n in range(3):
        _event_of(own_store, "export", n)
    oldest = own_store.fetch_all(0, 1)[0].persisted_at
    waiting = export_due(own_store, catalog, history, deferrable=_of_job("export"), now=oldest)

    assert waiting.position is None and waiting.reason.startswith(
        "only 3 event(s) of runs that can wait are pending"
    )
    assert export_due(own_store, catalog, history).position == 0  # nothing can wait
    late = oldest + timedelta(minutes=5)
    assert export_due(own_store, catalog, history, deferrable=_of_job("export"), now=late).position == 0
    _event_of(own_store, "flush", 0)
    assert export_due(own_store, catalog, history, deferrable=_of_job("export"), now=oldest).position == 0
