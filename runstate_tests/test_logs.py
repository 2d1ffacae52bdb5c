"""The CLI's structured logs: one JSON object per line, with the fields passed as `extra`."""

from __future__ import annotations

import json
import logging

import pytest

from runstate import logs


@pytest.fixture(autouse=True)
def restore_runstate_logger():
    logger = logging.getLogger("runstate")
    handlers, level = logger.handlers[:], logger.level
    yield
    logger.handlers[:], logger.level = handlers, level


def test_json_lines_carry_the_message_level_logger_and_extra_fields(capsys):
    logs.configure("INFO", "json")

    logging.getLogger("runstate.eventstore.snapshots").warning(
        "snapshot %s corrupt", 7, extra={"run_id": "r1", "seq": 7}
    )

    entry = json.loads(capsys.readouterr().err.strip())
    assert entry["message"] == "snapshot 7 corrupt"
    assert (entry["level"], entry["logger"]) == ("warning", "runstate.eventstore.snapshots")
    assert (entry["run_id"], entry["seq"]) == ("r1", 7)


def test_the_level_filters_lower_records(capsys):
    logs.configure("ERROR", "text")

    logging.getLogger("runstate.wal").warning("not shown")

    assert capsys.readouterr().err == ""
