"""Strong replay: the state the command log implies, rebuilt in this process.

Until snapshots exist, replay starts from the first epoch. It is the same engine, on the same
command log, so it reaches the same state as the cluster did (DESIGN §2.3); the digest proves it.
A command log written by other application code is refused unless allowed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from epochal.actors.api import App
from epochal.actors.engine import LocalEngine
from epochal.errors import RecoveryError
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog

__all__ = ["replay_command_log"]


def replay_command_log(
    app: App,
    clients: KafkaClients,
    partitions: int = 1,
    allow_code_change: bool = False,
    on_epoch: Callable[[int], None] = lambda position: None,
) -> tuple[LocalEngine, int]:
    """Replay every committed epoch; returns the engine (its state) and the epochs replayed."""
    engine = LocalEngine(app, partitions)
    code_hash = app.code_hash()
    epochs = 0

    async def run() -> None:
        nonlocal epochs
        for logged in KafkaCommandLog(clients, app.topics.command_log).epochs(to_end=True):
            if logged.record.code_hash != code_hash and not allow_code_change:
                raise RecoveryError(
                    "the command log was written by other application code",
                    epoch=logged.record.epoch, logged=logged.record.code_hash, running=code_hash,
                )  # fmt: skip
            await engine.run_epoch(logged.record)
            epochs += 1
            on_epoch(logged.position)

    asyncio.run(run())
    return engine, epochs
