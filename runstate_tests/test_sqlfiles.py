"""The shipped SQL: read through importlib.resources, named queries parsed by name."""

from __future__ import annotations

import pytest

from runstate import sqlfiles

QUERIES = """\
-- Queries of a test domain.

-- name: claim_job
-- Claim the oldest ready job.
-- Second line of its documentation.
UPDATE job_queue SET claimed_by = %(worker)s
 WHERE job_id = %(job_id)s
RETURNING job_id;

-- name: count_jobs
SELECT count(*) FROM jobs
"""


def test_named_queries_are_parsed_without_their_documentation_or_trailing_semicolon():
    parsed = sqlfiles.parse_queries(QUERIES, "test.sql")

    assert parsed == {
        "claim_job": "UPDATE job_queue SET claimed_by = %(worker)s\n WHERE job_id = %(job_id)s\nRETURNING job_id",
        "count_jobs": "SELECT count(*) FROM jobs",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n", "query 'a' is defined twice"),
        ("SELECT 0;\n-- name: a\nSELECT 1;\n", "SQL before the first `-- name:` line"),
        ("-- name: Bad-Name\nSELECT 1;\n", "query name 'Bad-Name' must match"),
        ("-- name: empty\n-- only a comment\n", "query 'empty' is empty"),
    ],
)
def test_a_malformed_query_file_is_refused_naming_the_file(text, message):
    with pytest.raises(sqlfiles.SqlFileError, match=message) as error:
        sqlfiles.parse_queries(text, "sql/postgres/x/queries.sql")

    assert "sql/postgres/x/queries.sql" in str(error.value)


def test_queries_load_by_name_from_the_shipped_folder_and_a_missing_name_says_where(tmp_path, monkeypatch):
    (tmp_path / "postgres" / "demo").mkdir(parents=True)
    (tmp_path / "postgres" / "demo" / "queries.sql").write_text(QUERIES)
    monkeypatch.setattr(sqlfiles, "root", lambda: tmp_path)
    sqlfiles.queries.cache_clear()
    try:
        queries = sqlfiles.queries("postgres", "demo", "queries.sql")
        lookup = sqlfiles.named("postgres", "demo", "queries.sql")

        assert queries["count_jobs"] == "SELECT count(*) FROM jobs"
        assert lookup("count_jobs") is lookup("count_jobs")  # one text per query: psycopg prepares by text
        with pytest.raises(KeyError, match="no query 'nope' in sql/postgres/demo/queries.sql"):
            queries["nope"]
        with pytest.raises(KeyError, match="no query 'nope' in sql/postgres/demo/queries.sql"):
            lookup("nope")
    finally:
        sqlfiles.queries.cache_clear()


def test_the_installed_sql_has_a_folder_per_backend_and_domain():
    assert sqlfiles.domains("postgres") == ["eventstore", "maintenance"]
    assert sqlfiles.domains("snowflake") == ["eventstore"]


def test_a_missing_domain_folder_is_an_error():
    with pytest.raises(sqlfiles.SqlFileError, match="sql/postgres/nope: no such folder"):
        sqlfiles.folder("postgres", "nope")
