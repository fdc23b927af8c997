"""Strong replay: the state the command log implies, rebuilt in this process.

Replay starts from a snapshot (``restored``, the latest complete one) or from the log's first
epoch, and runs the same engine on the same command log, so it reaches the same state as the
cluster did (docs/concepts.md); the digest proves it. One process owns every key, so nothing is
exchanged. A command log written by other application code is refused unless allowed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from epochal.actors.api import App
from epochal.actors.engine import LocalEngine
from epochal.actors.lifecycle import collecting_less
from epochal.actors.plan import ensure_same_code
from epochal.actors.snapshots import Restored, carried_of
from epochal.log.amendments import Amendments
from epochal.log.command_log import LoggedEpoch

__all__ = ["replay_command_log"]


def replay_command_log(
    app: App,
    epochs: Iterable[LoggedEpoch],
    *,
    partitions: int = 1,
    allow_code_change: bool = False,
    on_epoch: Callable[[int], None] = lambda position: None,
    restored: Restored | None = None,
    amendments: Amendments | None = None,
) -> tuple[LocalEngine, int]:
    """Replay epochs from a command log (Kafka or the in-memory twin) into a fresh engine, after
    the snapshot ``restored`` if given (``epochs`` then start after it), with the log's
    ``amendments`` (skipped transactions, re-coded epochs: ``log/amendments.py``) applied.

    Returns the engine (its state) and the number of epochs replayed. Only the digest at the
    end counts, so it is made then, once; the collector runs less meanwhile.
    """
    engine = LocalEngine(app, partitions, track_digest=False)
    if restored is not None:
        manifest = restored.manifest
        engine.load(restored.actors, manifest.epoch, carried_of(manifest), restored.migrations)
    code_hash = app.code_hash()
    amended = amendments or Amendments()
    replayed = 0

    async def run() -> None:
        nonlocal replayed
        for read in epochs:
            logged = amended.amend(read)
            ensure_same_code(logged.record, code_hash, allow_code_change)
            await engine.run_epoch(logged.record, on_reported=_state_only)
            replayed += 1
            on_epoch(logged.position)

    with collecting_less():
        asyncio.run(run())
    engine.store.track_digest()
    return engine, replayed


def _state_only(reported: object) -> None:
    """Replay wants the state: each slice's outcomes are let go as soon as it has run."""
