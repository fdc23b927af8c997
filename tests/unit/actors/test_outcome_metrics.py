"""An epoch's outcomes counted once per series equal the outcomes counted one by one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from epochal.actors.outcome import AbortKind, TxnOutcome
from epochal.actors.outcome_metrics import count_outcomes
from epochal.metrics import Metrics

ABORTS = [  # (reason, kind, raised); a committed transaction has none
    ("", None, ""),
    ("constraint 'x' violated by A['a']", AbortKind.CONSTRAINT, ""),
    ("ValueError: no", AbortKind.RAISED, "ValueError"),
    ("undeclared key A[1]: d", AbortKind.UNDECLARED_KEY, ""),
]
outcomes = st.lists(
    st.tuples(st.sampled_from(["deposit", "transfer"]), st.sampled_from(ABORTS)), max_size=30
)


@given(st.lists(outcomes, max_size=4))
def test_counting_per_epoch_equals_counting_each_transaction(
    epochs: list[list[tuple[str, tuple[str, AbortKind | None, str]]]],
) -> None:
    batched, single = Metrics(), Metrics()
    for epoch, spec in enumerate(epochs):
        done = [
            TxnOutcome(epoch, seq, h, not r, r, abort=kind, raised=raised)
            for seq, (h, (r, kind, raised)) in enumerate(spec)
        ]
        count_outcomes(batched, done)
        for outcome in done:  # the reference: one series update per transaction
            kind = "committed" if outcome.committed else "aborted"
            single.inc("epochal_transactions_total", outcome=kind)
            if not outcome.committed:
                single.inc("epochal_aborts_total", handler=outcome.handler,
                           reason=outcome.abort_label)  # fmt: skip
    assert _epochal(batched.render()) == _epochal(single.render())


def _epochal(text: str) -> list[str]:
    """The lines of epochal's own metrics (the process's CPU and memory differ by the call)."""
    return [line for line in text.splitlines() if "process_" not in line]
