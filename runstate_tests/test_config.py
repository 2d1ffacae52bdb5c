"""The environment knobs: every value is either used within its bounds or refused with one ConfigError line
naming the variable, never a traceback nor a silent stand-in (issue 25.11)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runstate.config import (
    APPLY_DELETES_AT_MAX,
    COPY_ON_WRITE_MAX_MB_MAX,
    DATASET_MERGE_INTERVAL_MAX_S,
    LINGER_MAX_S,
    MAINTENANCE_WORKERS_MAX,
    SPARK_SESSIONS_MAX,
    WAL_FLUSH_SHARDS_MAX,
    ConfigError,
    Settings,
)
from runstate.spark import SparkSettings, spark_config

# name -> (field, minimum, maximum)
WHOLE_NUMBER_KNOBS = {
    "RUNSTATE_WAL_FLUSH_SHARDS": ("wal_flush_shards", 1, WAL_FLUSH_SHARDS_MAX),
    "RUNSTATE_MAINTENANCE_WORKERS": ("maintenance_workers", 1, MAINTENANCE_WORKERS_MAX),
    "RUNSTATE_APPLY_DELETES_AT": ("apply_deletes_at", 0, APPLY_DELETES_AT_MAX),
    "RUNSTATE_COPY_ON_WRITE_MAX_MB": ("copy_on_write_max_mb", 0, COPY_ON_WRITE_MAX_MB_MAX),
    "RUNSTATE_DATASET_MERGE_INTERVAL_S": ("dataset_merge_interval_s", 5, DATASET_MERGE_INTERVAL_MAX_S),
    "RUNSTATE_SPARK_SESSIONS": ("spark_sessions", 1, SPARK_SESSIONS_MAX),
}
CHOICE_KNOBS = {
    "RUNSTATE_EVENTSTORE": ("eventstore", {"postgres", "snowflake"}),
    "RUNSTATE_ICEBERG_CATALOG": ("iceberg_catalog", {"jdbc", "hadoop"}),
}
REPORTED_BAD_VALUES = ["0", "-1", "abc", "nan", "99999999999999999999", "inf", "1.5", " 2", "²"]
# Text of every kind, plus the shapes a number knob is most likely to be given.
KNOB_TEXT = st.one_of(
    st.text(max_size=30),
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(REPORTED_BAD_VALUES),
)


def _settings_or_error(name: str, raw: str) -> Settings | ConfigError:
    try:
        return Settings.from_env({name: raw})
    except ConfigError as error:
        message = str(error)
        assert name in message and "\n" not in message, message
        return error


@pytest.mark.parametrize(
    "name, raw",
    [
        (name, raw)
        for name, (_, minimum, _) in WHOLE_NUMBER_KNOBS.items()
        for raw in REPORTED_BAD_VALUES
        if not (raw == "0" and minimum == 0)  # 0 is a value of such a knob (apply_deletes_at: off)
    ]
    + [("RUNSTATE_WAL_FLUSH_LINGER_S", raw) for raw in ("-1", "abc", "nan", "inf", "3601", "1e20")],
)
def test_the_reported_bad_values_are_refused_with_a_line_naming_the_knob(name, raw):
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: raw})


@given(name=st.sampled_from(sorted(WHOLE_NUMBER_KNOBS)), raw=KNOB_TEXT)
def test_a_whole_number_knob_is_used_within_its_bounds_or_refused(name, raw):
    field, minimum, maximum = WHOLE_NUMBER_KNOBS[name]

    outcome = _settings_or_error(name, raw)

    if isinstance(outcome, Settings):
        value = getattr(outcome, field)
        assert minimum <= value <= maximum
        assert raw == "" or value == int(raw)  # "" is unset: the default


@given(raw=KNOB_TEXT)
def test_the_linger_is_a_finite_number_of_seconds_within_bounds_or_refused(raw):
    outcome = _settings_or_error("RUNSTATE_WAL_FLUSH_LINGER_S", raw)

    if isinstance(outcome, Settings):
        assert math.isfinite(outcome.wal_flush_linger_s)
        assert 0 <= outcome.wal_flush_linger_s <= LINGER_MAX_S


@given(name=st.sampled_from(sorted(CHOICE_KNOBS)), raw=KNOB_TEXT)
def test_a_choice_knob_is_one_of_its_choices_or_refused(name, raw):
    field, choices = CHOICE_KNOBS[name]

    outcome = _settings_or_error(name, raw)

    if isinstance(outcome, Settings):
        assert getattr(outcome, field) in choices


@given(raw=KNOB_TEXT)
def test_the_spark_master_is_one_printable_word_or_refused(raw):
    outcome = _settings_or_error("RUNSTATE_SPARK_MASTER", raw)

    if isinstance(outcome, Settings):
        master = outcome.spark_master
        assert master and master.isprintable() and not any(ch.isspace() for ch in master)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)


@given(conf=st.one_of(JSON_VALUES, st.dictionaries(st.text(max_size=12), JSON_VALUES, max_size=4)))
def test_spark_conf_is_a_flat_object_of_scalars_spelt_as_spark_reads_them_or_refused(conf):
    outcome = _settings_or_error("RUNSTATE_SPARK_CONF", json.dumps(conf))

    if isinstance(outcome, Settings):
        assert isinstance(conf, dict) and "spark.master" not in conf
        for key, value in conf.items():
            expected = {True: "true", False: "false"}[value] if isinstance(value, bool) else str(value)
            assert outcome.spark_conf[key] == expected


@pytest.mark.parametrize(
    "conf, reason",
    [
        ('{"spark.executor.memory": null}', "got null"),
        ('{"spark.executor.extraJavaOptions": {"a": 1}}', "got an object"),
        ('{"spark.jars": ["a.jar", "b.jar"]}', "got an array"),
        ("null", "got null"),
        ('{"spark.executor.cores": NaN}', "not valid JSON"),
        ('{"spark.executor.cores": 1e999}', "finite number"),
        ("{", "not valid JSON"),
    ],
)
def test_spark_conf_values_without_a_spark_spelling_are_refused(conf, reason):
    with pytest.raises(ConfigError, match=reason):
        Settings.from_env({"RUNSTATE_SPARK_CONF": conf})


def test_spark_conf_booleans_are_spelt_as_spark_spells_them():
    settings = Settings.from_env({"RUNSTATE_SPARK_CONF": '{"spark.eventLog.enabled": true, "spark.x": 0.5}'})

    assert settings.spark_conf == {"spark.eventLog.enabled": "true", "spark.x": "0.5"}


def test_the_master_is_set_by_runstate_spark_master_alone():
    with pytest.raises(ConfigError, match="set RUNSTATE_SPARK_MASTER instead"):
        Settings.from_env(
            {"RUNSTATE_SPARK_MASTER": "local[1]", "RUNSTATE_SPARK_CONF": '{"spark.master": "local[4]"}'}
        )


def test_the_session_master_is_the_settings_master_whatever_the_extra_conf_says(tmp_path):
    spark = SparkSettings(master="local[1]", extra_conf={"spark.master": "local[4]"}, warehouse_dir=tmp_path)

    assert spark_config(spark)["spark.master"] == "local[1]"


ENDPOINT_URLS = st.one_of(
    KNOB_TEXT,
    st.builds(
        "{}://{}{}".format,
        st.sampled_from(["http", "https", "ftp", ""]),
        st.text(alphabet="ab-_.:[]1%@/ ", max_size=12),
        st.sampled_from(["", ":5000", ":0", ":99999", ":x", "/path"]),
    ),
)


@pytest.mark.parametrize(
    "raw",
    ["nope", "http://", "localhost:5000", "ftp://host", "http://bad_host", "http://h:99999", "http://a b"],
)
def test_a_bad_aws_endpoint_is_refused_with_a_line_naming_the_knob(raw):
    with pytest.raises(ConfigError, match="RUNSTATE_AWS_ENDPOINT_URL must be an http:// or https:// URL"):
        Settings.from_env({"RUNSTATE_AWS_ENDPOINT_URL": raw})


@given(raw=ENDPOINT_URLS)
def test_an_aws_endpoint_that_the_settings_take_makes_a_boto3_client(raw):
    import boto3

    outcome = _settings_or_error("RUNSTATE_AWS_ENDPOINT_URL", raw)

    if isinstance(outcome, Settings) and outcome.aws_endpoint_url is not None:
        # botocore checks the URL here, at the first client (`ValueError: Invalid endpoint` otherwise).
        boto3.client("s3", endpoint_url=outcome.aws_endpoint_url, region_name="us-east-1")


def test_unset_and_empty_knobs_take_the_defaults():
    names = [*WHOLE_NUMBER_KNOBS, *CHOICE_KNOBS, "RUNSTATE_WAL_FLUSH_LINGER_S", "RUNSTATE_SPARK_CONF"]

    settings = Settings.from_env(dict.fromkeys(names, ""))

    assert (settings.wal_flush_shards, settings.maintenance_workers, settings.wal_flush_linger_s) == (
        2,
        2,
        20.0,
    )
    assert (settings.eventstore, settings.iceberg_catalog, settings.spark_conf) == ("postgres", "jdbc", {})
