"""Which layout (partition count and split points) a cluster runs in its next generation.

A layout changes only when a generation starts from a snapshot, through the path a change of
partition count takes (``actors/egress.py``): the old layout's egress is finished first, so no
output is written twice or never. The supervisor asks :func:`choose_layout` at every start, and
:func:`skew_of` every so often while the cluster runs:

- a new app (no layout recorded, no snapshot): the declared key samples, else the defaults;
- another partition count: split points learned from the latest snapshot's keys;
- the same count: kept, unless the latest snapshot shows its partitions holding skewed shares of
  the actors and points learned from its keys would make them materially more even
  (:func:`~epochal.actors.partitioning.rebalance_worth_it`).

The learned points are equal-count quantiles of each type's keys: they balance actors, not the
traffic each key gets. :class:`RebalanceSchedule` says when the supervisor looks, and
:func:`log_layout` writes the line that says which layout a generation runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from epochal.actors.api import App
from epochal.actors.partitioning import SKEW_FACTOR, KeyRanges, rebalance_worth_it, skewed
from epochal.config import RebalanceConfig
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.commands import ActorKey
from epochal.schemas.snapshots import Manifest

__all__ = [
    "LayoutChoice",
    "LayoutSource",
    "RebalanceSchedule",
    "choose_layout",
    "log_layout",
    "recorded_layout",
    "skew_of",
    "snapshot_keys",
]

logger = logging.getLogger(__name__)


class LayoutSource(Enum):
    """Where a generation's layout comes from."""

    NEW_APP = "new_app"  # declared key samples, else the defaults
    KEPT = "kept"  # the layout in force
    LEARNED = "learned"  # quantiles of the latest snapshot's keys


@dataclass(frozen=True)
class LayoutChoice:
    """A layout, where it comes from, and the actors each partition held before and would hold
    under it (as far as a snapshot tells; empty without one)."""

    ranges: KeyRanges
    source: LayoutSource
    before: list[int]
    after: list[int]
    ssid: int = -1


def snapshot_keys(snapshots: DeltaSnapshots, manifest: Manifest) -> dict[str, list[ActorKey]]:
    """Each actor type's keys in snapshot ``manifest`` (the key column only)."""
    keys: dict[str, list[ActorKey]] = {}
    for name in snapshots.app.actor_types:
        version = manifest.state_versions.get(name)
        if version is None:
            continue
        uri, options = snapshots.warehouse.state(name), snapshots.warehouse.options
        table = DeltaTable(uri, version=version, storage_options=options)
        keys[name] = table.to_pyarrow_table(columns=["_key"]).column("_key").to_pylist()
    return keys


def recorded_layout(app: App, manifest: Manifest) -> KeyRanges | None:
    """The layout ``manifest`` was taken under, None if it does not say."""
    return KeyRanges.of(app, manifest.partitions, manifest.points) if manifest.points else None


def skew_of(
    app: App, current: KeyRanges, manifest: Manifest, factor: float = SKEW_FACTOR
) -> list[int] | None:
    """The actors each partition held at ``manifest``, if it was taken under ``current`` and
    they are skewed; else None (nothing to do, without reading a key)."""
    if recorded_layout(app, manifest) != current or not manifest.partition_actors:
        return None
    shares = list(manifest.partition_actors)
    return shares if skewed(shares, factor) else None


def choose_layout(
    app: App,
    partitions: int,
    current: KeyRanges | None,
    snapshots: DeltaSnapshots | None,
    factor: float = SKEW_FACTOR,
) -> LayoutChoice:
    """The layout the next generation runs (see the module's docstring)."""
    same = current if current is not None and current.partitions == partitions else None
    manifests = snapshots.manifests() if snapshots is not None else []
    if not manifests or snapshots is None:
        return _without_keys(app, partitions, same)
    latest = manifests[-1]
    known = same is not None and recorded_layout(app, latest) == same and latest.partition_actors
    if same is not None and known and not skewed(latest.partition_actors, factor):
        shares = list(latest.partition_actors)
        return LayoutChoice(same, LayoutSource.KEPT, shares, shares, latest.ssid)
    try:
        keys = snapshot_keys(snapshots, latest)
    except (DeltaError, OSError, pa.ArrowException) as exc:  # restore() will skip it too
        logger.warning("snapshot keys unreadable, no layout learned ssid=%d: %s", latest.ssid, exc)
        return _without_keys(app, partitions, same)
    learned = KeyRanges.learned(app, partitions, keys)
    after = learned.shares(keys)
    if same is None:
        return LayoutChoice(learned, LayoutSource.LEARNED, [], after, latest.ssid)
    before = same.shares(keys)
    if rebalance_worth_it(before, after, factor):
        return LayoutChoice(learned, LayoutSource.LEARNED, before, after, latest.ssid)
    return LayoutChoice(same, LayoutSource.KEPT, before, before, latest.ssid)


def _without_keys(app: App, partitions: int, same: KeyRanges | None) -> LayoutChoice:
    """No snapshot to learn from: the layout in force if it has the count, else a new app's."""
    if same is not None:
        return LayoutChoice(same, LayoutSource.KEPT, [], [])
    return LayoutChoice(KeyRanges.even(app, partitions), LayoutSource.NEW_APP, [], [])


class RebalanceSchedule:
    """When to look for skew: every ``check_interval_ms``, each snapshot once, and twice as
    rarely (up to 32 times) after each check that read a snapshot's keys, whether it rebalanced
    or found no better layout (a learned layout is applied only when materially better, so
    rebalances do not follow one another; the backoff makes sure of it, and spares reading the
    keys of an app that stays skewed however it is split: too few distinct keys, say)."""

    def __init__(self, config: RebalanceConfig, now: float) -> None:
        self.interval_s = config.check_interval_ms / 1000
        self.max_interval_s = 32 * self.interval_s
        self.next_at = now + self.interval_s
        self.judged = -1  # the last ssid looked at

    def due(self, now: float) -> bool:
        if not self.interval_s or now < self.next_at:
            return False
        self.next_at = now + self.interval_s
        return True

    def fresh(self, ssid: int) -> bool:
        """Whether snapshot ``ssid`` has not been looked at yet (and now is)."""
        fresh, self.judged = ssid > self.judged, max(ssid, self.judged)
        return fresh

    def slow_down(self, now: float) -> None:
        """After a check that read the keys: the next one comes twice as late."""
        self.interval_s = min(2 * self.interval_s, self.max_interval_s)
        self.next_at = now + self.interval_s


def log_layout(choice: LayoutChoice, when: str) -> None:
    """One line saying which layout the next generation runs and each partition's share (a
    warning when the layout changes to a learned one: the cluster rolls back for it)."""
    level = logging.WARNING if choice.source is LayoutSource.LEARNED else logging.INFO
    logger.log(
        level,
        "key layout when=%s source=%s partitions=%d ssid=%d partition_actors_before=%s "
        "partition_actors_after=%s points=%s",
        when,
        choice.source.value,
        choice.ranges.partitions,
        choice.ssid,
        choice.before,
        choice.after,
        _short(choice.ranges.recorded()),
    )


def _short(points: dict[str, list[ActorKey]], most: int = 8) -> dict[str, list[ActorKey]]:
    """Split points for a log line: at most ``most`` per type."""
    return {name: p[:most] for name, p in points.items()}
