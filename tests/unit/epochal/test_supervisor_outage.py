"""The supervisor's own Kafka work (finishing a layout before a rebalance) waits out a broker
that does not answer, with one line each way, instead of ending the run."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from epochal.errors import BrokerUnavailableError, LogError
from epochal.metrics import Metrics
from epochal.supervisor import Supervisor


class _Stop:
    def __init__(self, after: int = 1_000) -> None:
        self.calls, self.after = 0, after

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls > self.after


def _supervisor() -> SimpleNamespace:
    return SimpleNamespace(metrics=Metrics(app="shop", role="supervisor"))


def test_work_is_repeated_until_the_broker_answers(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("epochal.supervisor.time.sleep", lambda s: None)
    failures = [BrokerUnavailableError("cannot read watermarks: Kafka is not reachable")] * 3
    done: list[bool] = []

    def work() -> None:
        if failures:
            raise failures.pop()
        done.append(True)

    supervisor = _supervisor()
    with caplog.at_level(logging.WARNING, logger="epochal.supervisor"):
        assert Supervisor._waiting_out_the_broker(supervisor, work, _Stop()) is True  # type: ignore[arg-type]
    assert done == [True]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "unreachable" in lines[0] and "reachable again" in lines[1]
    assert 'epochal_broker_available{app="shop",role="supervisor"} 1.0' in (
        supervisor.metrics.render()
    )


def test_a_stop_ends_the_wait_and_other_errors_are_not_waited_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("epochal.supervisor.time.sleep", lambda s: None)

    def unavailable() -> None:
        raise BrokerUnavailableError("Kafka is not reachable")

    supervisor = _supervisor()
    assert Supervisor._waiting_out_the_broker(supervisor, unavailable, _Stop(after=5)) is False  # type: ignore[arg-type]

    def broken() -> None:
        raise LogError("topic authorization failed")

    with pytest.raises(LogError, match="authorization"):
        Supervisor._waiting_out_the_broker(supervisor, broken, _Stop())  # type: ignore[arg-type]
