"""The append-only log tables a snapshot adds rows to, beside its actors' changes.

- ``<app>/commands``: the command log archived, one row per transaction of every epoch since the
  previous snapshot, so history outlives Kafka retention (and the query issue's ``commands``
  view reads it): handler, the event as canonical bytes and as JSON, keys, where it came from,
  and its outcome. The interior transactions that ran have rows too, from the events their
  parents emitted (they are never logged). A cluster's workers each write the rows of the
  transactions they report, with their outcomes (:func:`reported_commands_table`). A recovery
  job that archives epochs apart from running them writes the rows without outcomes, and the
  committer joins the outcomes its tasks report onto them (:func:`with_outcomes`).
- ``<app>/outbox``: in weak mode, the egress and the dead letters of the epochs a snapshot
  covers. They are released only once the snapshot commits; a worker that finds a committed
  snapshot whose rows its partition had not yet released (a crash between the two) releases
  them from here.
"""

from __future__ import annotations

import array
import bisect
import itertools
import operator
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from epochal.actors.api import App
from epochal.actors.snapshots import Reported
from epochal.errors import RecoveryError
from epochal.schemas.canonical import encode_canonical
from epochal.schemas.codec import array_header
from epochal.schemas.commands import CommandTxn, EpochRecord, KeyRef, Origin
from epochal.schemas.snapshots import OutboxRow, Outcomes

__all__ = [
    "COMMANDS_DISTINCT",
    "COMMANDS_SCHEMA",
    "OUTBOX_SCHEMA",
    "ArchivedEpoch",
    "archived_epoch",
    "commands_table",
    "epochs_of",
    "interior_table",
    "outbox_table",
    "outcomes_of",
    "outcomes_table",
    "reported_commands_table",
    "with_outcomes",
]

