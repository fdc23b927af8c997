"""The append-only log tables a snapshot adds rows to, beside its actors' changes.

- ``<app>/commands``: the command log archived, one row per transaction of every epoch since the
  previous snapshot, so history outlives Kafka retention (and the query issue's ``commands``
  view reads it): handler, the event as canonical bytes and as JSON, keys, where it came from.
- ``<app>/outbox``: in weak mode, the egress of the epochs a snapshot covers. It is released
  only once the snapshot commits; a worker that finds a committed snapshot whose egress its
  partition had not yet released (a crash between the two) releases it from here.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pyarrow as pa

from epochal.actors.api import App
from epochal.schemas.canonical import decode_canonical, encode_canonical
from epochal.schemas.commands import CommandTxn, EpochRecord
from epochal.schemas.snapshots import OutboxRow

__all__ = ["COMMANDS_SCHEMA", "OUTBOX_SCHEMA", "commands_table", "epochs_of", "outbox_table"]

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
])  # fmt: skip

OUTBOX_SCHEMA = pa.schema([
    pa.field("_ssid", pa.int64(), nullable=False),
    pa.field("_epoch", pa.int64(), nullable=False),
    pa.field("_n", pa.int64(), nullable=False),
    pa.field("partition", pa.int64(), nullable=False),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("value", pa.binary(), nullable=False),
])  # fmt: skip


def _event_json(app: App, handler: str, event: bytes) -> str | None:
    """The event as JSON for SQL users; None if the handler is gone or the bytes no longer decode
    (the canonical bytes are kept anyway)."""
    known = app.handlers.get(handler)
    if known is None:
        return None
    try:
        return msgspec.json.encode(decode_canonical(event, known.event)).decode()
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError):
        return None


def commands_table(app: App, ssid: int, records: Sequence[EpochRecord]) -> pa.Table:
    """Rows of every transaction of ``records`` (the epochs snapshot ``ssid`` closes); an epoch
    without logged transactions gets one row with ``seq`` -1 (interior transactions, which are
    derived and never logged, may run in it). ``txn`` is the transaction as the log holds it (its
    event's canonical bytes included), so
    :func:`epochs_of` gives back the epochs for replay."""
    empty: list[dict[str, object]] = [
        {"ssid": ssid, "epoch": r.epoch, "time": r.now_ms, "seq": -1, "handler": "",
         "keys": [], "origin": "", "code_hash": r.code_hash, "seed": r.seed, "txn": None}
        for r in records
        if not r.txns
    ]  # fmt: skip
    rows = [
        {
            "ssid": ssid, "epoch": r.epoch, "time": r.now_ms, "seq": t.seq, "handler": t.handler,
            "event_json": _event_json(app, t.handler, t.event),
            "keys": [f"{k.actor_type}:{k.key!r}" for k in t.keys], "origin": t.origin.name.lower(),
            "source_topic": t.source.topic if t.source else None,
            "source_partition": t.source.partition if t.source else None,
            "source_offset": t.source.offset if t.source else None,
            "request_id": t.request_id or None, "code_hash": r.code_hash, "seed": r.seed,
            "txn": encode_canonical(t),
        }
        for r in records
        for t in r.txns
    ]  # fmt: skip
    return pa.Table.from_pylist(rows + empty, schema=COMMANDS_SCHEMA)


def epochs_of(commands: pa.Table) -> list[EpochRecord]:
    """The epochs archived in ``commands`` rows, in order (for replay and checks)."""
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
        },
        schema=OUTBOX_SCHEMA,
    )
