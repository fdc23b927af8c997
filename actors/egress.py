"""What a cluster releases to egress topics (and, in weak mode, to the dead-letter topic), and
how it changes its layout (its partition count or its split points) without writing an output
twice or never.

The partition that reports a transaction (the lowest one among its keys' owners) depends on the
layout, and each partition's writer knows how far it has released egress (``log/egress.py``).
Under another layout, the new reporter of an old transaction could not know whether the old one
released it. So before workers of a new layout start, :func:`prepare_egress` finishes the old
one: it replays the command log in this process under the old layout, releases through each old
writer what it had not yet released, up to the log's end, and only then records the new layout
as starting there.

**Dead letters in weak mode.** In strong mode the sequencer writes an epoch's dead letters in
the Kafka transaction that logs the epoch, so each is written once. Weak mode logs nothing, and
after a rollback the sequencer re-sequences the input from the snapshot's positions: a dead
letter it wrote directly for a record after the snapshot would be written again. So in weak
mode the dead letters travel with their epoch over the feed and are held like egress
(:func:`held_dead_letters`): partition 0 holds them in its outbox rows and its egress writer
releases them when the snapshot that covers the epoch commits, under the same exactly-once
positions (a rollback drops what was held, and the re-sequenced epochs hold it again; a crash
after the commit releases it from the snapshot's ``outbox``). This reuses the one mechanism
that already makes weak-mode output exactly once and never contradicted, instead of a second
record of what was dead-lettered that recovery would have to read and trust.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from epochal.actors.api import App
from epochal.actors.engine import Engine
from epochal.actors.outcome import TxnOutcome
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import ensure_same_code
from epochal.actors.snapshots import Restored, Snapshots, carried_of
from epochal.log.amendments import read_amendments, skipped_dead_letters
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog, LoggedEpoch
from epochal.log.egress import (
    EgressState,
    EgressWriter,
    Staged,
    ensure_positions_topic,
    read_egress_state,
    write_layout,
)
from epochal.schemas.codec import encode
from epochal.schemas.commands import DeadLetter, PartitionId
from epochal.schemas.egress import ClientReply, EgressLayout, EgressRecord
from epochal.schemas.snapshots import OutboxRow

__all__ = [
    "DEAD_LETTER_PARTITION",
    "MAX_PENDING_EGRESS",
    "EgressEncoder",
    "EpochEgress",
    "held_dead_letters",
    "layout_in_force",
    "prepare_egress",
]

logger = logging.getLogger(__name__)

MAX_PENDING_EGRESS = 50_000
"""A writer commits once it holds this many records, whatever the interval: a backlog drains in
bounded transactions instead of filling the producer's queue."""

DEAD_LETTER_PARTITION = 0
"""The partition whose egress writer releases weak mode's dead letters: every layout has it."""


class EgressEncoder:
    """What reported outcomes write to egress topics, in the app's egress format
    (``<app>.replies`` always msgpack: the client library reads it). The format's encoder and
    the topic names are looked up once, not per outcome: make one per epoch."""

    def __init__(self, app: App) -> None:
        self._app = app
        self._encode_record = app.egress_codec.record
        self._replies = app.topics.replies
        self._topics: dict[str, str] = {}

    def _topic(self, name: str) -> str:
        topic = self._topics.get(name)
        if topic is None:
            topic = self._topics[name] = self._app.topics.egress(name)
        return topic

    def records(self, outcome: TxnOutcome) -> list[tuple[str, bytes]]:
        """(topic, value) of what one reported outcome writes."""
        return [(topic, value) for topic, value, _ in self.staged([outcome])]

    def staged(self, outcomes: Iterable[TxnOutcome]) -> list[Staged]:
        """What reported ``outcomes`` write, in their order, as an egress writer stages it
        (topic, value, no key): one loop over a partition's outcomes of an epoch, not a list
        per outcome."""
        encode_record, topic, replies = self._encode_record, self._topic, self._replies
        staged: list[Staged] = []
        append = staged.append
        for o in outcomes:
            if o.client:
                reply = ClientReply(
                    o.request_id, o.epoch, o.seq, o.handler, o.committed, o.reason, o.result
                )
                append((replies, encode(reply), None))
            if o.committed:
                for name, value in o.egress:
                    record = EgressRecord(
                        o.epoch, o.seq, o.handler, True, value, "", o.source, o.request_id
                    )
                    append((topic(name), encode_record(record), None))
                continue
            aborts_to = self._app.handlers[o.handler].aborts_to
            if aborts_to is not None:
                record = EgressRecord(
                    o.epoch, o.seq, o.handler, False, b"", o.reason, o.source, o.request_id
                )
                append((topic(aborts_to), encode_record(record), None))
        return staged


class EpochEgress:
    """One epoch's egress, encoded slice by slice as the engine reports outcomes (while they
    are in cache: its ``on_reported``), and staged on the writers at once when the epoch has
    run, as a whole epoch is what a writer's commit thread takes. A writer that covers the
    epoch already (a replayed one) gets nothing; :data:`DEAD_LETTER_PARTITION`'s gets the
    dead letters of the transactions an operator skipped (``epochal skip``) after the egress,
    so each is written once however often the epoch is replayed."""

    def __init__(
        self, app: App, writers: Mapping[PartitionId, EgressWriter], logged: LoggedEpoch
    ) -> None:
        self.app = app
        self.writers = writers
        self.logged = logged
        self._staged = EgressEncoder(app).staged
        self._records: dict[PartitionId, list[Staged]] = {}

    def add(self, reported: Mapping[PartitionId, Sequence[TxnOutcome]]) -> None:
        position, writers = self.logged.position, self.writers
        for partition, outcomes in reported.items():
            if outcomes and position >= writers[partition].covered:
                self._records.setdefault(partition, []).extend(self._staged(outcomes))

    def stage(self) -> None:
        for partition, records in self._records.items():
            self.writers[partition].stage(records)
        self._records = {}
        dead = self.writers.get(PartitionId(DEAD_LETTER_PARTITION))
        if dead is not None and self.logged.position >= dead.covered:
            encode_letter = self.app.egress_codec.dead_letter
            for letter in skipped_dead_letters(self.logged.record):
                dead.add(self.app.topics.dead_letters, encode_letter(letter), letter.key)