COMMANDS_SCHEMA = pa.schema([
    pa.field("ssid", pa.int64(), nullable=False),
    pa.field("epoch", pa.int64(), nullable=False),
    pa.field("time", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("handler", pa.string(), nullable=False),
    pa.field("event_json", pa.string()),
    pa.field("keys", pa.list_(pa.string()), nullable=False),
    pa.field("origin", pa.string(), nullable=False),
    pa.field("source_topic", pa.string()),
    pa.field("source_partition", pa.int64()),
    pa.field("source_offset", pa.int64()),
    pa.field("request_id", pa.string()),
    pa.field("code_hash", pa.string(), nullable=False),
    pa.field("seed", pa.int64(), nullable=False),
    pa.field("txn", pa.binary()),
    pa.field("committed", pa.bool_()),
    pa.field("reason", pa.string()),
    pa.field("parent_epoch", pa.int64()),
    pa.field("parent_seq", pa.int64()),
])  # fmt: skip
"""``committed``/``reason`` (added later: null in rows archived before) are null only on the
``seq`` -1 row of an epoch without logged transactions; ``parent_epoch``/``parent_seq`` are the
timestamp of the transaction that emitted an interior one (null for logged ones)."""

COMMANDS_DISTINCT = frozenset({"seq", "event_json", "keys", "source_offset", "request_id", "txn"})
"""The ``commands`` columns whose values seldom repeat: their Parquet is not dictionary-encoded
(a dictionary built for a column of distinct values, then given up, was a sixth of writing a
part's rows, for no smaller file)."""

_OUTCOMES_SCHEMA = pa.schema([
    pa.field("epoch", pa.int64()),
    pa.field("seq", pa.int64()),
    pa.field("committed", pa.bool_()),
    pa.field("reason", pa.string()),
])  # fmt: skip

OUTBOX_SCHEMA = pa.schema([
    pa.field("_ssid", pa.int64(), nullable=False),
    pa.field("_epoch", pa.int64(), nullable=False),
    pa.field("_n", pa.int64(), nullable=False),
    pa.field("partition", pa.int64(), nullable=False),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("value", pa.binary(), nullable=False),
    pa.field("key", pa.binary()),
])  # fmt: skip
"""``key`` (added later: null in rows written before) is a dead letter's Kafka key."""


def _keys(keys: Sequence[KeyRef]) -> list[str]:
    """Each key as its text, ``Type:repr(key)`` (what the ``keys`` column holds)."""
    return [f"{key.actor_type}:{key.key!r}" for key in keys]


def commands_table(app: App, ssid: int, records: Sequence[EpochRecord]) -> pa.Table:
    """Rows of every transaction of ``records`` (the epochs snapshot ``ssid`` closes), their
    outcomes still null (:func:`with_outcomes`); an epoch without logged transactions gets one
    row with ``seq`` -1 and ``origin`` "" (interior transactions, which are never logged, may
    run in it: they have rows of their own, :func:`interior_table`). ``txn`` is the transaction
    as the log holds it (its event's canonical bytes included), so :func:`epochs_of` gives back
    the epochs for replay."""
    rows = [_Rows(r, r.txns) for r in records if r.txns]
    return _logged_rows(app, ssid, rows, [r for r in records if not r.txns], None)


class ArchivedEpoch(msgspec.Struct):
    """An epoch's msgpack as the log holds it, read for the archive: the fields its rows take,
    each transaction left as its bytes (a worker decodes only those it reported, and they are
    the ``txn`` column as they are)."""

    epoch: int
    now_ms: int
    seed: int
    code_hash: str
    txns: list[msgspec.Raw] = []


def archived_epoch(data: bytes | msgspec.Raw) -> ArchivedEpoch:
    """:class:`ArchivedEpoch` of an :class:`EpochRecord`'s msgpack."""
    return _ARCHIVED.decode(data)


_ARCHIVED = msgspec.msgpack.Decoder(ArchivedEpoch)
_TXNS = msgspec.msgpack.Decoder(list[CommandTxn])


def reported_commands_table(
    app: App, ssid: int, records: Sequence[ArchivedEpoch], reported: Sequence[Reported],
    empty_epochs: bool,
) -> pa.Table:  # fmt: skip
    """The rows of :func:`commands_table` of the logged transactions one worker reported (each
    transaction has one reporter), with their outcomes: no join at the commit. The rows of
    epochs without logged transactions come from one worker only (``empty_epochs``).

    Taken an epoch at a time: a report's seqs are in order (interior ones, below 0, first),
    every transaction commits but the few it names aborted, and only the transactions it
    names are decoded (in one call), their ``txn`` the bytes the log holds."""
    by_epoch = {r.epoch: r for r in reported}
    rows: list[_Rows] = []
    committed: list[bool] = []
    reasons: list[str] = []
    for record in records:
        report = by_epoch.get(record.epoch)
        if report is None or not record.txns:
            continue
        seqs = report.seqs[bisect.bisect_left(report.seqs, 0) :]
        logged = record.txns
        mine = logged if len(seqs) == len(logged) else [logged[seq] for seq in seqs]
        data = array_header(len(mine)) + b"".join(mine)
        rows.append(_Rows(record, _TXNS.decode(data), _binary(data, mine)))
        first = len(committed)
        committed += [True] * len(seqs)
        reasons += [""] * len(seqs)
        for seq, reason in report.aborted.items():
            if seq >= 0:
                row = first + bisect.bisect_left(seqs, seq)
                committed[row], reasons[row] = False, reason
    empty = [r for r in records if not r.txns] if empty_epochs else []
    return _logged_rows(app, ssid, rows, empty, (committed, reasons))


def _binary(data: bytes, values: Sequence[msgspec.Raw]) -> pa.Array | pa.ChunkedArray:
    """``values`` as a binary column, read in place from ``data``, an array header followed by
    them, when one Arrow array can hold it."""
    if len(data) > _MAX_STRING_BYTES:
        return pa.array(list(map(bytes, values)), pa.binary())
    ends = array.array("i", itertools.accumulate(map(len, values), initial=_ARRAY_HEADER_BYTES))
    buffers = [None, pa.py_buffer(ends), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), len(values), buffers)


_ARRAY_HEADER_BYTES = len(array_header(0))


class _Rows(NamedTuple):
    """The logged transactions of one epoch that get rows, and their bytes as the log holds
    them (None: encoded again)."""

    record: EpochRecord | ArchivedEpoch
    txns: Sequence[CommandTxn]
    logged: pa.Array | pa.ChunkedArray | None = None


