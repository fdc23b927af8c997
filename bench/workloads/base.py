"""What a benchmark workload gives the harness: an app, a backlog, its rules in plain Python.

A workload is a frozen dataclass whose fields are its parameters (``epochal bench ycsbt --zipf
0.99`` sets ``zipf``: the CLI is made from the fields). It names the app ``epochal run`` starts
(``app``), the egress every measured transaction writes exactly one record to (``outputs``: its
result, or its abort report), and makes:

* ``backlog(transactions, partitions, seed)``: the input records, in production order. Records
  that load state come first and write no egress; then ``transactions`` measured ones, each
  writing one record to one of ``outputs``, so that the harness knows when a drain is over and
  can time each transaction from its input record to its egress record.
* ``plain()``: the same rules as one plain-Python function over a dict, with no epochal at all:
  the baseline that runs over the same exactly-once Kafka batches (``bench.baselines``), and the
  reference the tests compare the app's final state with.

Keys are drawn with :class:`KeyChooser`: uniform or Zipf-skewed over a fixed key space, and
single- or multi-partition on purpose, from the same range layout the cluster will use (the
app's ``key_sample`` split over ``partitions``).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

import msgspec

from epochal.actors.api import App, load_app
from epochal.actors.partitioning import KeyRanges
from epochal.schemas.commands import KeyRef

__all__ = ["Backlog", "KeyChooser", "Plain", "Record", "Workload", "encode", "zipf_weights"]

encode = msgspec.msgpack.encode


class Record(NamedTuple):
    """One input record: the app's topic name (``<app>.in.<topic>``), the Kafka key, the value."""

    topic: str
    key: bytes
    value: bytes


@dataclass(frozen=True)
class Backlog:
    """A workload's input: ``records`` in order; the last ``measured`` of them each egress once."""

    records: list[Record]
    measured: int

    @property
    def topics(self) -> list[str]:
        return sorted({r.topic for r in self.records})


class Plain(Protocol):
    """A workload's rules over a dict: one input record in, at most one egress record out."""

    state: dict[Any, Any]

    def __call__(self, topic: str, value: bytes) -> tuple[str, bytes] | None:
        """The egress name and record the input writes (None: a load record, no egress)."""
        ...


@dataclass(frozen=True)
class Workload:
    """The parameters of one workload; subclasses set the class variables and make a backlog."""

    name: ClassVar[str]  # as ``epochal bench`` names it
    app: ClassVar[str]  # module:attribute, for ``epochal run``
    outputs: ClassVar[tuple[str, ...]]  # egress names a measured transaction writes one record to
    topic: ClassVar[str] = "txns"  # the one input topic (``<app>.in.<topic>``): one order
    summary: ClassVar[str] = ""  # what the workload does, in a sentence or two
    anchor: ClassVar[str] = ""  # the published figure this workload is compared with
    anchor_rate: ClassVar[int | None] = None  # the rate the anchor's latency was measured at
    anchor_slowdown: ClassVar[float | None] = None  # the anchor's cost of transactions: x slower

    def backlog(self, transactions: int, partitions: int, seed: int) -> Backlog:
        raise NotImplementedError

    def plain(self) -> Plain:
        raise NotImplementedError

    def anchor_per_core(self) -> float | None:
        """The anchor's transactions per second per core in this setting, if it gives one."""
        return None

    def load_app(self) -> App:
        return load_app(self.app)

    def parameters(self) -> dict[str, Any]:
        """The fields, for a result's record."""
        return dataclasses.asdict(self)


def zipf_weights(n: int, theta: float) -> list[float]:
    """Cumulative weights of ranks 1..n under Zipf(``theta``) (0: uniform)."""
    return list(itertools.accumulate(1.0 / (rank**theta) for rank in range(1, n + 1)))


class KeyChooser:
    """Draws keys of one actor type from ``keys`` (uniform, or Zipf ``theta`` over a random
    permutation of them, so the hot keys spread over every partition), and sets of distinct keys
    that lie on one partition or on several (as many as asked at most), as the cluster's new
    layout places them."""

    def __init__(
        self,
        app: App,
        actor_type: str,
        keys: Sequence[Any],
        partitions: int,
        *,
        theta: float,
        rng: random.Random,
    ) -> None:
        self.keys = list(keys)
        rng.shuffle(self.keys)  # rank -> key
        self._cumulative = zipf_weights(len(self.keys), theta) if theta else None
        self._rng = rng
        ranges = KeyRanges.even(app, partitions)
        self._home = {key: ranges.partition_of(KeyRef(actor_type, key)) for key in self.keys}
        per_partition = Counter(self._home.values())
        self.partitions = len(per_partition)  # those the keys actually lie on
        self._fewest = min(per_partition.values())  # keys on the emptiest of them

    def one(self) -> Any:
        if self._cumulative is None:
            return self.keys[self._rng.randrange(len(self.keys))]
        total = self._cumulative[-1]
        return self.keys[bisect.bisect_left(self._cumulative, self._rng.random() * total)]

    def distinct(self, count: int, multi_partition: bool, span: int | None = None) -> list[Any]:
        """``count`` distinct keys; on one partition, or (``multi_partition``) on at least two
        and at most ``span`` (None: any number; TStream's multi-partition length). ValueError if
        the key space cannot give that (its keys all on one partition, or fewer than ``count``
        of them on any one, or on any ``span``)."""
        spread = multi_partition
        if spread and self.partitions < 2:
            raise ValueError("multi-partition transactions need keys on two partitions or more")
        if spread and span is not None and span < 2:
            raise ValueError(f"a multi-partition set spans two partitions or more, not {span}")
        most = min(span or self.partitions, self.partitions) if spread else 1
        if count > len(self.keys) or count > most * self._fewest:
            raise ValueError(f"{count} distinct keys on {most} partition(s): too few keys")
        first = self.one()
        chosen = [first]
        homes = {self._home[first]}
        while len(chosen) < count:
            key = self.one()
            if key in chosen:
                continue
            home = self._home[key]
            if home in homes and spread and len(homes) == 1:
                continue  # the second partition makes it multi-partition
            if home not in homes and len(homes) == most:
                continue  # one partition more than the set may span
            chosen.append(key)
            homes.add(home)
        return chosen
