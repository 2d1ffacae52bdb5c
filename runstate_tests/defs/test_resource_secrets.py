"""No secret of the deployment reaches the Dagster UI (issue 51.1): the code location, loaded as the webserver
loads it (a code server of workspace.yaml), answers the UI's GraphQL queries of its resources and of every
job's launchpad config with the names of the variables that hold the secrets, never their values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

from runstate.config import settings
from runstate.defs.resources import event_store_resource, maintenance_resource, spark_resource
from runstate.defs.spark import CATALOG_PASSWORD

WORKSPACE = Path(__file__).resolve().parents[2] / "workspace.yaml"
PASSWORD = "pw-51-s3cr3t"
PG_URL = f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/postgres"

RESOURCES = """
query ($selector: RepositorySelector!) {
  allTopLevelResourceDetailsOrError(repositorySelector: $selector) {
    __typename
    ... on ResourceDetailsList {
      results {
        name
        configFields { name defaultValueAsJson }
        configuredValues { key value type }
        nestedResources { name resource { name configuredValues { key value type } } }
      }
    }
  }
}
"""
JOBS = """
query ($selector: RepositorySelector!) {
  repositoryOrError(repositorySelector: $selector) { ... on Repository { jobs { name } } }
}
"""
LAUNCHPAD = """
query ($selector: PipelineSelector!) {
  runConfigSchemaOrError(selector: $selector) {
    __typename
    ... on RunConfigSchema {
      rootDefaultYaml
      allConfigTypes { key ... on CompositeConfigType { fields { name defaultValueAsJson } } }
    }
  }
}
"""


@pytest.fixture
def secret_pg_url(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RUNSTATE_PG_URL", PG_URL)
    settings.cache_clear()
    yield PG_URL
    settings.cache_clear()


def test_the_ui_shows_the_pg_url_s_variable_never_its_password(secret_pg_url, tmp_path, monkeypatch):
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # The repo's workspace.yaml, served from a folder without the checkout's `.env`: the code server loads
    # the `.env` of its working directory over the test's environment.
    monkeypatch.chdir(tmp_path)
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(WORKSPACE.read_text())
    with (
        dg.DagsterInstance.from_config(str(tmp_path)) as instance,
        define_out_of_process_context(str(workspace), None, instance) as context,
    ):
        selector = {"repositoryLocationName": "runstate", "repositoryName": "__repository__"}
        resources = _query(context, RESOURCES, {"selector": selector})
        jobs = _query(context, JOBS, {"selector": selector})["repositoryOrError"]["jobs"]
        launchpads = [
            _query(context, LAUNCHPAD, {"selector": {**selector, "pipelineName": job["name"]}})
            for job in jobs
        ]

    answers = json.dumps([resources, launchpads])
    details = resources["allTopLevelResourceDetailsOrError"]
    shown = {each["name"]: {v["key"]: v for v in each["configuredValues"]} for each in details["results"]}
    assert PASSWORD not in answers
    assert shown["event_store"]["pg_url"] == {"key": "pg_url", "value": "RUNSTATE_PG_URL", "type": "ENV_VAR"}
    assert shown["maintenance"]["dsn"]["type"] == "ENV_VAR"
    assert shown["spark"]["catalog_pg_url"]["value"] == "RUNSTATE_PG_URL"
    assert len(launchpads) == len(jobs) > 5
    assert all(each["runConfigSchemaOrError"]["__typename"] == "RunConfigSchema" for each in launchpads)


def test_the_resources_still_get_the_password_where_they_connect(secret_pg_url):
    """The secret is out of the config the UI shows, not out of the connections: the stores' DSN and the
    Spark session's config hold it."""
    spark = spark_resource()

    assert CATALOG_PASSWORD not in spark.spark_config
    assert spark.session_config()[CATALOG_PASSWORD] == PASSWORD
    assert event_store_resource().config().pg_url == PG_URL
    assert maintenance_resource().config().dsn == PG_URL


def test_a_pg_url_without_a_password_stays_visible(monkeypatch: pytest.MonkeyPatch):
    url = "postgresql://postgres@127.0.0.1:5432/postgres"
    monkeypatch.setenv("RUNSTATE_PG_URL", url)
    settings.cache_clear()
    try:
        resource, spark = event_store_resource(), spark_resource()
    finally:
        settings.cache_clear()

    assert not isinstance(resource.pg_url, dg.EnvVar) and resource.pg_url == url
    assert spark.catalog_pg_url is None


def _query(context: Any, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    result = execute_dagster_graphql(context, query, variables)
    assert not result.errors, result.errors
    return result.data
