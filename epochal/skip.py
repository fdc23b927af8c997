"""``epochal skip``: send one poison transaction to the dead-letter topic instead of running it.

A transaction that crashes or hangs its worker every time (docs/operations.md, "Poison inputs")
stops the cluster at its epoch. Skipping it records a SKIP amendment (``log/amendments.py``):
every later reading of the command log, in every generation and in replay, runs the epoch with
that transaction aborted as ``skipped by an operator``, and the worker of partition 0 writes its
dead letter, exactly once, with the egress of that epoch. A transaction can be skipped only
while nothing it did can have been seen: its epoch is after the latest snapshot and no egress of
it was released.
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
from epochal.schemas.commands import Amendment, AmendmentKind, CommandTxn

__all__ = ["Skipped", "skip_transaction"]


@dataclass(frozen=True)
class Skipped:
    """What was skipped; ``already``: an earlier skip had recorded it (nothing was written)."""

    epoch: int
    txn: CommandTxn
    already: bool

    def describe(self, app: App) -> str:
        txn = self.txn
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
            "skip works on the command log of strong recovery; this app runs in weak mode, "
            "which logs no epochs: deploy a fixed version instead", app=app.name,
        )  # fmt: skip
    if latest is not None and epoch <= latest.epoch:
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
    if read_amendments(clients, app.name).skipped(epoch, seq):
        return Skipped(epoch, txn, already=True)
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
    return Skipped(epoch, txn, already=False)
