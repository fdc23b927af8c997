"""A worker process: command log in, epochs executed, egress out exactly once.

The loop reads like the protocol: poll the command log (``read_committed``) → execute each epoch
on this worker's partitions (exchanging reads and emits with the other workers) → hand each
partition's egress to its transactional writer → commit egress every ``egress_interval_ms``.

Until snapshots exist a worker always starts from the beginning of the command log: state is
rebuilt by replay, and a partition produces egress only for epochs after the position its last
egress transaction covered (so a restart never repeats an output). Anything that is not a
handler's exception (a lost peer, Kafka failing, a bug) ends the process; the supervisor then
rolls the whole cluster back to a new generation (DESIGN §2.9).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from epochal.actors.api import App
from epochal.actors.engine import Engine, EpochResult
from epochal.actors.outcome import TxnOutcome
from epochal.actors.plan import ensure_same_code
from epochal.actors.transport import Peers
from epochal.config import KafkaConfig, WorkerConfig
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog, LoggedEpoch
from epochal.log.egress import EgressWriter
from epochal.metrics import Metrics, serve_metrics
from epochal.schemas.codec import encode
from epochal.schemas.commands import PartitionId
from epochal.schemas.egress import EgressRecord

__all__ = ["Worker"]

logger = logging.getLogger(__name__)


def egress_records(app: App, outcome: TxnOutcome) -> list[tuple[str, bytes]]:
    """(topic, value) of what one reported outcome writes to egress topics."""
    if outcome.committed:
        return [
            (app.topics.egress(name), encode(EgressRecord(outcome.epoch, outcome.seq,
                                                          outcome.handler, True, value)))
            for name, value in outcome.egress
        ]  # fmt: skip
    aborts_to = app.handlers[outcome.handler].aborts_to
    if aborts_to is None:
        return []
    record = EgressRecord(outcome.epoch, outcome.seq, outcome.handler, False, reason=outcome.reason)
    return [(app.topics.egress(aborts_to), encode(record))]


def abort_category(reason: str) -> str:
    """A label of few values for an abort reason: constraint, undeclared key, or the exception."""
    if reason.startswith("constraint "):
        return "constraint"
    if reason.startswith("undeclared key"):
        return "undeclared_key"
    if reason.startswith("key function"):
        return "key_function"
    return reason.split(":", 1)[0] if ":" in reason else "other"


class Worker:
    """``Worker(app, config, kafka).run(should_stop)`` in a worker process."""

    def __init__(self, app: App, config: WorkerConfig, kafka: KafkaConfig) -> None:
        self.app = app
        self.config = config
        self.clients = KafkaClients(kafka)
        self.code_hash = app.code_hash()  # reads source files: once, not per epoch
        self.metrics = Metrics(app=app.name, worker=str(config.worker))
        self.metrics.describe("epochal_transactions_total", "counter", "transactions by outcome")
        self.metrics.describe("epochal_aborts_total", "counter", "aborts by handler and reason")
        self.metrics.describe("epochal_epochs_total", "counter", "epochs executed")
        self.metrics.describe("epochal_epoch_seconds_sum", "counter", "time executing epochs")
        self.metrics.describe("epochal_command_log_position", "gauge", "last epoch executed")

    def run(self, should_stop: Callable[[], bool]) -> None:
        if self.config.cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {self.config.cpu})
        if self.config.metrics_port:
            serve_metrics(self.metrics, self.config.metrics_port + self.config.worker)
        try:
            import uvloop

            uvloop.run(self._run(should_stop))
        except ImportError:  # uvloop is Linux/macOS only
            asyncio.run(self._run(should_stop))

    async def _run(self, should_stop: Callable[[], bool]) -> None:
        config = self.config
        peers = None
        if config.workers > 1:
            peers = Peers(config.worker, list(config.peers), config.generation)
        engine = Engine(self.app, config.partitions, config.worker, config.workers, peers,
                        track_digest=config.track_digest)  # fmt: skip
        writers = {
            p: EgressWriter(self.clients, self.app.name, p, config.transaction_timeout_ms)
            for p in engine.partitions
        }
        if peers is not None:
            await peers.start()
        poller = KafkaCommandLog(self.clients, self.app.topics.command_log).poller(start=0)
        loop = asyncio.get_running_loop()
        next_position, last_commit = 0, time.monotonic()
        logger.info("worker started worker=%d partitions=%s generation=%d",
                    config.worker, sorted(engine.partitions), config.generation)  # fmt: skip
        try:
            while not should_stop():
                for logged in await loop.run_in_executor(None, poller.poll, 0.05):
                    result = await self._execute(engine, logged)
                    self._stage_egress(writers, logged, result)
                    next_position = logged.position + 1
                if time.monotonic() - last_commit >= config.egress_interval_ms / 1000:
                    await loop.run_in_executor(None, _commit_all, writers, next_position)
                    last_commit = time.monotonic()
            await loop.run_in_executor(None, _commit_all, writers, next_position)
        finally:
            poller.close()
            for writer in writers.values():
                writer.close()
            if peers is not None:
                await peers.close()

    async def _execute(self, engine: Engine, logged: LoggedEpoch) -> EpochResult:
        record = logged.record
        ensure_same_code(record, self.code_hash, self.config.allow_code_change)
        started = time.perf_counter()
        result = await engine.run_epoch(record)
        self.metrics.inc("epochal_epochs_total")
        self.metrics.inc("epochal_epoch_seconds_sum", time.perf_counter() - started)
        self.metrics.set("epochal_command_log_position", logged.position)
        for outcome in result.outcomes:
            self.metrics.inc("epochal_transactions_total",
                             outcome="committed" if outcome.committed else "aborted")  # fmt: skip
            if not outcome.committed:
                self.metrics.inc("epochal_aborts_total", handler=outcome.handler,
                                 reason=abort_category(outcome.reason))  # fmt: skip
        return result

    def _stage_egress(
        self, writers: dict[PartitionId, EgressWriter], logged: LoggedEpoch, result: EpochResult
    ) -> None:
        for partition, outcomes in result.by_partition.items():
            writer = writers[partition]
            if logged.position < writer.covered:
                continue  # replayed: this partition's egress for it is already out
            for outcome in outcomes:
                for topic, value in egress_records(self.app, outcome):
                    writer.add(topic, value)


def _commit_all(writers: dict[PartitionId, EgressWriter], next_position: int) -> None:
    for writer in writers.values():
        writer.commit(next_position)
