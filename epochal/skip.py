"""``epochal skip``: send one poison transaction to the dead-letter topic instead of running it.

A transaction that crashes or hangs its worker every time (docs/operations.md, "Poison inputs")
stops the cluster at its epoch. Skipping it records a SKIP amendment (``log/amendments.py``):
every later reading of the command log, in every generation and in replay, runs the epoch with
that transaction aborted as ``skipped by an operator``, and the worker of partition 0 writes its
dead letter, exactly once, with the egress of that epoch. A transaction can be skipped only
while nothing it did can have been seen: its epoch is after the latest snapshot and no egress of
it was released.

In weak recovery mode there is no command log, and a rollback sequences the input after the
snapshot anew, in other epochs: the poison is named by its input record instead
(``--input TOPIC/PARTITION@OFFSET``), and the sequencer sends that record to the dead letters
instead of sequencing it, held like every weak-mode dead letter until its snapshot commits, so
it is written once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from epochal.actors.api import App
from epochal.errors import ConfigError
from epochal.log.amendments import append_amendment, read_amendments
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog, LoggedEpoch
from epochal.log.egress import read_egress_state
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.commands import Amendment, AmendmentKind, CommandTxn, InputPosition

__all__ = ["Skipped", "SkippedInput", "parse_input", "skip_input", "skip_transaction"]


@dataclass(frozen=True)
class Skipped:
    """What was skipped; ``already``: an earlier skip had recorded it (nothing was written;
    ``txn`` None: its epoch is in a snapshot since, and the log may no longer hold it)."""

    epoch: int
    seq: int
    txn: CommandTxn | None
    already: bool

    def describe(self, app: App) -> str:
        txn = self.txn
        if txn is None:
            return (
                f"transaction epoch={self.epoch} seq={self.seq} was already skipped: it went to "
                f"{app.topics.dead_letters} when the cluster ran epoch {self.epoch}"
            )
        source = txn.source
        where = f"{source.topic}/{source.partition}@{source.offset}" if source else "no input"
        if txn.request_id:
            where += f" request_id={txn.request_id}"
        done = "was already skipped" if self.already else "is skipped"
        return (
            f"transaction epoch={self.epoch} seq={txn.seq} handler={txn.handler} input={where} "
            f"{done}: it goes to {app.topics.dead_letters} when the cluster next runs epoch "
            f"{self.epoch} (a cluster that could not get past it does at its next rollback)"
        )


@dataclass(frozen=True)
class SkippedInput:
    """An input record skipped in weak mode; ``already``: an earlier skip had recorded it."""

    topic: str
    partition: int
    offset: int
    already: bool

    def describe(self, app: App) -> str:
        done = "was already skipped" if self.already else "is skipped"
        return (
            f"input {self.topic}/{self.partition}@{self.offset} {done}: the sequencer sends it "
            f"to {app.topics.dead_letters} instead of sequencing it (a cluster that could not "
            "get past it does at its next rollback)"
        )


def parse_input(text: str) -> InputPosition:
    """``topic/partition@offset`` (as a poison line names an input) to its three parts."""
    topic, _, rest = text.rpartition("/")
    partition, _, offset = rest.partition("@")
    if not (topic and partition.isdigit() and offset.isdigit()):
        raise ConfigError("an input is named TOPIC/PARTITION@OFFSET, e.g. bank.in.transfers/0@42",
                          input=text)  # fmt: skip
    return InputPosition(topic, int(partition), int(offset))


def skip_input(
    app: App, clients: KafkaClients, snapshots: DeltaSnapshots, record: InputPosition
) -> SkippedInput:
    """Record that the input ``record`` goes to the dead letters instead of being sequenced
    (weak mode), or say why it cannot be skipped."""
    topic, partition, offset = record.topic, record.partition, record.offset
    latest = snapshots.latest()
    if latest is not None and latest.recovery == "strong":
        raise ConfigError(
            "this app runs in strong recovery mode, where a logged input is skipped by its "
            "transaction: --epoch E --seq S, as the poison line names it", app=app.name,
        )  # fmt: skip
    topics = set(app.input_topics())
    if topic not in topics | {app.topics.requests}:
        raise ConfigError(f"{topic} is not an input topic of the app (it reads "
                          f"{', '.join(sorted(topics))})", topic=topic)  # fmt: skip
    if (topic, partition, offset) in read_amendments(clients, app.name).inputs:
        return SkippedInput(topic, partition, offset, already=True)  # and maybe snapshotted since
    low, high = clients.watermarks(topic, partition)
    if not low <= offset < high:
        raise ConfigError(f"{topic}/{partition} holds offsets {low}..{high - 1}, not {offset}",
                          topic=topic, partition=partition)  # fmt: skip
    covered = latest.input_positions.get(f"{topic}:{partition}", 0) if latest else 0
    if latest is not None and offset < covered:
        raise ConfigError(
            f"input {topic}/{partition}@{offset} ran and is part of snapshot ssid={latest.ssid}: "
            "it cannot be skipped now", ssid=latest.ssid,
        )  # fmt: skip
    amendment = Amendment(AmendmentKind.SKIP_INPUT, -1, -1, at_ms=int(time.time() * 1000),
                          note="epochal skip --input", topic=topic, partition=partition,
                          offset=offset)  # fmt: skip
    append_amendment(clients, app.name, amendment)
    return SkippedInput(topic, partition, offset, already=False)


def _find(clients: KafkaClients, app: App, start: int, epoch: int) -> LoggedEpoch:
    topic = app.topics.command_log
    low = clients.watermarks(topic)[0]
    first = last = None
    for logged in KafkaCommandLog(clients, topic).epochs(max(start, low), to_end=True):
        first = logged.record.epoch if first is None else first
        last = logged.record.epoch
        if logged.record.epoch == epoch:
            return logged
        if logged.record.epoch > epoch:
            break
    held = f"epochs {first}..{last}" if first is not None else "no epoch"
    raise ConfigError(
        f"epoch {epoch} is not in the command log after the latest snapshot (it holds {held})",
        topic=topic, epoch=epoch,
    )  # fmt: skip


def skip_transaction(
    app: App, clients: KafkaClients, snapshots: DeltaSnapshots, epoch: int, seq: int
) -> Skipped:
    """Record that transaction ``(epoch, seq)`` goes to the dead letters (once: a second skip
    of it writes nothing), or say why it cannot be skipped."""
    latest = snapshots.latest()
    if latest is not None and latest.recovery != "strong":
        raise ConfigError(
            "this app runs in weak recovery mode, which logs no epochs: name the input "
            "instead, --input TOPIC/PARTITION@OFFSET, as the poison line gives it", app=app.name,
        )  # fmt: skip
    skipped = read_amendments(clients, app.name).skipped(epoch, seq)
    if latest is not None and epoch <= latest.epoch:
        if skipped:  # and snapshotted since
            return Skipped(epoch, seq, None, already=True)
        raise ConfigError(
            f"epoch {epoch} ran and is part of snapshot ssid={latest.ssid}: it cannot be "
            "skipped now", epoch=epoch, ssid=latest.ssid,
        )  # fmt: skip
    if seq < 0:
        raise ConfigError(
            "an interior transaction (negative seq) is derived, not logged: skip the "
            "transaction that emitted it", epoch=epoch, seq=seq,
        )  # fmt: skip
    logged = _find(clients, app, latest.command_log_position if latest else 0, epoch)
    txn = next((t for t in logged.record.txns if t.seq == seq), None)
    if txn is None:
        seqs = [t.seq for t in logged.record.txns]
        held = f"seqs {seqs[0]}..{seqs[-1]}" if seqs else "no transaction"
        raise ConfigError(f"epoch {epoch} has no seq {seq} (it holds {held})", epoch=epoch)
    if skipped:
        return Skipped(epoch, seq, txn, already=True)
    state = read_egress_state(clients, app.name, committed=False)
    released = {p: e.position for p, e in state.positions.items() if e.position > logged.position}
    if released:
        raise ConfigError(
            f"epoch {epoch} ran and its egress was released (by partitions "
            f"{sorted(released)}): skipping it now would contradict what was released",
            epoch=epoch, position=logged.position,
        )  # fmt: skip
    note = "epochal skip"
    amendment = Amendment(AmendmentKind.SKIP, epoch, epoch, seq=seq,
                          at_ms=int(time.time() * 1000), note=note)  # fmt: skip
    append_amendment(clients, app.name, amendment)
    return Skipped(epoch, seq, txn, already=False)
