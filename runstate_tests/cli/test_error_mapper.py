"""The one error mapper of the `runstate` command: domain errors are one line and exit 1."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from runstate.cli import RunstateGroup
from runstate.eventstore import EventStoreError, InvalidEvent
from runstate.maintenance import InvalidIdentifier, MaintenanceError
from runstate.services.state import ServiceError
from runstate.wal import WalError


def _group_raising(error: BaseException) -> click.Group:
    @click.group(cls=RunstateGroup)
    def group() -> None:
        pass

    @group.command()
    def verb() -> None:
        raise error

    return group


@pytest.mark.parametrize(
    "error",
    [
        EventStoreError("run 'r1': store unreachable\n  detail line"),
        InvalidEvent("run_id", "must not be empty"),
        WalError("dataset 'orders': blob missing"),
        InvalidIdentifier("bad identifier 'a;b'"),
        ServiceError("moto does not answer"),
    ],
)
def test_domain_error_is_one_line_and_exit_1(error: BaseException) -> None:
    result = CliRunner().invoke(_group_raising(error), ["verb"])

    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert "Traceback" not in result.output


def test_every_maintenance_error_shares_the_root() -> None:
    assert issubclass(InvalidIdentifier, MaintenanceError)
    assert issubclass(InvalidIdentifier, ValueError)


def test_other_errors_are_not_hidden() -> None:
    result = CliRunner().invoke(_group_raising(KeyError("bug")), ["verb"])

    assert result.exit_code == 1
    assert isinstance(result.exception, KeyError)
