"""docker/: no engine runs here, so check that compose, Dockerfile and workspace agree with the package."""

from __future__ import annotations

import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import dagster as dg
import pytest
import yaml

from runstate.config import Settings
from runstate.services import moto
from runstate.services.state import LOOPBACK, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
VENV_BIN = Path(sys.executable).parent
EXPECTED_SERVICES = {"postgres", "webserver", "daemon", "user-code", "moto", "fakesnow"}
# Read by libraries rather than by runstate itself.
THIRD_PARTY_VARS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "DAGSTER_HOME", "DAGSTER_TELEMETRY_ENABLED"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return (DOCKER / "Dockerfile").read_text()


def _command(compose: dict, service: str) -> list[str]:
    command = compose["services"][service]["command"]
    return command if isinstance(command, list) else shlex.split(command)


def _flag(command: list[str], *names: str) -> str:
    for index, part in enumerate(command):
        if part in names:
            return command[index + 1]
    raise AssertionError(f"{names} not in {command}")


def _runstate_env(compose: dict) -> dict[str, str]:
    return {k: str(v) for k, v in compose["services"]["user-code"]["environment"].items()}


def _source_text() -> str:
    return "\n".join(path.read_text() for path in (ROOT / "runstate").rglob("*.py"))


def test_compose_has_every_service_of_the_embedded_set_up(compose):
    assert EXPECTED_SERVICES <= set(compose["services"])


def test_images_are_pinned_and_the_runstate_image_is_built_from_the_dockerfile(compose):
    for name, service in compose["services"].items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest") or "build" in service, f"{name}: pin {image}"
        if "build" in service:
            context = (DOCKER / service["build"]["context"]).resolve()
            assert context == ROOT
            assert (context / service["build"]["dockerfile"]).exists()
    assert compose["services"]["postgres"]["image"].startswith("postgres:")


def test_dockerfile_installs_python_java_17_jdbc_and_the_locked_package(dockerfile):
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert "openjdk-17-jre-headless" in dockerfile and "libpostgresql-jdbc-java" in dockerfile
    assert "-c requirements.lock" in dockerfile


def test_every_file_the_dockerfile_copies_exists(dockerfile):
    for line in re.findall(r"^COPY (?!--from=)(.+)$", dockerfile, re.M):
        *sources, _destination = line.split()
        for source in sources:
            assert (ROOT / source).exists(), f"Dockerfile copies {source}, which is not in the repository"


def test_the_image_installs_the_wheel_built_from_the_package_and_its_sql_not_a_checkout(dockerfile):
    assert re.search(r"^RUN pip wheel --no-deps --wheel-dir /wheels \.$", dockerfile, re.M)
    assert "COPY pyproject.toml setup.py README.md ./" in dockerfile
    assert re.search(r"^COPY sql \./sql$", dockerfile, re.M)
    assert re.search(r"^RUN pip install --no-deps /wheels/runstate-\*\.whl", dockerfile, re.M)
    assert " -e " not in dockerfile and "-e ." not in dockerfile


def test_every_file_compose_mounts_exists(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name} mounts {source}, which is missing"


def test_the_user_code_server_serves_the_definitions_module(compose):
    command = _command(compose, "user-code")
    assert command[:3] == ["dagster", "api", "grpc"]

    module = importlib.import_module(_flag(command, "-m", "--module-name"))

    assert isinstance(module.defs, dg.Definitions)


def test_webserver_and_daemon_reach_the_user_code_server_through_the_workspace(compose, dockerfile):
    workspace = yaml.safe_load((DOCKER / "workspace.yaml").read_text())
    server = workspace["load_from"][0]["grpc_server"]
    user_code = _command(compose, "user-code")

    assert server["host"] == "user-code"
    assert str(server["port"]) == _flag(user_code, "-p", "--port")
    for service in ("webserver", "daemon"):
        path = _flag(_command(compose, service), "-w", "--workspace")
        assert path == "/opt/dagster/home/workspace.yaml"
    assert "docker/workspace.yaml /opt/dagster/home/" in dockerfile
    assert "DAGSTER_HOME=/opt/dagster/home" in dockerfile


def test_every_command_names_an_executable_the_package_installs(compose):
    for name, service in compose["services"].items():
        if "build" in service:
            executable = _command(compose, name)[0]
            assert (VENV_BIN / executable).exists(), f"{name}: `{executable}` is not installed with runstate"


def test_every_runstate_variable_compose_sets_is_read_by_the_package(compose):
    source = _source_text()
    for name, service in compose["services"].items():
        for variable in service.get("environment") or {}:
            if name == "postgres":
                continue  # the official image's own variables
            assert (
                variable in THIRD_PARTY_VARS
                or f'"{variable}' in source
                or f"'{variable}" in source
                or variable.startswith("SNOWFLAKE_")
            ), f"{name}: {variable} is read by nothing in runstate/"


def test_settings_from_the_compose_environment_point_at_the_compose_services(compose):
    env = _runstate_env(compose)
    settings = Settings.from_env(env)
    moto_port = _flag(_command(compose, "moto"), "-p", "--port")
    fakesnow_port = _flag(_command(compose, "fakesnow"), "-p", "--port")

    assert urlsplit(settings.pg_url).hostname == "postgres"
    assert settings.dagster_pg_url.startswith("postgresql+psycopg2://postgres:")
    assert urlsplit(settings.dagster_pg_url).path == "/dagster"
    assert "CREATE DATABASE dagster" in (DOCKER / "postgres-init.sql").read_text()
    assert (
        urlsplit(settings.pg_url).path.lstrip("/")
        == compose["services"]["postgres"]["environment"]["POSTGRES_DB"]
    )
    assert settings.aws_endpoint_url == f"http://moto:{moto_port}"
    assert settings.snowflake["host"] == "fakesnow" and settings.snowflake["port"] == fakesnow_port
    assert settings.snowflake["protocol"] == "http"


def test_the_instance_config_in_the_image_is_the_repositorys(dockerfile):
    assert re.search(r"^COPY dagster\.yaml .*/opt/dagster/home/$", dockerfile, re.M)


def test_moto_is_the_serialised_server_that_services_up_runs(compose):
    command = _command(compose, "moto")

    assert command[:3] == ["python", "-m", moto.SERVER_MODULE]
    assert command[3:] == ["-H", "0.0.0.0", "-p", _flag(command, "-p")]
    assert moto.moto_argv(5000)[1:3] == command[1:3]


def test_the_moto_command_serves_and_passes_its_healthcheck(compose):
    port = str(free_port())
    command = _command(compose, "moto")
    argv = [sys.executable, *command[1:]]
    argv[argv.index("-H") + 1], argv[argv.index("-p") + 1] = LOOPBACK, port
    healthcheck = compose["services"]["moto"]["healthcheck"]["test"]
    assert healthcheck[:2] == ["CMD", "python"]
    probe = [sys.executable, *(part.replace(":5000/", f":{port}/") for part in healthcheck[2:])]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(
            lambda: subprocess.run(probe, capture_output=True, timeout=30).returncode == 0,
            timeout=120,
            process=server,
            what="the compose moto command",
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