def held_dead_letters(app: App, epoch: int, dead: Sequence[DeadLetter]) -> list[OutboxRow]:
    """Weak mode: the dead letters of epoch ``epoch`` as outbox rows of
    :data:`DEAD_LETTER_PARTITION`, released with the snapshot that covers the epoch."""
    topic = app.topics.dead_letters
    encode_letter = app.egress_codec.dead_letter
    return [OutboxRow(epoch, DEAD_LETTER_PARTITION, topic, encode_letter(d), d.key) for d in dead]


def layout_in_force(app: App, state: EgressState) -> KeyRanges | None:
    """The layout the cluster's egress writers run, None for a new app."""
    if state.layout is not None:
        return KeyRanges.of(app, state.layout.partitions, state.layout.points)
    if state.positions:  # written before layouts were recorded: one count from the start
        return KeyRanges.of(app, max(state.positions) + 1, None)
    return None


def prepare_egress(
    app: App,
    clients: KafkaClients,
    ranges: KeyRanges,
    snapshots: Snapshots | None = None,
    *,
    on_epoch: Callable[[int], None] = lambda position: None,
) -> EgressLayout:
    """Make ``ranges`` the egress layout before the workers start (the supervisor's job)."""
    ensure_positions_topic(clients, app.name)
    seen = read_egress_state(clients, app.name, committed=False)  # the layout is not transactional
    old = layout_in_force(app, seen)
    if old is None:
        layout = EgressLayout(ranges.partitions, 0, ranges.recorded())  # a new app
    elif old == ranges and seen.layout is not None:
        return seen.layout
    else:
        logger.info(
            "egress layout changes app=%s from=%d to=%d points_from=%s points_to=%s",
            app.name,
            old.partitions,
            ranges.partitions,
            old.recorded(),
            ranges.recorded(),
        )
        end = _OldLayout(app, clients, old, snapshots, on_epoch).finish()
        layout = EgressLayout(ranges.partitions, end, ranges.recorded())
    write_layout(clients, app.name, layout)
    return layout


@dataclass(frozen=True)
class _OldLayout:
    """The layout being left: its writers release all they owe up to the log's end."""

    app: App
    clients: KafkaClients
    ranges: KeyRanges
    snapshots: Snapshots | None
    on_epoch: Callable[[int], None]

    def finish(self) -> int:
        app, clients = self.app, self.clients
        writers = [
            EgressWriter(clients, app.name, p, self.ranges.partitions)
            for p in range(self.ranges.partitions)
        ]
        try:
            state = read_egress_state(clients, app.name)  # after the writers fenced their zombies
            for writer in writers:
                writer.covered = state.start(writer.partition)
            restored = self.snapshots.restore() if self.snapshots is not None else None
            if restored is not None and restored.manifest.recovery == "weak":
                return self._release_held(writers, restored)
            end = clients.end_offset(app.topics.command_log)
            if min(w.covered for w in writers) < end:
                asyncio.run(self._release(writers, restored))
            for writer in writers:
                writer.commit(max(end, writer.covered))
            return end
        finally:
            for writer in writers:
                writer.close()

    def _release_held(self, writers: list[EgressWriter], restored: Restored) -> int:
        """Weak mode: no log to replay; the old writers release what the latest snapshot holds
        for them (a crash came between its commit and their release). Returns the next epoch."""
        assert self.snapshots is not None
        manifest = restored.manifest
        start = min(w.covered for w in writers)
        for row in self.snapshots.outbox(manifest, range(len(writers)), start):
            if row.epoch >= writers[row.partition].covered:
                writers[row.partition].add(row.topic, row.value, row.key)
        for writer in writers:
            writer.commit(max(manifest.ssid + 1, writer.covered))
        return manifest.ssid + 1

    async def _release(self, writers: list[EgressWriter], restored: Restored | None) -> None:
        """Replay from the latest snapshot (every writer released what came before it: a worker
        commits its egress before its part of a snapshot), or from the log's start."""
        app = self.app
        engine = Engine(app, len(writers), track_digest=False, ranges=self.ranges)  # all partitions
        start = 0
        if restored is not None:
            manifest = restored.manifest
            engine.load(restored.actors, manifest.epoch, carried_of(manifest), restored.migrations)
            start = manifest.command_log_position
        code_hash = app.code_hash()
        log = KafkaCommandLog(self.clients, app.topics.command_log)
        amendments = read_amendments(self.clients, app.name)
        by_partition = {PartitionId(p): writer for p, writer in enumerate(writers)}
        for read in log.epochs(start, to_end=True):
            logged = amendments.amend(read)
            ensure_same_code(logged.record, code_hash)
            egress = EpochEgress(app, by_partition, logged)
            await engine.run_epoch(logged.record, egress.add)
            egress.stage()
            for writer in writers:
                if writer.pending >= MAX_PENDING_EGRESS:
                    writer.commit(logged.position + 1)
            self.on_epoch(logged.position)
