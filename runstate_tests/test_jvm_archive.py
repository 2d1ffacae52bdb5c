"""The suite's class archive for its Spark drivers (runstate_tests/support/jvm_archive.py): the drivers of
this checkout map Spark's classes from it, and a JVM without it runs as before, saying nothing."""

from __future__ import annotations

import os
import subprocess

import pytest

from runstate_tests.support.devserver import poll
from runstate_tests.support.jvm_archive import (
    SILENT,
    archive_path,
    java_binary,
    sharing_options,
    spark_jars_dir,
)

pytestmark = pytest.mark.skipif(java_binary() is None, reason="no java")


def _spark_submit_version(options: str) -> str:
    """What `SparkSubmit --version` prints, started on the class path spark-submit gives its drivers."""
    command = [str(java_binary()), "-cp", f"{spark_jars_dir()}/*", *options.split()]
    command += ["-Xlog:class+load=info", "org.apache.spark.deploy.SparkSubmit", "--version"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120).stdout


def test_the_suites_drivers_load_spark_and_scala_from_the_archive():
    archive = archive_path(java_binary())
    # The controller builds it in the background when the suite starts (a first run on a machine).
    poll(archive.exists, timeout=300, every=2, what=f"the class archive {archive}")
    assert sharing_options(archive) in os.environ["SPARK_SUBMIT_OPTS"]

    loaded = _spark_submit_version(sharing_options(archive))

    assert "org.apache.spark.deploy.SparkSubmit source: shared objects file (top)" in loaded
    assert "scala.Predef$ source: shared objects file (top)" in loaded


def test_a_jvm_whose_archive_is_missing_runs_without_it_and_says_nothing(tmp_path):
    loaded = _spark_submit_version(sharing_options(tmp_path / "missing.jsa"))

    assert (
        "org.apache.spark.deploy.SparkSubmit source: jar:" in loaded or "SparkSubmit source: file:" in loaded
    )
    assert "cds" not in loaded.replace(SILENT, "")


def test_an_archive_of_another_class_path_is_not_used_and_says_nothing(tmp_path):
    launcher = next(spark_jars_dir().glob("spark-launcher_*.jar"))
    other = tmp_path / launcher.name
    other.write_bytes(launcher.read_bytes())
    archive = tmp_path / "other.jsa"
    dump = [str(java_binary()), f"-XX:ArchiveClassesAtExit={archive}", "-cp", str(other)]
    subprocess.run([*dump, "org.apache.spark.launcher.Main"], capture_output=True, timeout=120)

    loud = _spark_submit_version(f"-XX:SharedArchiveFile={archive}")
    quiet = _spark_submit_version(sharing_options(archive))

    assert "[warning][cds" in loud  # the JVM saw the mismatch...
    assert "[warning]" not in quiet and "shared objects file (top)" not in quiet  # ...and said nothing here
    assert "org.apache.spark.deploy.SparkSubmit source: file:" in quiet
