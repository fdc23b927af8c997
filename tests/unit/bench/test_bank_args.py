"""``epochal bench bank``'s flags: what the bank example cannot run is refused, not folded."""

from __future__ import annotations

import pytest

from bench import bank
from examples.bank.producer import events


@pytest.mark.parametrize("accounts", [1, 10_001, 100_000])
def test_more_accounts_than_the_example_has_keys_for_is_a_usage_error(
    accounts: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        bank.main(["--accounts", str(accounts), "--transfers", "10"])
    assert exited.value.code == 2
    assert "--accounts takes 2 to 10,000" in capsys.readouterr().err


def test_the_largest_accepted_count_draws_that_many_distinct_accounts() -> None:
    """The bound is the key space: at it, every account is its own key (above it, two
    accounts would share one, which is why it is refused)."""
    deposits = list(events(0, bank.MAX_ACCOUNTS, seed=1))
    assert len({d.account for d in deposits}) == bank.MAX_ACCOUNTS  # type: ignore[union-attr]
