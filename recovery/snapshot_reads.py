"""Reads of retained snapshots straight from Delta, without Spark or the workers: the live query
client's ``SNAPSHOT(ssid)`` isolation level (docs/queries.md).

A snapshot's actors of one type are the rows of ``state/<type>`` at the Delta version that its
manifest row names (a Delta version is not an ssid). A read skips every Parquet row group whose
key range (its statistics, read once per version) cannot hold a wanted key, and filters the rest
in Arrow, so no row but the wanted ones reaches Python. How much that skips depends on how the
state files are laid out (how many, how large their row groups, how clustered by key). Values
are the canonical msgpack bytes the table keeps in ``_state``, exactly what was snapshotted, as
a restore reads them (:func:`epochal.recovery.snapshots.actor_rows`).

The pruning is ours rather than pyarrow's because delta-rs's merge writes string columns as
Arrow ``string_view``, for which pyarrow has no comparison kernels: its own statistics pruning
fails on such files, and a string key is compared only after a cast to ``string``.

An ssid that the manifest does not hold, because it expired or was never taken, is a
:class:`SnapshotNotRetainedError` that names the retained range.

    >>> reader = SnapshotReader(SnapshotConfig("warehouse"), "bank")
    >>> reader.get("Account", [1, 2], reader.latest())
    {1: b'\\x92\\x05\\x01', 2: None}
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from epochal.config import SnapshotConfig
from epochal.errors import QueryError, SnapshotNotRetainedError
from epochal.recovery.snapshots import ACTOR_COLUMNS, Warehouse, actor_rows, read_manifests
from epochal.schemas.commands import ActorKey
from epochal.schemas.snapshots import Manifest

__all__ = ["SnapshotReader"]

logger = logging.getLogger(__name__)

_OPEN_TABLES = 32  # (actor type, version) pairs kept open; a version never changes


@dataclass(frozen=True)
class _Version:
    """One version of a state table: its dataset, and each file's row groups with their key
    ranges (None when a group has no statistics)."""

    dataset: ds.Dataset
    groups: list[tuple[ds.ParquetFileFragment, list[tuple[int, Any, Any]]]]

    @classmethod
    def open(cls, dataset: ds.Dataset) -> _Version:
        groups = []
        for fragment in dataset.get_fragments():
            ranges = []
            for group in fragment.row_groups:
                stats = (group.statistics or {}).get("_key") or {}
                ranges.append((group.id, stats.get("min"), stats.get("max")))
            groups.append((fragment, ranges))
        return cls(dataset, groups)

    @property
    def key(self) -> pc.Expression:
        """The ``_key`` column to compare (strings cast from ``string_view``: module doc)."""
        column = pc.field("_key")
        return column if pa.types.is_integer(self.dataset.schema.field("_key").type) else (
            column.cast(pa.string())
        )  # fmt: skip

    def pruned(self, may_hold: Callable[[Any, Any], bool]) -> ds.Dataset:
        """The dataset of the row groups whose key range ``[min, max]`` may hold a wanted key."""
        fragments = []
        for fragment, ranges in self.groups:
            ids = [i for i, lo, hi in ranges if lo is None or hi is None or may_hold(lo, hi)]
            if ids:
                fragments.append(fragment.subset(row_group_ids=ids))
        return ds.FileSystemDataset(
            fragments, self.dataset.schema, self.dataset.format, self.dataset.filesystem
        )


class SnapshotReader:
    """Point reads and key-range scans of any retained snapshot of one app.

    >>> reader = SnapshotReader(SnapshotConfig("warehouse"), "bank")
    >>> reader.scan("Account", 10, 20, ssid=120)  # [(10, b'...'), (11, b'...'), ...]

    Safe to share between threads (the query client reads from a thread pool).
    """

    def __init__(self, config: SnapshotConfig, app: str) -> None:
        self.warehouse = Warehouse(config.warehouse, app, config.storage_options)
        self._lock = threading.Lock()
        self._manifests: dict[int, Manifest] = {}
        self._datasets: OrderedDict[tuple[str, int], _Version] = OrderedDict()

    # --- the manifest ---------------------------------------------------------------------

    def refresh(self) -> list[Manifest]:
        """Read the manifest again: every retained snapshot, oldest first."""
        manifests = read_manifests(self.warehouse)
        with self._lock:
            self._manifests = {m.ssid: m for m in manifests}
        return manifests

    def ssids(self) -> list[int]:
        """The retained snapshots' ids, oldest first (the manifest as it is now)."""
        return [m.ssid for m in self.refresh()]

    def latest(self) -> int | None:
        """The newest complete snapshot's id, or None before the first."""
        ssids = self.ssids()
        return ssids[-1] if ssids else None

    def manifest(self, ssid: int) -> Manifest:
        """Snapshot ``ssid``'s manifest row; the manifest is read again only for an ssid not
        seen yet (a newer snapshot) or no longer retained."""
        found = self._manifests.get(ssid)
        if found is None:
            self.refresh()
            found = self._manifests.get(ssid)
        if found is None:
            raise self._not_retained(ssid)
        return found

    def _not_retained(self, ssid: int) -> SnapshotNotRetainedError:
        ssids = sorted(self._manifests)
        where = {"oldest": ssids[0], "newest": ssids[-1]} if ssids else {"retained": "none"}
        return SnapshotNotRetainedError(
            "no such snapshot: it expired or was never taken", ssid=ssid,
            app=self.warehouse.app, **where,
        )  # fmt: skip

    # --- reads ----------------------------------------------------------------------------

    def get(
        self, actor_type: str, keys: Iterable[ActorKey], ssid: int
    ) -> dict[ActorKey, bytes | None]:
        """The canonical bytes of each key's actor at snapshot ``ssid`` (None: no such actor)."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            self.manifest(ssid)  # still says whether the snapshot exists
            return {}
        version = self._version(actor_type, ssid)
        for key in wanted:
            _check_key(version.dataset, actor_type, key)
        ordered: list[Any] = sorted(wanted)

        def may_hold(lo: Any, hi: Any) -> bool:
            at = bisect.bisect_left(ordered, lo)
            return at < len(ordered) and ordered[at] <= hi

        condition = version.key.isin(wanted)
        found = dict(actor_rows(self._scan(version.pruned(may_hold), actor_type, ssid, condition)))
        return {key: found.get(key) for key in wanted}

    def scan(
        self,
        actor_type: str,
        lo: ActorKey | None,
        hi: ActorKey | None,
        ssid: int,
        limit: int | None = None,
    ) -> list[tuple[ActorKey, bytes]]:
        """The actors with keys in ``[lo, hi)`` (None: unbounded) at snapshot ``ssid``, in key
        order, at most ``limit`` of them."""
        version = self._version(actor_type, ssid)
        terms = []
        for bound, term in ((lo, version.key >= lo), (hi, version.key < hi)):
            if bound is not None:
                _check_key(version.dataset, actor_type, bound)
                terms.append(term)
        condition = reduce(lambda a, b: a & b, terms) if terms else None

        def may_hold(first: Any, last: Any) -> bool:
            return (lo is None or last >= lo) and (hi is None or first < hi)

        dataset = version.pruned(may_hold)
        rows = self._scan(dataset, actor_type, ssid, condition).sort_by("_key")
        return actor_rows(rows if limit is None else rows.slice(0, limit))

    def _version(self, actor_type: str, ssid: int) -> _Version:
        """The state table of ``actor_type`` at the version snapshot ``ssid`` names (cached)."""
        version = self.manifest(ssid).state_versions.get(actor_type, 0)
        with self._lock:
            cached = self._datasets.get((actor_type, version))
            if cached is not None:
                self._datasets.move_to_end((actor_type, version))
                return cached
        uri = self.warehouse.state(actor_type)
        try:
            table = DeltaTable(uri, version=version, storage_options=self.warehouse.options)
            opened = _Version.open(table.to_pyarrow_dataset())
        except TableNotFoundError as exc:
            raise QueryError("unknown actor type", actor_type=actor_type, table=uri) from exc
        except (DeltaError, OSError) as exc:
            raise self._failed(actor_type, ssid, exc) from exc
        with self._lock:
            self._datasets[actor_type, version] = opened
            while len(self._datasets) > _OPEN_TABLES:
                self._datasets.popitem(last=False)
        return opened

    def _scan(
        self, dataset: ds.Dataset, actor_type: str, ssid: int, condition: pc.Expression | None
    ) -> pa.Table:
        try:
            return dataset.to_table(columns=list(ACTOR_COLUMNS), filter=condition)
        except (OSError, pa.ArrowException, DeltaError) as exc:
            raise self._failed(actor_type, ssid, exc) from exc

    def _failed(self, actor_type: str, ssid: int, exc: Exception) -> QueryError:
        """A read that failed: the snapshot expired meanwhile (its files vacuumed), or not."""
        self.refresh()
        if ssid not in self._manifests:
            return self._not_retained(ssid)
        logger.warning("snapshot read failed ssid=%d actor_type=%s: %s", ssid, actor_type, exc)
        return QueryError("cannot read the snapshot", ssid=ssid, actor_type=actor_type,
                          reason=str(exc))  # fmt: skip


def _check_key(dataset: ds.Dataset, actor_type: str, key: object) -> None:
    """Keys are ints or strs, as the actor type's ``_key`` column says (a bool is no int)."""
    column = dataset.schema.field("_key").type
    expected = int if pa.types.is_integer(column) else str
    if not isinstance(key, expected) or isinstance(key, bool):
        raise QueryError("a key of the wrong type", actor_type=actor_type, key=repr(key),
                         expected=expected.__name__)  # fmt: skip
