"""The ``commands`` archive's columns: the event JSON made per handler in one decode and one
encode equals the event JSON made one event at a time, whatever the mix of events."""

from __future__ import annotations

import json

import msgspec
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from epochal.recovery.log_tables import _EventJson
from tests.unit.actors.workload import Deposit, Transfer, app

_EVENTS = st.one_of(
    st.builds(Deposit, st.integers(0, 39), st.integers(0, 2**40)).map(
        lambda e: ("deposit", msgspec.msgpack.encode(e))
    ),
    st.builds(Transfer, st.integers(0, 39), st.integers(0, 39), st.integers(-5, 99)).map(
        lambda e: ("transfer", msgspec.msgpack.encode(e))
    ),
    st.binary(max_size=12).map(lambda b: ("transfer", b)),  # bytes that may not decode
    st.just(("gone", b"\x80")),  # a handler the code no longer has
)


@given(st.lists(_EVENTS, max_size=30))
def test_event_json_in_batches_is_the_event_json_of_each(events: list[tuple[str, bytes]]) -> None:
    as_json = _EventJson(app)
    one_by_one = [as_json(handler, event) for handler, event in events]
    batched = as_json.many(events)
    assert pa.array(batched, pa.string()).to_pylist() == one_by_one
    for text in one_by_one:
        if text is not None:
            json.loads(text)