def _logged_rows(
    app: App,
    ssid: int,
    logged: Sequence[_Rows],
    empty: Sequence[EpochRecord | ArchivedEpoch],
    outcomes: tuple[list[bool], list[str]] | None,
) -> pa.Table:
    """Rows of logged transactions, and one per epoch in ``empty``, with ``outcomes`` (else
    null). Built column by column on the snapshot writer's thread, which shares the GIL (and, on
    a small machine, the cores) with the epoch loop: a row costs a few list items, no dict;
    what an epoch fixes (time, seed, code hash) is taken per epoch and repeated by Arrow, and
    the keys are one flat column cut into lists."""
    commands = list(itertools.chain.from_iterable(part.txns for part in logged))
    rows = len(commands) + len(empty)
    none: list[None] = [None] * len(empty)
    sources = list(map(_SOURCE, commands))
    handlers = list(map(_HANDLER, commands))
    listed: dict[str, list[Any]] = {
        "seq": [*map(_SEQ, commands), *[-1] * len(none)],
        "handler": [*handlers, *[""] * len(none)],
        "origin": [*map(_ORIGINS.__getitem__, map(_ORIGIN, commands)), *[""] * len(none)],
        "source_topic": [s.topic if s else None for s in sources] + none,
        "source_partition": [s.partition if s else None for s in sources] + none,
        "source_offset": [s.offset if s else None for s in sources] + none,
        "request_id": [t.request_id or None for t in commands] + none,
    }
    if outcomes is not None:
        listed["committed"] = outcomes[0] + none
        listed["reason"] = outcomes[1] + none
    columns = {name: pa.array(v, COMMANDS_SCHEMA.field(name).type) for name, v in listed.items()}
    columns["ssid"] = pa.array(itertools.repeat(ssid, rows), pa.int64(), size=rows)
    event_json = _EventJson(app).many(handlers, list(map(_EVENT, commands)))
    columns["event_json"] = pa.chunked_array(
        [*_chunks(event_json), pa.nulls(len(none), pa.string())], pa.string()
    )
    columns["txn"] = pa.chunked_array(
        [*_logged_bytes(logged), pa.nulls(len(none), pa.binary())], pa.binary()
    )
    columns["keys"] = _key_lists(commands, rows)
    records = [part.record for part in logged] + list(empty)
    counts = [*(len(part.txns) for part in logged), *[1] * len(empty)]
    columns.update(_per_epoch(records, counts))
    return pa.table(
        [columns[f.name] if f.name in columns else pa.nulls(rows, f.type)
         for f in COMMANDS_SCHEMA],
        schema=COMMANDS_SCHEMA,
    )  # fmt: skip


def _logged_bytes(logged: Sequence[_Rows]) -> list[pa.Array]:
    """The ``txn`` column's chunks: each transaction's bytes as the log holds them."""
    chunks: list[pa.Array] = []
    for part in logged:
        column = part.logged
        if column is None:
            column = pa.array(list(map(encode_canonical, part.txns)), pa.binary())
        chunks += _chunks(column)
    return chunks


_SEQ = operator.attrgetter("seq")
_HANDLER = operator.attrgetter("handler")
_EVENT = operator.attrgetter("event")
_ORIGIN = operator.attrgetter("origin")
_SOURCE = operator.attrgetter("source")
_KEYS = operator.attrgetter("keys")
_KEY = operator.attrgetter("key")
_ACTOR_TYPE = operator.attrgetter("actor_type")


def _per_epoch(
    records: Sequence[EpochRecord | ArchivedEpoch], counts: Iterable[int]
) -> dict[str, pa.Array]:
    """The columns an epoch fixes, for rows that come ``counts[i]`` in a row for ``records[i]``:
    each epoch's values once, repeated by Arrow."""
    repeats = itertools.chain.from_iterable(map(itertools.repeat, itertools.count(), counts))
    take = pa.array(repeats, pa.int32())
    return {
        "epoch": pa.array([r.epoch for r in records], pa.int64()).take(take),
        "time": pa.array([r.now_ms for r in records], pa.timestamp("ms", tz="UTC")).take(take),
        "code_hash": pa.array([r.code_hash for r in records], pa.string()).take(take),
        "seed": pa.array([r.seed for r in records], pa.int64()).take(take),
    }


def _key_lists(commands: Sequence[CommandTxn], rows: int) -> pa.Array:
    """The ``keys`` column: each transaction's keys as text (:func:`_keys`), then an empty list
    per row left. The texts are joined by Arrow from each key's type and ``repr``, taken in C:
    a dict of texts looked up by key hashed every key of every transaction, a sixth of a
    snapshot part of 33,000 transfers over 100,000 accounts."""
    keys = list(map(_KEYS, commands))
    flat = list(itertools.chain.from_iterable(keys))
    texts = pc.binary_join_element_wise(
        pa.array(list(map(_ACTOR_TYPE, flat)), pa.string()),
        pa.array(list(map(repr, map(_KEY, flat))), pa.string()),
        ":",
    )
    ends = list(itertools.accumulate(map(len, keys), initial=0))
    ends += [ends[-1]] * (rows - len(commands))
    return pa.ListArray.from_arrays(pa.array(ends, pa.int32()), texts)


_ORIGINS = {origin: origin.name.lower() for origin in Origin}


