from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from epochal.errors import SchemaError
from epochal.schemas.codec import decode, encode


class Transfer(msgspec.Struct, frozen=True):
    source: str
    target: str
    amount: int


transfers = st.builds(Transfer, st.text(), st.text(), st.integers(-(2**63), 2**63 - 1))


@given(transfers)
def test_msgpack_round_trip(transfer: Transfer) -> None:
    assert decode(encode(transfer), Transfer) == transfer


@given(transfers)
def test_json_is_accepted_too(transfer: Transfer) -> None:
    assert decode(b"  " + msgspec.json.encode(transfer), Transfer) == transfer


def test_wrong_schema_names_the_type_and_the_field() -> None:
    with pytest.raises(SchemaError) as raised:
        decode(b'{"source": "a", "target": "b", "amount": "ten"}', Transfer)
    assert "JSON Transfer" in str(raised.value)
    assert "amount" in str(raised.value)


def test_garbage_bytes_are_a_schema_error_not_a_crash() -> None:
    with pytest.raises(SchemaError, match="msgpack Transfer"):
        decode(b"\xc1\xff\x00", Transfer)


class Refund(msgspec.Struct, frozen=True, tag=True):
    amount: int


class Charge(msgspec.Struct, frozen=True, tag=True):
    amount: int


def test_a_union_that_does_not_decode_is_a_schema_error_too() -> None:
    with pytest.raises(SchemaError, match="not a valid msgpack"):
        decode(b"\xc1", Refund | Charge)  # type: ignore[arg-type]
    assert decode(b'{"type": "Charge", "amount": 3}', Refund | Charge) == Charge(3)  # type: ignore[arg-type]
