"""App(egress_format="json"): egress records and dead letters a plain Kafka tool reads, the
same facts as the msgpack default once decoded, on every path that writes them."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest

from epochal import ConfigError, EgressFormat
from epochal.actors.api import App
from epochal.actors.context import Context
from epochal.actors.egress import DEAD_LETTER_PARTITION, EpochEgress, held_dead_letters
from epochal.log.command_log import LoggedEpoch
from epochal.log.ordering import dead_letter
from epochal.schemas.codec import decode
from epochal.schemas.commands import SKIPPED_REASON, DeadLetter, InputRecord, PartitionId
from epochal.schemas.egress_codec import egress_codec
from epochal.testing import AppTest


class Counter(msgspec.Struct):
    n: int = 0


class Bump(msgspec.Struct, frozen=True, tag=True):
    key: str
    by: int


class Blob(msgspec.Struct, frozen=True):
    """A record with bytes: base64 in JSON, bytes again when read as this type."""

    name: str
    data: bytes


class Note(msgspec.Struct, frozen=True, tag=True):
    text: str


def _app(egress_format: EgressFormat | str) -> App:
    """One app per format: a bump egresses an int, a tagged struct and bytes; a bump below
    zero aborts and reports to ``refused``; a client bump egresses what it was asked."""
    app = App("fmt", egress_format=egress_format)
    app.actor(constraints={"n >= 0": lambda c: c.n >= 0})(Counter)

    def bump(ctx: Context, e: Bump) -> None:
        counter = ctx.get(Counter, e.key)
        counter.n += e.by
        ctx.put(e.key, counter)
        ctx.egress("numbers", 123)
        ctx.egress("notes", Note(f"{e.key} is {counter.n}"))
        ctx.egress("blobs", Blob(e.key, b"\x00\xff{"))

    def ask(ctx: Context, e: Bump) -> int:
        ctx.egress("numbers", e.by)
        ctx.egress("numbers", None)
        return e.by

    keys = lambda e: {Counter: [e.key]}  # noqa: E731
    app.transaction(topic="bumps", event=Bump, keys=keys, aborts_to="refused")(bump)
    app.transaction(client=True, event=Bump, keys=keys)(ask)
    return app


def _run(egress_format: EgressFormat | str) -> AppTest:
    t = AppTest(_app(egress_format), partitions=2)
    t.send("bumps", Bump("a", 2))
    t.send("bumps", Bump("a", -5))  # aborts: reported to refused
    t.send("bumps", b'{"type": "Bump", "key": "b"}', key=b"k-1")  # a dead letter
    t.send("bumps", b"\xc1\x00 not msgpack")  # a dead letter whose value is no text
    t.request("ask", Bump("a", 7), request_id="req-1")
    t.run()
    return t


def _lines(t: AppTest, name: str) -> list[Any]:
    topic = t.app.topics.egress(name)
    return [json.loads(value) for written, value in t.written if written == topic]


def test_the_format_is_the_enum_or_its_value_and_anything_else_is_refused() -> None:
    assert App("a").egress_format is EgressFormat.MSGPACK
    assert App("a", egress_format="json").egress_format is EgressFormat.JSON
    assert App("a", egress_format=EgressFormat.JSON).egress_codec.format is EgressFormat.JSON
    with pytest.raises(ConfigError, match="'xml'"):
        App("a", egress_format="xml")


def test_a_json_app_decodes_to_the_same_egress_and_dead_letters_as_the_msgpack_one() -> None:
    packed, readable = _run(EgressFormat.MSGPACK), _run("json")
    assert readable.egress("numbers") == packed.egress("numbers") == [123, 7, None]
    assert readable.egress("notes", Note) == packed.egress("notes", Note) == [Note("a is 2")]
    assert (
        readable.egress("notes") == packed.egress("notes") == [{"type": "Note", "text": "a is 2"}]
    )
    assert (
        readable.egress("blobs", Blob) == packed.egress("blobs", Blob) == [Blob("a", b"\x00\xff{")]
    )

    def facts(t: AppTest, name: str) -> list[tuple[object, ...]]:
        return [
            (r.epoch, r.seq, r.handler, r.committed, r.reason, r.source, r.request_id)
            for r in t.egress_records(name)
        ]

    for name in ("numbers", "notes", "blobs", "refused"):
        assert facts(readable, name) == facts(packed, name)
    assert [r.value for r in readable.egress_records("refused")] == [b""]
    assert readable.replies == packed.replies
    assert len(readable.dead_letters) == 2
    assert readable.dead_letters == packed.dead_letters


def test_json_egress_lines_hold_the_record_itself_and_null_for_an_abort() -> None:
    t = _run(EgressFormat.JSON)
    numbers = _lines(t, "numbers")
    assert [line["value"] for line in numbers] == [123, 7, None]  # 123 is no '{' byte here
    border, client, _ = numbers
    assert border["committed"] is True and border["request_id"] == ""
    assert border["source"] == {"topic": "fmt.in.bumps", "partition": 0, "offset": 0}
    assert (client["handler"], client["request_id"]) == ("ask", "req-1")
    assert client["source"]["topic"] == "fmt.requests"
    assert _lines(t, "notes")[0]["value"] == {"type": "Note", "text": "a is 2"}
    assert _lines(t, "blobs")[0]["value"] == {"name": "a", "data": "AP97"}  # base64 of the bytes
    [refused] = _lines(t, "refused")
    assert refused["committed"] is False and refused["value"] is None
    assert "'n >= 0' violated" in refused["reason"]
    assert refused["source"]["offset"] == 1
    replies = [v for topic, v in t.written if topic == t.app.topics.replies]
    assert replies and all(v[:1] != b"{" for v in replies)  # replies stay msgpack


def test_a_record_with_no_json_form_aborts_its_transaction_in_a_json_app_only() -> None:
    for egress_format, committed in ((EgressFormat.MSGPACK, True), (EgressFormat.JSON, False)):
        app = App("odd", egress_format=egress_format)
        app.actor()(Counter)

        def odd(ctx: Context, e: Bump) -> None:
            ctx.egress("out", {(1, 2): "a map keyed by arrays"})

        app.transaction(topic="odd", event=Bump, keys=lambda e: {Counter: [e.key]})(odd)
        t = AppTest(app)
        t.send("odd", Bump("a", 1))
        t.run()
        [outcome] = t.outcomes
        assert outcome.committed is committed
        if not committed:
            assert "no JSON form" in outcome.reason and t.egress_records("out") == []


def _letters() -> list[DeadLetter]:
    record = InputRecord("fmt.in.bumps", 0, 9, b"\xc1 raw \x00", b"key")
    return [dead_letter(record, "invalid event: missing required field `key`")]


def test_weak_mode_holds_dead_letters_in_the_apps_format() -> None:
    letters = _letters()
    for egress_format in EgressFormat:
        rows = held_dead_letters(_app(egress_format), 4, letters)
        codec = egress_codec(egress_format)
        assert [(r.epoch, r.partition, r.topic, r.key) for r in rows] == [
            (4, DEAD_LETTER_PARTITION, "fmt.dlq", b"key")
        ]
        assert [codec.read_dead_letter(r.value) for r in rows] == letters
    [row] = held_dead_letters(_app("json"), 4, letters)
    line = json.loads(row.value)
    assert (line["reason"], line["offset"]) == (letters[0].reason, 9)
    assert base64.b64decode(line["value"]) == letters[0].value  # raw bytes: base64


def test_a_json_dead_letter_fits_the_cap_as_encoded() -> None:
    encode = egress_codec(EgressFormat.JSON).dead_letter
    huge = InputRecord("fmt.in.bumps", 0, 1, b"\xc1" * 900_000, b"K" * 90_000)
    for reason in ("short", "\x01" * 100_000, '"' * 30_000):
        for cap in (64 * 1024, 300):
            letter = dead_letter(huge, reason, cap, EgressFormat.JSON)
            assert len(encode(letter)) <= cap
            assert letter.truncated and letter.size == 900_000
            assert huge.value.startswith(letter.value) and letter.value
            assert (huge.key or b"").startswith(letter.key or b"") and letter.key
            assert letter.reason


def test_the_sequencer_writes_dead_letters_in_the_format_it_is_given() -> None:
    from epochal.config import KafkaConfig, SequencerConfig
    from epochal.log.client import KafkaClients
    from epochal.log.sequencer import Sequencer

    [letter] = _letters()
    for egress_format in EgressFormat:
        app = _app(egress_format)
        clients = KafkaClients(KafkaConfig("127.0.0.1:1"))  # never reached: nothing is sent
        sequencer = Sequencer(
            SequencerConfig(app.name), clients, app, app.input_topics(), "",
            egress_format=app.egress_codec.format,
        )  # fmt: skip
        data = sequencer.encode_dead_letter(letter)
        assert egress_codec(egress_format).read_dead_letter(data) == letter
        assert (data[:1] == b"{") is (egress_format is EgressFormat.JSON)


class _Released:
    """What an egress writer is handed, by topic (:class:`EpochEgress`'s side of the writer)."""

    def __init__(self) -> None:
        self.covered = 0
        self.added: list[tuple[str, bytes, bytes | None]] = []

    def add(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.added.append((topic, value, key))

    def stage(self, records: list[tuple[str, bytes, bytes | None]]) -> None:
        self.added.extend(records)


def test_an_operators_skip_releases_its_dead_letter_in_the_apps_format() -> None:
    for egress_format in EgressFormat:
        t = AppTest(_app(egress_format), partitions=2)
        t.send("bumps", Bump("a", 2))
        t.run()
        [record], [result] = t.command_log, t.results
        skipped = msgspec.structs.replace(record, skipped={0: SKIPPED_REASON})
        writers = {PartitionId(p): _Released() for p in range(2)}
        egress = EpochEgress(t.app, writers, LoggedEpoch(7, skipped))
        egress.add(result.by_partition)
        egress.stage()
        dlq = [v for w in writers.values() for topic, v, _ in w.added if topic == "fmt.dlq"]
        [letter] = [egress_codec(egress_format).read_dead_letter(v) for v in dlq]
        assert (letter.reason, letter.topic, letter.offset) == (SKIPPED_REASON, "fmt.in.bumps", 0)
        assert decode(letter.value, Bump) == Bump("a", 2)
        if egress_format is EgressFormat.JSON:
            assert json.loads(dlq[0])["reason"] == SKIPPED_REASON