class _EventJson:
    """Events as JSON for SQL users; None if the handler is gone or the bytes do not decode
    (the canonical bytes are kept anyway).

    The canonical bytes are decoded as plain msgpack, not as the event type: they were
    validated when they were logged, and the JSON of the plain values is the JSON of the typed
    event (field names, tags, an ``array_like`` struct's array, base64 for bytes; a set's
    elements in the order they were logged) at half the cost: validating again (a key's
    pattern, say) took most of it."""

    def __init__(self, app: App) -> None:
        self.app = app

    def __call__(self, handler: str, event: bytes) -> str | None:
        if handler not in self.app.handlers:
            return None
        try:
            return _json_encode(_plain(event)).decode()
        except (msgspec.DecodeError, TypeError, ValueError):
            return None

    def many(self, handlers: Sequence[str], events: Sequence[bytes]) -> pa.Array | pa.ChunkedArray:
        """:meth:`__call__` of each ``(handlers[i], events[i])``, as a string column: every event
        decoded in one call, encoded as JSON lines in one more, and cut into the column at its line
        ends by Arrow (a JSON line holds no line end: no bytes object per row). The events are
        one msgpack array, each followed by a boundary mark: an event that is not exactly one
        msgpack value (no value, or several) moves a mark out of its place, and the batch is
        done one by one, as is one that does not decode or encode, or a handler gone."""
        if self.app.handlers.keys() >= set(handlers):
            joined = _BOUNDARY.join(events)
            array = array_header(2 * len(events)) + joined + _BOUNDARY
            try:
                values = _plain(array)
                if values[1::2].count(_BOUNDARY_MARK) == len(events):
                    text = _json_lines(values[0::2])
                    column = _lines(text) if len(text) <= _MAX_STRING_BYTES else None
                    if column is not None and len(column) == len(events):
                        return column
            except (msgspec.DecodeError, TypeError, ValueError, pa.ArrowInvalid):
                pass
        return pa.array(list(map(self, handlers, events)), pa.string())


_MAX_STRING_BYTES = 2**31 - 1
"""The most bytes one Arrow string or binary array holds (32-bit offsets): longer JSON lines,
or an epoch's transactions, past it (events of some hundreds of KB each) go one by one, into as
many chunks as Arrow needs."""


def _chunks(column: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return column.chunks if isinstance(column, pa.ChunkedArray) else [column]


def _lines(text: bytes) -> pa.Array:
    """The lines of ``text`` (each ended by a line end) as a string column."""
    lines = pc.split_pattern(pa.array([text], pa.string()), "\n").flatten()
    return lines.slice(0, len(lines) - 1)  # the empty text after the last line end


_json_encode = msgspec.json.Encoder().encode
_json_lines = msgspec.json.Encoder().encode_lines
_plain = msgspec.msgpack.Decoder().decode
_BOUNDARY_MARK = 2**64 - 59  # a uint64 no event is at its top level: cheap to decode, compare
_BOUNDARY = msgspec.msgpack.encode(_BOUNDARY_MARK)


def interior_table(app: App, ssid: int, reported: Sequence[Reported]) -> pa.Table:
    """Rows of the interior transactions one worker reported (with their outcomes: the worker
    knows them): at their own timestamp, ``(epoch, seq < 0)``, with the epoch's time and seed,
    the event their parent emitted and the parent's timestamp; ``txn`` null (never logged)."""
    as_json = _EventJson(app)
    rows = [
        {
            "ssid": ssid, "epoch": r.epoch, "time": r.now_ms, "seq": seq, "handler": e.handler,
            "event_json": as_json(e.handler, e.event), "keys": _keys(e.keys),
            "origin": "interior", "source_topic": e.source.topic if e.source else None,
            "source_partition": e.source.partition if e.source else None,
            "source_offset": e.source.offset if e.source else None,
            "request_id": e.request_id or None, "code_hash": r.code_hash, "seed": r.seed,
            "txn": None, "committed": seq not in r.aborted, "reason": r.aborted.get(seq, ""),
            "parent_epoch": e.epoch, "parent_seq": e.seq,
        }
        for r in reported
        for seq, e in sorted(r.interior.items())
    ]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=COMMANDS_SCHEMA)


def outcomes_of(reported: Sequence[Reported]) -> Outcomes:
    """The outcomes in ``reported``, as a part ships them."""
    epoch: list[int] = []
    seq: list[int] = []
    committed: list[bool] = []
    reason: list[str] = []
    for r in reported:
        epoch += [r.epoch] * len(r.seqs)
        seq += r.seqs
        committed += [s not in r.aborted for s in r.seqs]
        reason += [r.aborted.get(s, "") for s in r.seqs]
    return Outcomes(epoch, seq, committed, reason)


