"""librdkafka's repeated lines are folded: a broker that is away makes every client log each
failed connection attempt."""

from __future__ import annotations

import logging

from epochal.log.client import FoldRepeats

REFUSED = "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused"


def _line(fac: str, client: str) -> logging.LogRecord:
    """A record as confluent-kafka makes it from a librdkafka log line."""
    return logging.LogRecord(
        "epochal.librdkafka", logging.ERROR, "", 0, "%s [%s] %s", (fac, client, REFUSED), None
    )


def test_one_line_per_facility_and_client_then_one_a_window_saying_how_many() -> None:
    now = [0.0]
    fold = FoldRepeats(window_s=60.0, clock=lambda: now[0])
    shown = []
    for step in range(1000):  # 100 attempts a second for 10 s, from two clients
        now[0] = step / 100
        for client in ("w0#producer-1", "w1#consumer-2"):
            record = _line("FAIL", client)
            if fold.filter(record):
                shown.append(record.getMessage())
    assert len(shown) == 2
    assert fold.filter(_line("SESSTMOUT", "w0#producer-1"))  # another facility: shown
    now[0] = 61.0
    later = _line("FAIL", "w0#producer-1")
    assert fold.filter(later)
    assert later.getMessage().endswith("(and 999 like it in 61 s)")


def test_other_lines_pass() -> None:
    fold = FoldRepeats()
    record = logging.LogRecord("x", logging.INFO, "", 0, "plain %s", ("line",), None)
    assert fold.filter(record) and fold.filter(record)
