"""``Codec.decode_checked``: bytes a schema checked already decode to the same value, without
the constraints of its fields checked again."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from epochal.schemas.canonical import codec_for

Name = Annotated[str, msgspec.Meta(pattern=r"^[a-z]+$", max_length=8)]
Count = Annotated[int, msgspec.Meta(ge=0)]


class Order(msgspec.Struct, frozen=True, tag=True):
    who: Name
    count: Count
    price: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    notes: list[Name] = msgspec.field(default_factory=list)  # nested: checked as before
    ref: Count | None = None


class Renamed(msgspec.Struct, rename="camel", omit_defaults=True, tag="r", tag_field="kind"):
    first_name: Name
    item_count: Count = 0


class Row(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    who: Name
    count: Count


class Single(msgspec.Struct):
    only: Name


class Posted(msgspec.Struct):
    who: Name

    def __post_init__(self) -> None:
        pass


class KeywordOnly(msgspec.Struct, kw_only=True):
    who: Name


names = st.from_regex(r"[a-z]{1,8}", fullmatch=True)
counts = st.integers(0, 2**63 - 1)
values = st.one_of(
    st.builds(
        Order, names, counts, st.floats(0.5, 1e9), st.lists(names, max_size=3), st.none() | counts
    ),
    st.builds(Renamed, names, counts),
    st.builds(Row, names, counts),
    st.builds(Single, names),
    st.builds(Posted, names),
    st.builds(KeywordOnly, who=names),
)


@given(values)
def test_checked_bytes_decode_to_the_value_the_checking_decoder_gives(value: Any) -> None:
    codec = codec_for(type(value))
    data, canonical = codec.canonical(value)
    decoded = codec.decode_checked(data)
    assert type(decoded) is type(value)
    assert decoded == canonical == codec.decode(data)
    assert msgspec.msgpack.encode(decoded) == data


@pytest.mark.parametrize("schema", [Order, Renamed, Row, Single])
def test_only_the_constraints_of_the_fields_are_skipped(schema: Any) -> None:
    codec = codec_for(schema)
    fields = msgspec.structs.fields(schema)
    bad = schema(
        *[
            "Not A Name" if f.name in ("who", "first_name", "only") else -1
            for f in fields
            if f.required
        ]
    )
    data = msgspec.msgpack.encode(bad)
    with pytest.raises(msgspec.ValidationError):
        codec.decode(data)
    assert codec.decode_checked(data) == bad
    with pytest.raises(msgspec.ValidationError):  # a wrong type is still no value
        codec.decode_checked(msgspec.msgpack.encode(schema(*[1.5 for f in fields if f.required])))


@pytest.mark.parametrize("schema", [Posted, KeywordOnly])
def test_types_not_rebuilt_simply_are_checked_as_before(schema: Any) -> None:
    codec = codec_for(schema)
    data = msgspec.msgpack.encode({"who": "Not A Name"})
    with pytest.raises(msgspec.ValidationError):
        codec.decode_checked(data)
