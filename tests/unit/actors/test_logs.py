"""How a cluster's processes log: text with the level, or one JSON object a line."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

from epochal.actors.lifecycle import JsonLines

_PROGRAM = """
import logging
from epochal.actors.lifecycle import child_logging, set_title
set_title("epochal: worker 1 of shop (generation 2)")
child_logging()
log = logging.getLogger("epochal.actors.worker")
log.info("ready app=%s", "shop")
try:
    1 / 0
except ZeroDivisionError:
    log.exception("it failed: ünïcode")
"""


def _run(log_format: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "EPOCHAL_LOG_FORMAT"}
    if log_format is not None:
        env["EPOCHAL_LOG_FORMAT"] = log_format
    done = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    return done.stderr.splitlines()


def test_json_lines_are_one_object_a_record_with_the_traceback() -> None:
    lines = _run("json")
    entries = [json.loads(line) for line in lines]
    assert len(entries) == 2
    first, second = entries
    assert first["level"] == "INFO" and first["logger"] == "epochal.actors.worker"
    assert first["message"] == "ready app=shop"
    assert first["process"] == "epochal: worker 1 of shop (generation 2)"
    assert first["time"].endswith("+00:00") and first["pid"] > 0
    assert second["message"] == "it failed: ünïcode" and "ZeroDivisionError" in second["exception"]


def test_text_is_the_default_with_time_level_and_logger() -> None:
    lines = _run(None)
    assert lines[0].split(" ", 2)[2] == "INFO epochal.actors.worker ready app=shop"
    assert "ERROR epochal.actors.worker it failed" in lines[1]
    assert any("ZeroDivisionError" in line for line in lines[2:])


def test_the_formatter_alone() -> None:
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "a=%d", (1,), None)
    entry = json.loads(JsonLines().format(record))
    assert (entry["level"], entry["logger"], entry["message"]) == ("WARNING", "x", "a=1")
