"""Compaction beside a live writer: a thread appends a row every second while rewrite_data_files runs.

Over 10 rounds on one table, every round's job either completes (retrying a lost commit race within
the action) or fails cleanly; no row is ever lost or duplicated. The success rate is printed.
"""

from __future__ import annotations

import threading

import pytest

from runstate.maintenance.runner import run_job
from runstate_tests.support.maintenance import cache, make_table

pytestmark = pytest.mark.spark
ROUNDS = 10


class Appender(threading.Thread):
    """Appends one row per second through the base session (a writer outside maintenance)."""

    def __init__(self, spark, table: str, first_id: int) -> None:
        super().__init__(daemon=True)
        self.spark, self.table, self.next_id = spark, table, first_id
        self.stop_event = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.spark.sql(f"INSERT INTO {self.table} VALUES ({self.next_id}, 'live{self.next_id}')")
                self.next_id += 1
            except Exception as exc:  # noqa: BLE001 - an append that failed is not counted, and reported
                self.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            self.stop_event.wait(1.0)


def test_rewrite_beside_a_live_writer_loses_and_duplicates_nothing(spark, iceberg_namespace, store, capsys):
    ref = make_table(spark, iceberg_namespace, files=6, rows=60)
    cache(store, ref)
    table = f"lake.{ref.quoted}"
    outcomes = []
    next_id = 60
    for round_number in range(ROUNDS):
        # Fresh small files every round, so each rewrite has work to do.
        spark.range(next_id, next_id + 30).selectExpr("id", "concat('v', id) AS v").repartition(6).writeTo(
            table
        ).append()
        next_id += 30
        writer = Appender(spark, table, first_id=1_000_000 * (round_number + 1))
        store.submit(ref.database, ref.table, ["rewrite_data_files"])
        claim = store.claim("compactor", lease_seconds=300)
        writer.start()
        try:
            outcome = run_job(spark, store, claim)
        finally:
            writer.stop_event.set()
            writer.join(timeout=120)
        appended = writer.next_id - 1_000_000 * (round_number + 1)
        outcomes.append((outcome.status, appended, outcome.error))
        assert not writer.errors, writer.errors
        expected_ids = next_id + sum(count for _, count, _ in outcomes)
        total, distinct = spark.sql(f"SELECT count(*), count(DISTINCT id) FROM {table}").first()
        assert total == distinct == expected_ids, f"round {round_number}: {total} rows, {distinct} ids"

    completed = sum(1 for status, _, _ in outcomes if status == "completed")
    assert all(status in ("completed", "failed") for status, _, _ in outcomes), outcomes
    with capsys.disabled():
        print(
            f"\nlive writer: {completed}/{ROUNDS} rewrites completed "
            f"({sum(a for _, a, _ in outcomes)} rows appended during them); outcomes: "
            + ", ".join(status for status, _, _ in outcomes)
        )
    assert completed >= 1
