"""Hostile submits (issue 15 #6, #7 and a property test): every input is either accepted and reads
back from `status`, or refused with one `MaintenanceError` line and nothing written."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from runstate.cli import main
from runstate.config import settings
from runstate.maintenance.errors import MaintenanceError
from runstate.maintenance.identifiers import ACTIONS
from runstate.maintenance.models import CachedTable
from runstate.maintenance.options import ActionSettings
from runstate.maintenance.store import MaintenanceStore


@pytest.fixture
def cli_store(pg_database: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RUNSTATE_PG_URL", pg_database)
    monkeypatch.setenv("RUNSTATE_SCHEMA", pg_schema)
    settings.cache_clear()
    with MaintenanceStore(pg_database, schema=pg_schema) as store:
        store.ensure_schema()
        store.cache.replace_table_cache([CachedTable("db", "orders", True, {})])
        yield store
    settings.cache_clear()


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _refused_in_one_line(result: Result, fragment: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output and fragment in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize(
    "options, fragment",
    [
        (["rewrite_strategy=sort", "sort_order=123"], "sort_order must be text"),  # was AttributeError
        (["rewrite_strategy=sort", "sort_order=[1, 2]"], "sort_order must be text"),
        (["retain_last=99999999999999999999999"], "retain_last must be an integer from 1 to"),
        (["target_file_size_bytes=1e400"], "target_file_size_bytes must be an integer"),
        (["expire_older_than_hours=1e300"], "expire_older_than_hours must be from 0 to"),
        (["rewrite_strategy=sort", "sort_order=\u212aelvin"], "sort_order term"),  # the Kelvin sign
        (["rewrite_strategy=sort", "sort_order=id DESC NULL\u017f LAST"], "sort_order term"),  # long s
        (["rewrite_strategy=sort", "sort_order=\u0130d"], "sort_order term"),  # dotted capital I
        (['rewrite_strategy=["sort"]'], "rewrite_strategy"),
        (["=1"], "is not KEY=VALUE"),
        (["retain_last=" + "[" * 5000 + "]" * 5000], "is not KEY=VALUE (at most 1000"),
        (["retain_last=" + "[" * 490 + "]" * 490], "retain_last must be an integer"),
    ],
)
def test_bad_options_are_one_line_errors_and_write_nothing(cli_store, options, fragment):
    args = [arg for option in options for arg in ("-o", option)]

    result = run("maintenance", "submit", "db.orders", *args)

    _refused_in_one_line(result, fragment)
    assert cli_store.queue.list_jobs() == []


def test_sort_options_in_ascii_are_accepted(cli_store):
    result = run(
        "maintenance",
        "submit",
        "db.orders",
        "-o",
        "rewrite_strategy=sort",
        "-o",
        "sort_order=id desc nulls last, v",
    )

    assert result.exit_code == 0, result.output
    job = cli_store.queue.get_job(result.output.strip())
    assert job.options == {"rewrite_strategy": "sort", "sort_order": "id desc nulls last, v"}


identifier_like = st.one_of(
    st.sampled_from(["orders", "db", "Orders", "_x", "a" * 128, "a" * 129, "1db", "d\u212a", "or ders"]),
    st.text(min_size=0, max_size=12),
)
option_values = st.one_of(
    st.integers(min_value=-2, max_value=2**70),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.text(max_size=20),
    st.sampled_from(["binpack", "sort", "id DESC", "id; DROP TABLE jobs"]),
)


@hsettings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    database=identifier_like,
    table=identifier_like,
    actions=st.lists(st.one_of(st.sampled_from(ACTIONS), st.text(max_size=10)), max_size=3),
    options=st.dictionaries(st.sampled_from([*ActionSettings.names(), "bogus"]), option_values, max_size=3),
    dry_run=st.booleans(),
)
def test_submit_either_reads_back_or_refuses_with_a_maintenance_error(
    cli_store, database, table, actions, options, dry_run
):
    cli_store.cache.replace_table_cache(
        [
            CachedTable("db", "orders", True, {}),
            *(
                [CachedTable(database, table, True, {})]
                if _plain(database, table) and table != "orders"
                else []
            ),
        ]
    )
    jobs_before = len(cli_store.queue.list_jobs(limit=10_000, include_deleted=True))
    try:
        ActionSettings.from_options(options)
        job_id = cli_store.submit(database, table, actions, dry_run=dry_run, options=options)
    except MaintenanceError as error:
        assert "\n" not in str(error)
        assert len(cli_store.queue.list_jobs(limit=10_000, include_deleted=True)) == jobs_before
        return
    shown = run("maintenance", "status", job_id, "--json")
    assert shown.exit_code == 0, shown.output
    job = json.loads(shown.output)["job"]
    assert (job["database"], job["table"], job["dry_run"]) == (database, table, dry_run)
    assert job["options"] == json.loads(json.dumps(options))
    assert set(job["actions"]) == set(actions)
    cli_store.cancel(job_id)  # the next example may submit for the same table


def _plain(database: str, table: str) -> bool:
    from runstate.maintenance.errors import InvalidIdentifier
    from runstate.maintenance.identifiers import TableRef

    try:
        TableRef(database, table)
    except InvalidIdentifier:
        return False
    return True


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["maintenance", "status", "x" * 70], "not found"),
        (["maintenance", "cancel", "nul\x00id"], "not found"),
        (["maintenance", "status", "--table", "db.\u212a"], "not a valid identifier"),
        (["health", "--cached", "db.orders;"], "not a valid identifier"),
    ],
)
def test_status_cancel_and_health_refuse_bad_input_in_one_line(cli_store, args, fragment):
    _refused_in_one_line(run(*args), fragment)
