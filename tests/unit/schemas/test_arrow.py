"""Actor state as Arrow tables: typed columns from the msgspec schema, JSON where Arrow has no
faithful type, and ``_state`` keeping the exact canonical bytes."""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec
import pyarrow as pa
import pytest

from epochal.actors.windows import CountWindow
from epochal.schemas.arrow import RowLayout
from epochal.schemas.canonical import decode_canonical, encode_canonical


class Color(enum.Enum):
    RED = "red"


class Inner(msgspec.Struct):
    a: int = 0


class Wide(msgspec.Struct):
    n: int = 0
    f: float = 0.0
    b: bytes = b""
    maybe: int | None = None
    tags: list[str] = []
    seen: set[int] = set()
    scores: dict[str, int] = {}
    by_id: dict[int, Inner] = {}
    inner: Inner = msgspec.field(default_factory=Inner)
    anything: Any = None
    pair: tuple[int, str] = (0, "")
    mode: Literal["x", "y"] = "x"
    color: Color = Color.RED
    window: CountWindow[int] = msgspec.field(default_factory=lambda: CountWindow(3))


def test_columns_are_typed_from_the_schema_and_json_where_arrow_has_no_type() -> None:
    layout = RowLayout.of(Wide, str)
    schema = layout.state_schema()
    assert schema.field("_key").type == pa.string() and schema.field("_state").type == pa.binary()
    assert schema.field("n").type == pa.int64() and schema.field("f").type == pa.float64()
    assert schema.field("b").type == pa.binary() and schema.field("maybe").type == pa.int64()
    assert schema.field("tags").type == pa.list_(pa.string())
    assert schema.field("seen").type == pa.list_(pa.int64())
    assert schema.field("scores").type == pa.map_(pa.string(), pa.int64())
    assert schema.field("by_id").type == pa.map_(pa.int64(), pa.struct([("a", pa.int64())]))
    assert schema.field("mode").type == pa.string() and schema.field("color").type == pa.string()
    assert pa.types.is_struct(schema.field("window").type)
    assert layout.json_fields == {"anything", "pair"}
    assert RowLayout.of(Inner, int).key_arrow_type == pa.int64()


def test_rows_carry_typed_values_and_the_exact_canonical_bytes() -> None:
    value = Wide(1, 2.5, b"\x00\xff", None, ["t"], {3}, {"s": 4}, {5: Inner(6)}, Inner(7),
                 {"z": [1]}, (8, "p"), "y")  # fmt: skip
    data = encode_canonical(value)
    (row,) = RowLayout.of(Wide, str).state_table([("k", data)]).to_pylist()
    assert row["_key"] == "k" and row["_state"] == data
    assert (row["n"], row["f"], row["b"], row["maybe"]) == (1, 2.5, b"\x00\xff", None)
    assert row["tags"] == ["t"] and row["seen"] == [3] and row["scores"] == [("s", 4)]
    assert row["by_id"] == [(5, {"a": 6})] and row["inner"] == {"a": 7}
    assert row["anything"] == '{"z":[1]}' and row["pair"] == '[8,"p"]'
    assert row["mode"] == "y" and row["color"] == "red"
    assert row["window"] == {"size": 3, "slide": 1, "items": [], "since_slide": 0}


def test_change_rows_mark_deletions_with_null_values() -> None:
    table = RowLayout.of(Inner, int).change_table(7, 7, [1, 2], [None, encode_canonical(Inner(9))])
    assert table.to_pylist() == [
        {"_ssid": 7, "_epoch": 7, "_key": 1, "_deleted": True, "_state": None, "a": None},
        {"_ssid": 7, "_epoch": 7, "_key": 2, "_deleted": False,
         "_state": encode_canonical(Inner(9)), "a": 9},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("actors", "deleted_every"), [(0, 0), (15, 0), (16, 0), (65_535, 0), (65_536, 0), (40, 7)]
)
def test_the_columns_of_many_values_are_each_value_decoded_on_its_own(
    actors: int, deleted_every: int
) -> None:
    """A part's values are decoded as one msgpack array, whatever their count (at and around
    the counts where msgpack's header forms change), deletions anywhere."""
    states = [None if deleted_every and i % deleted_every == 3 else encode_canonical(Inner(i))
              for i in range(actors)]  # fmt: skip
    table = RowLayout.of(Inner, int).change_table(4, 4, list(range(actors)), states)
    assert table.column("a").to_pylist() == [
        None if s is None else decode_canonical(s, Inner).a for s in states
    ]
    assert table.column("_deleted").to_pylist() == [s is None for s in states]
