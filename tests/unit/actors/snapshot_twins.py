"""A twin of a worker's snapshot store for tests of the threads around it: what they hand on
and when, not what a snapshot holds."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from epochal.actors.store import Change
from epochal.schemas.snapshots import Manifest, SnapshotPart


class SlowSnapshots:
    """Writes wait for ``go``; commits are counted (the parts themselves do not matter)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.writing = threading.Event()
        self.committed: list[int] = []

    def write(self, ssid: int, worker: int, changes: Sequence[Change], **_: Any) -> SnapshotPart:
        self.writing.set()
        assert self.go.wait(10)
        return SnapshotPart(ssid, worker, (), "0", len(changes))

    def commit(self, parts: Sequence[SnapshotPart], epoch: int) -> Manifest:
        self.committed.append(epoch)
        return Manifest(epoch, epoch, 0, 0, {}, {}, {}, {}, "0", b"", 1, "")

    def retain(self, latest: Manifest) -> None:
        pass
