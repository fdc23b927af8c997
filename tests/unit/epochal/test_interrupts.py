"""A SIGTERM or Ctrl-C inside ``interrupts_held`` acts when the block ends, as it would have."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from epochal.interrupts import interrupts_held


class _Ended(Exception):
    """What the test's SIGTERM handler raises (as ``epochal demo``'s raises SystemExit)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _ending(signum: int, frame: FrameType | None) -> None:
    raise _Ended(signum)


@pytest.fixture
def sigterm_ends() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, _ending)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_a_sigterm_in_the_block_lets_it_finish_then_raises_from_the_handler_before(
    sigterm_ends: None,
) -> None:
    done = []
    with pytest.raises(_Ended) as ended, interrupts_held():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # twice: it acts once
        done.append("the rest of the block")
    assert done == ["the rest of the block"]
    assert ended.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is _ending
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_in_the_block_is_a_keyboard_interrupt_when_it_ends(sigterm_ends: None) -> None:
    done = []
    with pytest.raises(KeyboardInterrupt), interrupts_held():
        os.kill(os.getpid(), signal.SIGINT)
        done.append("the rest of the block")
    assert done == ["the rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_block_without_a_signal_changes_nothing(sigterm_ends: None) -> None:
    with interrupts_held():
        assert signal.getsignal(signal.SIGTERM) is not _ending  # held meanwhile
    assert signal.getsignal(signal.SIGTERM) is _ending
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
