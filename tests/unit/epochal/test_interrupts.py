"""A SIGTERM or Ctrl-C inside ``interrupts_held`` acts when the block ends, as it would have."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from epochal.interrupts import interrupts_held


class _Ended(Exception):
    """What the test's handlers raise (as ``epochal demo``'s raises SystemExit)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _ending(signum: int, frame: FrameType | None) -> None:
    raise _Ended(signum)


@pytest.fixture
def signals_end() -> Iterator[None]:
    """SIGTERM and SIGINT raise ``_Ended`` (whatever a test before, Spark say, installed)."""
    previous = {sig: signal.signal(sig, _ending) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_the_block_lets_it_finish_then_raises_from_the_handler_before(
    signals_end: None, signum: signal.Signals
) -> None:
    done = []
    with pytest.raises(_Ended) as ended, interrupts_held():
        os.kill(os.getpid(), signum)
        done.append("the rest of the block")
    assert done == ["the rest of the block"]
    assert ended.value.signum == signum
    assert signal.getsignal(signal.SIGTERM) is _ending
    assert signal.getsignal(signal.SIGINT) is _ending


def test_a_second_signal_of_a_kind_acts_at_once_and_the_first_of_another_waits(
    signals_end: None,
) -> None:
    """A start that hangs can still be ended: press Ctrl-C again."""
    done = []
    with pytest.raises(_Ended) as ended, interrupts_held():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)  # held too, and acts after the block
        done.append("after the first")
        os.kill(os.getpid(), signal.SIGINT)
        done.append("after the second")
    assert done == ["after the first"]  # the second SIGINT ended the block, then the held
    assert ended.value.signum == signal.SIGTERM  # SIGTERM acted as it ended
    assert isinstance(ended.value.__context__, _Ended)
    assert ended.value.__context__.signum == signal.SIGINT
    assert signal.getsignal(signal.SIGTERM) is _ending
    assert signal.getsignal(signal.SIGINT) is _ending


def test_a_block_without_a_signal_changes_nothing(signals_end: None) -> None:
    with interrupts_held():
        assert signal.getsignal(signal.SIGTERM) is not _ending  # held meanwhile
        assert signal.getsignal(signal.SIGINT) is not _ending
    assert signal.getsignal(signal.SIGTERM) is _ending
    assert signal.getsignal(signal.SIGINT) is _ending


def test_a_handler_the_block_installs_stays_and_takes_the_signal(signals_end: None) -> None:
    """Spark installs its own SIGINT handler as its session starts, inside the block."""
    taken = []
    with interrupts_held():
        os.kill(os.getpid(), signal.SIGINT)
        signal.signal(signal.SIGINT, lambda signum, frame: taken.append(signum))
    assert taken == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is not _ending
    assert signal.getsignal(signal.SIGTERM) is _ending
