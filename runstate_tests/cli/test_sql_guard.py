"""`runstate sql`'s allow lists (runstate.cli.sql_guard), in-process on the worker's Spark session.

Each hostile statement comes from an adversarial probe (issue 51) or is a variant of one: it must be refused
(QueryRefused, or Spark's own error when the analyser cannot even resolve it) with nothing run and no file
read. Each ordinary query must still be answered.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runstate.cli.sql_guard import AllowList, QueryRefused, read_only_query

pytestmark = [pytest.mark.spark]
SCRIPT = "the query's plan holds ScriptTransformation (org.apache.spark.sql.catalyst.plans.logical."
GETENV = "'java.lang.System', 'getenv', 'HOME'"


@pytest.fixture
def lake_table(spark, iceberg_namespace) -> Iterator[str]:
    """lake.<ns>.events with two snapshots (rows 1 and 2, then 3); the current catalog `lake`."""
    table = f"lake.{iceberg_namespace}.events"
    spark.sql(f"CREATE TABLE {table} (id BIGINT, kind STRING) USING iceberg")
    spark.sql(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"INSERT INTO {table} VALUES (3, 'a')")
    spark.catalog.setCurrentCatalog("lake")
    yield table


@pytest.fixture
def host_file(tmp_path: Path) -> Path:
    """A file the host holds and the lake does not: what the probe read (/etc/shadow) stood for."""
    secret = tmp_path / "secret.txt"
    secret.write_text("secret-line\n")
    return secret


def refused(spark, statement: str, message: str) -> None:
    with pytest.raises(QueryRefused, match=re.escape(message)) as refusal:
        read_only_query(spark, statement)
    assert "nothing was run" in refusal.value.message and "\n" not in refusal.value.message


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT TRANSFORM(a) USING 'touch {mark}' AS (out) FROM VALUES (1) t(a)",
        "FROM VALUES (1) t(a) SELECT TRANSFORM(a) USING 'touch {mark}' AS (out)",
        "WITH x AS (SELECT TRANSFORM(a) USING 'touch {mark}' AS (out) FROM VALUES (1) t(a)) SELECT * FROM x",
        "SELECT 1 WHERE EXISTS (SELECT TRANSFORM(a) USING 'touch {mark}' AS (o) FROM VALUES (1) s(a))",
    ],
    ids=["select", "from-first", "in-with", "in-subquery"],
)
def test_script_transformation_is_refused_and_runs_nothing(spark, tmp_path, statement):
    mark = tmp_path / "ran"

    refused(
        spark,
        statement.format(mark=mark),
        SCRIPT,
    )

    assert not mark.exists()


@pytest.mark.parametrize("source", ["text", "csv", "binaryFile", "json", "parquet", "orc"])
@pytest.mark.parametrize("spelling", ["{source}.`{path}`", "IDENTIFIER('{source}.`{path}`')"])
def test_a_file_is_no_table(spark, host_file, source, spelling):
    """SQL on files is off: the name is looked up as a table of the lake, and there is none."""
    name = spelling.format(source=source, path=host_file)

    refused(spark, f"SELECT * FROM {name}", "TABLE_OR_VIEW_NOT_FOUND")
    refused(spark, f"SELECT * FROM {source}.`file://{host_file}`", "TABLE_OR_VIEW_NOT_FOUND")


@pytest.mark.parametrize("source", ["text", "csv", "binaryFile", "json"])
def test_a_relation_over_files_is_refused_even_with_sql_on_files_on(spark, host_file, source):
    """The allow list alone, should SQL on files be on (a RUNSTATE_SPARK_CONF, say): a LogicalRelation."""
    spark.conf.set("spark.sql.runSQLOnFiles", "true")
    try:
        plan = spark.sql(f"SELECT * FROM {source}.`{host_file}`")._jdf.queryExecution().analyzed()
    finally:
        spark.conf.set("spark.sql.runSQLOnFiles", "false")

    with pytest.raises(QueryRefused, match=re.escape("LogicalRelation (org.apache.spark")):
        AllowList(spark).check(plan)


@pytest.mark.parametrize(
    "statement",
    [
        f"SELECT reflect({GETENV})",
        f"SELECT java_method({GETENV})",
        f"SELECT `reflect`({GETENV})",
        f"SELECT IDENTIFIER('reflect')({GETENV})",
        f"SELECT IDENTIFIER('java_method')({GETENV})",
        f"SELECT * FROM (SELECT reflect({GETENV}) AS r)",
        f"WITH x AS (SELECT java_method({GETENV}) AS r) SELECT * FROM x",
        f"SELECT 1 WHERE EXISTS (SELECT reflect({GETENV}))",
        f"SELECT 1 WHERE 'x' IN (SELECT reflect({GETENV}))",
        f"SELECT * FROM VALUES (1) t(a) LATERAL VIEW explode(array(reflect({GETENV}))) q AS c",
        f"SELECT * FROM VALUES (1) t(a), LATERAL (SELECT reflect({GETENV}))",
        f"SELECT nvl(reflect({GETENV}), 'x')",
        f"SELECT transform(array(1), x -> reflect({GETENV}))",
        f"SELECT max(a) OVER (PARTITION BY reflect({GETENV})) FROM VALUES (1) t(a)",
    ],
)
def test_calling_java_by_name_is_refused_however_spelled(spark, statement):
    refused(
        spark,
        statement,
        "the query calls CallMethodViaReflection (org.apache.spark.sql.catalyst.expressions.Call",
    )


def test_try_reflect_is_no_function_of_this_spark(spark):
    refused(spark, f"SELECT try_reflect({GETENV})", "UNRESOLVED_ROUTINE")


def test_a_catalog_function_is_refused(spark, lake_table):
    """Iceberg's own `system.bucket` is harmless, but a catalog's functions are user code: on no list."""
    refused(spark, f"SELECT lake.system.bucket(4, id) FROM {lake_table}", "StaticInvoke (")


def test_explain_is_refused_as_a_command(spark):
    refused(spark, "EXPLAIN SELECT 1", "not EXPLAIN (Spark's ExplainCommand)")


def test_a_temporary_view_is_refused(spark, lake_table):
    """CREATE TEMP VIEW is a command and refused; a view that exists in the session is no lake table."""
    spark.sql(f"CREATE OR REPLACE TEMP VIEW guard_test_view AS SELECT * FROM {lake_table}")
    try:
        refused(
            spark, "SELECT * FROM guard_test_view", "View (org.apache.spark.sql.catalyst.plans.logical.View)"
        )
    finally:
        spark.catalog.dropTempView("guard_test_view")


def test_a_table_of_the_session_catalog_is_refused(spark):
    spark.sql("CREATE TABLE IF NOT EXISTS spark_catalog.default.guard_test USING parquet AS SELECT 1 AS a")
    try:
        refused(spark, "SELECT * FROM spark_catalog.default.guard_test", "LogicalRelation (")
    finally:
        spark.sql("DROP TABLE IF EXISTS spark_catalog.default.guard_test")


@pytest.fixture
def hadoop_catalogs(spark) -> Iterator[Callable[[str, Path], str]]:
    """Adds an Iceberg Hadoop catalog over a warehouse to the session, named by a prefix and a suffix of its
    own (the session keeps a catalog it made, by name, after its settings are unset)."""
    keys = []

    def add(prefix_of_name: str, warehouse: Path) -> str:
        name = f"{prefix_of_name}_{uuid.uuid4().hex[:8]}"
        prefix = f"spark.sql.catalog.{name}"
        conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.type": "hadoop"}
        conf[f"{prefix}.warehouse"] = warehouse.as_uri()
        for key, value in conf.items():
            spark.conf.set(key, value)
            keys.append(key)
        return name

    yield add
    for key in keys:
        spark.conf.unset(key)


def test_an_iceberg_table_of_another_catalog_is_refused(spark, tmp_path, hadoop_catalogs):
    other = hadoop_catalogs("guard_other", tmp_path)
    spark.sql(f"CREATE TABLE {other}.ns.t (a INT) USING iceberg")

    refused(spark, f"SELECT * FROM {other}.ns.t", f"not {other}.ns.t (catalog {other}")


@pytest.mark.parametrize(
    "name", ["`..`.outside.ns.t", "ns.`../../outside/ns/t`", "`..`.`outside`.ns.`t`.snapshots"]
)
def test_a_table_named_out_of_the_warehouse_is_refused(spark, tmp_path, hadoop_catalogs, name):
    """A Hadoop catalog (RUNSTATE_ICEBERG_CATALOG=hadoop) makes a table's folder from its name: `..` in
    a part climbs out of the warehouse to another Iceberg table on the host, which Spark then reads."""
    lake = hadoop_catalogs("guard_lake", tmp_path / "warehouse")
    outside = hadoop_catalogs("guard_outside", tmp_path / "outside")
    spark.sql(f"CREATE TABLE {outside}.ns.t (a INT) USING iceberg")
    spark.sql(f"INSERT INTO {outside}.ns.t VALUES (42)")
    climbing = spark.sql(f"SELECT * FROM {lake}.{name}")
    if not name.endswith("snapshots"):
        assert climbing.collect()[0].a == 42  # what the guard must stop: the analyser resolved it

    with pytest.raises(QueryRefused, match=re.escape("is named by plain identifiers")):
        AllowList(spark, catalog=lake).check(climbing._jdf.queryExecution().analyzed())
    plain = spark.sql(f"SELECT * FROM {outside}.ns.t.snapshots")._jdf.queryExecution().analyzed()
    AllowList(spark, catalog=outside).check(plain)  # a metadata table named plainly passes


def test_input_file_name_is_harmless_and_allowed(spark, lake_table):
    rows = read_only_query(spark, f"SELECT input_file_name() AS f FROM {lake_table}").collect()

    assert rows and all(row.f.endswith(".parquet") for row in rows)


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("SELECT id, kind FROM {t} ORDER BY id", [(1, "a"), (2, "b"), (3, "a")]),
        ("TABLE {t}", [(1, "a"), (2, "b"), (3, "a")]),
        ("FROM {t} SELECT count(*)", [(3,)]),
        ("VALUES (1, 'x'), (2, 'y')", [(1, "x"), (2, "y")]),
        ("SELECT 1 + 1", [(2,)]),
        ("WITH x AS (SELECT * FROM {t}) SELECT a.id FROM x a JOIN x b USING (id) WHERE a.id > 2", [(3,)]),
        (
            "SELECT id, row_number() OVER (PARTITION BY kind ORDER BY id) FROM {t} ORDER BY id",
            [(1, 1), (2, 1), (3, 2)],
        ),
        ("SELECT kind, count(*) FROM {t} GROUP BY ROLLUP (kind) ORDER BY kind NULLS LAST", None),
        ("SELECT e.id FROM {t} e LEFT ANTI JOIN (SELECT 1 AS id) o ON e.id = o.id ORDER BY 1", [(2,), (3,)]),
        ("SELECT id FROM {t} WHERE id IN (SELECT max(id) FROM {t})", [(3,)]),
        ("SELECT * FROM {t}, LATERAL (SELECT id * 2 AS twice) WHERE id = 1", [(1, "a", 2)]),
        ("SELECT c FROM {t} LATERAL VIEW explode(array(id)) q AS c WHERE id = 2", [(2,)]),
        ("SELECT count(*) FROM {t}.snapshots", [(2,)]),
        ("SELECT count(*) FROM {t}.history h JOIN {t}.snapshots s USING (snapshot_id)", [(2,)]),
        ("SELECT sum(record_count) FROM {t}.files", [(3,)]),
        ("SELECT id FROM {t} UNION SELECT 9 EXCEPT SELECT 2 ORDER BY 1", [(1,), (3,), (9,)]),
        (
            "SELECT date_add(date'2020-01-01', 1), nvl(NULL, 'x'), transform(array(1), x -> x + 1), "
            "timestamp'2020-01-01 00:00:00' + INTERVAL 1 DAY < current_timestamp(), ceil(1.5), lpad('a', 2, '-')",
            None,
        ),
    ],
)
def test_ordinary_queries_of_the_lake_still_run(spark, lake_table, statement, expected):
    rows = read_only_query(spark, statement.format(t=lake_table)).collect()

    if expected is not None:  # sorted: TABLE t reads the table's files in no set order
        assert sorted(tuple(row) for row in rows) == sorted(expected)
    else:
        assert rows


def test_time_travel_reads_an_older_snapshot(spark, lake_table):
    first = spark.sql(f"SELECT snapshot_id FROM {lake_table}.snapshots ORDER BY committed_at").first()[0]

    rows = read_only_query(spark, f"SELECT count(*) AS n FROM {lake_table} VERSION AS OF {first}").collect()

    assert rows[0].n == 2


def test_a_branch_whose_name_is_no_identifier_is_read_with_version_as_of(spark, lake_table):
    spark.sql(f"ALTER TABLE {lake_table} CREATE BRANCH `audit-1`")
    spark.sql(f"INSERT INTO {lake_table} VALUES (4, 'b')")

    refused(spark, f"SELECT * FROM {lake_table}.`branch_audit-1`", "is named by plain identifiers")
    rows = read_only_query(spark, f"SELECT count(*) AS n FROM {lake_table} VERSION AS OF 'audit-1'").collect()
    assert rows[0].n == 3