def outcomes_table(outcomes: Sequence[Outcomes]) -> pa.Table:
    """Several workers' outcomes as one table to join on ``(epoch, seq)``."""
    return pa.table(
        [
            pa.array([v for o in outcomes for v in o.epoch], pa.int64()),
            pa.array([v for o in outcomes for v in o.seq], pa.int64()),
            pa.array([v for o in outcomes for v in o.committed], pa.bool_()),
            pa.array([v for o in outcomes for v in o.reason], pa.string()),
        ],
        schema=_OUTCOMES_SCHEMA,
    )


def _conformed(commands: pa.Table) -> pa.Table:
    """``commands`` with every column of :data:`COMMANDS_SCHEMA` (those it lacks, rows archived
    before they existed, as nulls), in its order."""
    columns = [
        commands[f.name] if f.name in commands.column_names else pa.nulls(len(commands), f.type)
        for f in COMMANDS_SCHEMA
    ]
    return pa.table(columns, schema=COMMANDS_SCHEMA)


def with_outcomes(commands: pa.Table, outcomes: pa.Table) -> tuple[pa.Table, int] | None:
    """``commands`` rows with ``committed``/``reason`` filled from ``outcomes`` (an
    :func:`outcomes_table`) on ``(epoch, seq)``, where still null, but never on an empty epoch's
    ``seq`` -1 row; and how many transaction rows found no outcome. None if no row found one.
    Vectorized (Arrow's join): no Python per row."""
    commands = _conformed(commands)
    rows = commands.num_rows
    open_ = pc.and_(pc.not_equal(commands["origin"], ""), pc.is_null(commands["committed"]))
    if not rows or not pc.any(open_).as_py():
        return None
    keys = pa.table({
        "epoch": commands["epoch"],
        "seq": pc.if_else(open_, commands["seq"], pa.scalar(None, pa.int64())),
        "_row": pa.array(range(rows), pa.int64()),
    })  # fmt: skip
    joined = keys.join(outcomes, keys=["epoch", "seq"], join_type="left outer")
    if joined.num_rows != rows:
        raise RecoveryError("a transaction was reported with several outcomes", rows=rows,
                            joined=joined.num_rows)  # fmt: skip
    joined = joined.sort_by("_row")
    found = joined["committed"]
    if found.null_count == rows:
        return None
    missing = pc.sum(pc.and_(open_, pc.is_null(found))).as_py() or 0
    index = COMMANDS_SCHEMA.get_field_index
    commands = commands.set_column(
        index("committed"), COMMANDS_SCHEMA.field("committed"),
        pc.coalesce(commands["committed"], found),
    ).set_column(
        index("reason"), COMMANDS_SCHEMA.field("reason"),
        pc.coalesce(commands["reason"], joined["reason"]),
    )  # fmt: skip
    return commands, missing


def epochs_of(commands: pa.Table) -> list[EpochRecord]:
    """The epochs archived in ``commands`` rows, in order (for replay and checks): the logged
    transactions (interior ones, with no ``txn``, are derived again by replay)."""
    by_epoch: dict[int, tuple[int, int, str, list[CommandTxn]]] = {}
    for row in commands.sort_by([("epoch", "ascending"), ("seq", "ascending")]).to_pylist():
        now_ms = round(row["time"].timestamp() * 1000)
        entry = by_epoch.setdefault(row["epoch"], (now_ms, row["seed"], row["code_hash"], []))
        if row["txn"] is not None:
            entry[3].append(msgspec.msgpack.decode(row["txn"], type=CommandTxn))
    return [
        EpochRecord(epoch, now_ms, seed, code_hash, tuple(txns))
        for epoch, (now_ms, seed, code_hash, txns) in sorted(by_epoch.items())
    ]


def outbox_table(ssid: int, rows: Sequence[OutboxRow]) -> pa.Table:
    return pa.table(
        {
            "_ssid": pa.array([ssid] * len(rows), pa.int64()),
            "_epoch": pa.array([r.epoch for r in rows], pa.int64()),
            "_n": pa.array(range(len(rows)), pa.int64()),
            "partition": pa.array([r.partition for r in rows], pa.int64()),
            "topic": pa.array([r.topic for r in rows], pa.string()),
            "value": pa.array([r.value for r in rows], pa.binary()),
            "key": pa.array([r.key for r in rows], pa.binary()),
        },
        schema=OUTBOX_SCHEMA,
    )
