"""A worker refuses an epoch that does not follow the last one: two sequencers wrote the log."""

from __future__ import annotations

import pytest

from epochal.actors.worker import _follows
from epochal.errors import LogError
from epochal.log.command_log import LoggedEpoch
from epochal.schemas.commands import EpochRecord


def _logged(epoch: int, position: int) -> LoggedEpoch:
    return LoggedEpoch(position, EpochRecord(epoch, 0, 0, "code"))


def test_epochs_in_sequence_are_taken_and_any_other_is_refused() -> None:
    expected = 0
    for position, epoch in enumerate([0, 1, 2]):
        expected = _follows(_logged(epoch, position), expected)
    assert expected == 3
    for wrong in (2, 4, 0):  # a repeat, a gap, a restart at zero
        with pytest.raises(LogError) as refused:
            _follows(_logged(wrong, 17), expected)
        assert refused.value.context == {"epoch": wrong, "expected": 3, "offset": 17}
