"""TStream's four applications (ICDE 2020, "TStream: Scaling Data Stream Processing with
Concurrent State Access"), each a workload with its own app.

* ``tstream-gs``, Grep and Sum (``gs_app``): 10,000 rows, each a 128-character text and a
  number. A read transaction reads ``--length`` rows (10) and egresses the sum of their numbers;
  a write transaction gives the same rows a new text and number without reading them.
  ``--read-ratio`` (0.5) of the transactions read.
* ``tstream-sl``, Streaming Ledger (``sl_app``): 10,000 accounts and 10,000 assets, each
  starting with ``--start`` (100). A transfer moves an amount from one account to another and
  one from one asset to another (4 keys), and aborts if either source would go below zero (the
  ``balance >= 0`` constraint of both types); a deposit credits one account and one asset (2
  keys). Amounts are 1 to ``--max-amount`` (10); ``--transfer-ratio`` (0.5) are transfers.
* ``tstream-ob``, Online Bidding (``ob_app``): 10,000 items, each a price (1 to ``--max-price``,
  100) and a quantity (``--start``, 100). A bid buys 1 to ``--max-quantity`` (10) of one item,
  and aborts if its price is below the item's or too few are left (``quantity >= 0``); an alter
  sets new prices on ``--length`` items (20); a top adds 1 to ``--max-quantity`` to each of 20
  items. The mix is ``--bids``:``--alters``:``--tops`` (6:1:1).
* ``tstream-tp``, Toll Processing (``tp_app``): 100 road segments. A position report (a car of
  ``--cars``, 1,000, its segment and a speed of 0 to ``--max-speed``, 80) joins its segment's
  last 100 reports, and egresses the toll Linear Road charges from them: 2 * (cars - 50) ** 2
  when more than 50 distinct cars averaged under 40, else 0. One key per report.

Keys are Zipf-skewed with ``--zipf`` (TStream's default theta, 0.6; 0 is uniform), over a
random permutation of the keys (TP: of the segments). A share ``--multi-partition`` (TStream's
0.25) of the transactions of several keys (GS, SL, OB's alters and tops) has keys on more than
one partition of the cluster's layout, the others on one. A multi-partition transaction's keys
lie on at least two and at most ``--multi-partition-length`` partitions (TStream's 4): its keys
fall where they are drawn until they reach that many partitions, and the rest are drawn from
those (``KeyChooser.distinct``). So GS's 10 keys and OB's 20 usually span exactly that many, and
SL's 4 (a transfer) or 2 (a deposit) at most their number. A length above the layout's
partitions bounds nothing: 2 workers have 4 partitions, and ``--quick``'s 1 worker has 2.

Each app reads one input topic, ``txns``: one load record per key first (no egress), then the
measured transactions, each writing one record to ``results`` or, if it aborts, an abort report
to ``errors`` (GS and TP never abort, but report to ``errors`` too, so that a drain never waits
for a record that is not coming). One topic keeps one order, so the plain rules applied record
by record are the app's. Starting balances, amounts, prices, quantities and speeds are this
module's choices, not TStream's.

    epochal bench tstream-gs --read-ratio 0.8
    epochal bench tstream-ob --zipf 0.99 --multi-partition 0.5
    epochal bench tstream-gs --multi-partition 1 --multi-partition-length 2
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import msgspec

from bench.workloads.base import Backlog, KeyChooser, Record, Workload, encode
from epochal.actors.api import App
from epochal.actors.context import Context

__all__ = [
    "GrepSum",
    "OnlineBidding",
    "PlainGrepSum",
    "PlainOnlineBidding",
    "PlainStreamingLedger",
    "PlainTollProcessing",
    "StreamingLedger",
    "TollProcessing",
    "gs_app",
    "linear_road_toll",
    "ob_app",
    "sl_app",
    "tp_app",
]

TOPIC = "txns"
ANCHOR = (
    "TStream (ICDE 2020): up to 4.8x the throughput of lock-based concurrency control, at "
    "similar latency, on one multicore machine. TStream reports shapes, not absolute numbers "
    "comparable here: its figures' trends under skew, multi-partition ratio/length and "
    "punctuation interval"
)


def _record(key: int, event: msgspec.Struct) -> Record:
    return Record(TOPIC, b"%d" % key, encode(event))


def _check_multi_partition_length(length: int) -> None:
    """A multi-partition transaction spans two partitions at least: a bound below that is no
    multi-partition length."""
    if length < 2:
        raise ValueError(
            "multi_partition_length: the most partitions a multi-partition transaction spans, "
            f"2 or more, not {length}"
        )


# --- GS: Grep and Sum -------------------------------------------------------------------------

ROWS = 10_000
TEXT_BYTES = 64  # as hex: 128 characters

gs_app = App("tstream_gs")


@gs_app.actor(key=int, key_sample=range(ROWS))
class Row(msgspec.Struct):
    """A 128-character text (the bulk TStream's GS moves) and the number reads sum."""

    text: str = ""
    number: int = 0


class LoadRow(msgspec.Struct, frozen=True, tag=True):
    key: int
    text: str
    number: int


class ReadRows(msgspec.Struct, frozen=True, tag=True):
    """Read the rows, egress the sum of their numbers."""

    keys: tuple[int, ...]


class WriteRows(msgspec.Struct, frozen=True, tag=True):
    """Give the rows this text and number: blind writes, nothing read."""

    keys: tuple[int, ...]
    text: str
    number: int


class RowsSum(msgspec.Struct, frozen=True):
    keys: tuple[int, ...]
    total: int


class RowsWritten(msgspec.Struct, frozen=True):
    keys: tuple[int, ...]


@gs_app.transaction(topic=TOPIC, event=LoadRow, keys=lambda e: {Row: [e.key]})
def gs_load(ctx: Context, e: LoadRow) -> None:
    ctx.put(e.key, Row(e.text, e.number))


@gs_app.transaction(topic=TOPIC, event=ReadRows, keys=lambda e: {Row: e.keys}, aborts_to="errors")
def gs_read(ctx: Context, e: ReadRows) -> None:
    ctx.egress("results", RowsSum(e.keys, sum(ctx.get(Row, key).number for key in e.keys)))


@gs_app.transaction(topic=TOPIC, event=WriteRows, keys=lambda e: {Row: e.keys}, aborts_to="errors")
def gs_write(ctx: Context, e: WriteRows) -> None:
    for key in e.keys:
        ctx.put(key, Row(e.text, e.number))
    ctx.egress("results", RowsWritten(e.keys))


@dataclass(frozen=True)
class GrepSum(Workload):
    """GS's parameters: rows, keys per transaction, read share, skew, multi-partition share and
    length (the most partitions one spans)."""

    name: ClassVar[str] = "tstream-gs"
    summary: ClassVar[str] = (
        "TStream's grep and sum: 10,000 rows of 128 bytes; a transaction reads 10 rows and "
        "egresses their sum, or writes all 10 (read share 0.5), Zipf 0.6, a quarter of them "
        "multi-partition."
    )
    app: ClassVar[str] = "bench.workloads.tstream:gs_app"
    outputs: ClassVar[tuple[str, ...]] = ("results", "errors")
    anchor: ClassVar[str] = ANCHOR

    rows: int = ROWS
    length: int = 10
    read_ratio: float = 0.5
    zipf: float = 0.6
    multi_partition: float = 0.25
    multi_partition_length: int = 4

    def __post_init__(self) -> None:
        _check_multi_partition_length(self.multi_partition_length)

    def backlog(self, transactions: int, partitions: int, seed: int) -> Backlog:
        rng = random.Random(seed)
        choose = KeyChooser(gs_app, "Row", range(self.rows), partitions, theta=self.zipf, rng=rng)
        records = [
            _record(key, LoadRow(key, rng.randbytes(TEXT_BYTES).hex(), key))
            for key in range(self.rows)
        ]
        for _ in range(transactions):
            spread = rng.random() < self.multi_partition
            keys = tuple(choose.distinct(self.length, spread, self.multi_partition_length))
            event: ReadRows | WriteRows
            if rng.random() < self.read_ratio:
                event = ReadRows(keys)
            else:
                event = WriteRows(keys, rng.randbytes(TEXT_BYTES).hex(), rng.randrange(1_000))
            records.append(_record(keys[0], event))
        return Backlog(records, transactions)

    def plain(self) -> PlainGrepSum:
        return PlainGrepSum()


class PlainGrepSum:
    """GS's rules over a dict of rows: key -> (text, number)."""

    def __init__(self) -> None:
        self.state: dict[int, tuple[str, int]] = {}
        self._decoder = msgspec.msgpack.Decoder(LoadRow | ReadRows | WriteRows)

    def __call__(self, topic: str, value: bytes) -> tuple[str, bytes] | None:
        event = self._decoder.decode(value)
        rows = self.state
        if isinstance(event, LoadRow):
            rows[event.key] = (event.text, event.number)
            return None
        if isinstance(event, ReadRows):
            total = sum(rows.get(key, ("", 0))[1] for key in event.keys)
            return "results", encode(RowsSum(event.keys, total))
        for key in event.keys:
            rows[key] = (event.text, event.number)
        return "results", encode(RowsWritten(event.keys))


# --- SL: Streaming Ledger ---------------------------------------------------------------------

LEDGER_KEYS = 10_000

sl_app = App("tstream_sl")


@sl_app.actor(
    key=int,
    key_sample=range(LEDGER_KEYS),
    constraints={"balance >= 0": lambda a: a.balance >= 0},
)
class Account(msgspec.Struct):
    balance: int = 0


@sl_app.actor(
    key=int,
    key_sample=range(LEDGER_KEYS),
    constraints={"balance >= 0": lambda a: a.balance >= 0},
)
class Asset(msgspec.Struct):
    balance: int = 0


class LoadLedger(msgspec.Struct, frozen=True, tag=True):
    """Account ``key`` and asset ``key`` start with these balances."""

    key: int
    account: int
    asset: int


class Deposit(msgspec.Struct, frozen=True, tag=True):
    account: int
    asset: int
    account_amount: int
    asset_amount: int


class Transfer(msgspec.Struct, frozen=True, tag=True):
    """Both legs or neither: money between accounts, units between assets."""

    src_account: int
    dst_account: int
    src_asset: int
    dst_asset: int
    account_amount: int
    asset_amount: int


class Balances(msgspec.Struct, frozen=True):
    """A deposit's credited balances, or a transfer's debited (source) ones."""

    account: int
    asset: int


@sl_app.transaction(
    topic=TOPIC, event=LoadLedger, keys=lambda e: {Account: [e.key], Asset: [e.key]}
)
def sl_load(ctx: Context, e: LoadLedger) -> None:
    ctx.put(e.key, Account(e.account))
    ctx.put(e.key, Asset(e.asset))


@sl_app.transaction(
    topic=TOPIC,
    event=Deposit,
    keys=lambda e: {Account: [e.account], Asset: [e.asset]},
    aborts_to="errors",
)
def sl_deposit(ctx: Context, e: Deposit) -> None:
    account, asset = ctx.get(Account, e.account), ctx.get(Asset, e.asset)
    account.balance += e.account_amount
    asset.balance += e.asset_amount
    ctx.put(e.account, account)
    ctx.put(e.asset, asset)
    ctx.egress("results", Balances(account.balance, asset.balance))


@sl_app.transaction(
    topic=TOPIC,
    event=Transfer,
    keys=lambda e: {Account: [e.src_account, e.dst_account], Asset: [e.src_asset, e.dst_asset]},
    aborts_to="errors",
)
def sl_transfer(ctx: Context, e: Transfer) -> None:
    """A source below zero breaks ``balance >= 0``: the whole transfer aborts."""
    src_account, dst_account = ctx.get(Account, e.src_account), ctx.get(Account, e.dst_account)
    src_asset, dst_asset = ctx.get(Asset, e.src_asset), ctx.get(Asset, e.dst_asset)
    src_account.balance -= e.account_amount
    dst_account.balance += e.account_amount
    src_asset.balance -= e.asset_amount
    dst_asset.balance += e.asset_amount
    ctx.put(e.src_account, src_account)
    ctx.put(e.dst_account, dst_account)
    ctx.put(e.src_asset, src_asset)
    ctx.put(e.dst_asset, dst_asset)
    ctx.egress("results", Balances(src_account.balance, src_asset.balance))


@dataclass(frozen=True)
class StreamingLedger(Workload):
    """SL's parameters: keys per type, starting balance, largest amount, transfer share, skew,
    multi-partition share and length (the most partitions one spans). Account ``i`` and asset
    ``i`` lie on the same partition (both types sample ``range(keys)``), so one chooser draws
    keys of both."""

    name: ClassVar[str] = "tstream-sl"
    summary: ClassVar[str] = (
        "TStream's streaming ledger: 10,000 accounts and 10,000 assets; a transfer moves money "
        "and assets between two of each (4 keys, aborting on an overdraft), a deposit credits "
        "one of each (2 keys), half and half, Zipf 0.6, a quarter multi-partition."
    )
    app: ClassVar[str] = "bench.workloads.tstream:sl_app"
    outputs: ClassVar[tuple[str, ...]] = ("results", "errors")
    anchor: ClassVar[str] = ANCHOR

    keys: int = LEDGER_KEYS
    start: int = 100
    max_amount: int = 10
    transfer_ratio: float = 0.5
    zipf: float = 0.6
    multi_partition: float = 0.25
    multi_partition_length: int = 4

    def __post_init__(self) -> None:
        _check_multi_partition_length(self.multi_partition_length)

    def backlog(self, transactions: int, partitions: int, seed: int) -> Backlog:
        rng = random.Random(seed)
        choose = KeyChooser(
            sl_app, "Account", range(self.keys), partitions, theta=self.zipf, rng=rng
        )
        records = [
            _record(key, LoadLedger(key, self.start, self.start)) for key in range(self.keys)
        ]
        for _ in range(transactions):
            transfer = rng.random() < self.transfer_ratio
            spread = rng.random() < self.multi_partition
            keys = choose.distinct(4 if transfer else 2, spread, self.multi_partition_length)
            money, units = rng.randint(1, self.max_amount), rng.randint(1, self.max_amount)
            event: Transfer | Deposit
            if transfer:  # the two accounts first: a multi-partition draw splits those
                event = Transfer(keys[0], keys[1], keys[2], keys[3], money, units)
            else:
                event = Deposit(keys[0], keys[1], money, units)
            records.append(_record(keys[0], event))
        return Backlog(records, transactions)

    def plain(self) -> PlainStreamingLedger:
        return PlainStreamingLedger()


class PlainStreamingLedger:
    """SL's rules over one dict of balances: ("Account" or "Asset", key) -> balance."""

    def __init__(self) -> None:
        self.state: dict[tuple[str, int], int] = {}
        self._decoder = msgspec.msgpack.Decoder(LoadLedger | Deposit | Transfer)

    def __call__(self, topic: str, value: bytes) -> tuple[str, bytes] | None:
        event = self._decoder.decode(value)
        balances = self.state
        if isinstance(event, LoadLedger):
            balances["Account", event.key] = event.account
            balances["Asset", event.key] = event.asset
            return None
        if isinstance(event, Deposit):
            account = balances.get(("Account", event.account), 0) + event.account_amount
            asset = balances.get(("Asset", event.asset), 0) + event.asset_amount
            balances["Account", event.account], balances["Asset", event.asset] = account, asset
            return "results", encode(Balances(account, asset))
        account = balances.get(("Account", event.src_account), 0) - event.account_amount
        asset = balances.get(("Asset", event.src_asset), 0) - event.asset_amount
        if account < 0 or asset < 0:
            return "errors", encode(event)
        balances["Account", event.src_account] = account
        balances["Asset", event.src_asset] = asset
        dst_account, dst_asset = ("Account", event.dst_account), ("Asset", event.dst_asset)
        balances[dst_account] = balances.get(dst_account, 0) + event.account_amount
        balances[dst_asset] = balances.get(dst_asset, 0) + event.asset_amount
        return "results", encode(Balances(account, asset))


# --- OB: Online Bidding -----------------------------------------------------------------------

ITEMS = 10_000

ob_app = App("tstream_ob")


@ob_app.actor(
    key=int, key_sample=range(ITEMS), constraints={"quantity >= 0": lambda i: i.quantity >= 0}
)
class Item(msgspec.Struct):
    price: int = 0
    quantity: int = 0


class LoadItem(msgspec.Struct, frozen=True, tag=True):
    key: int
    price: int
    quantity: int


class Bid(msgspec.Struct, frozen=True, tag=True):
    """Buy ``quantity`` of ``item`` if ``price`` is at least its price and enough are left."""

    item: int
    price: int
    quantity: int


class Alter(msgspec.Struct, frozen=True, tag=True):
    """New prices, one per item."""

    items: tuple[int, ...]
    prices: tuple[int, ...]


class Top(msgspec.Struct, frozen=True, tag=True):
    """More of each item, one quantity per item."""

    items: tuple[int, ...]
    quantities: tuple[int, ...]


class Sold(msgspec.Struct, frozen=True):
    item: int
    price: int
    left: int


class Updated(msgspec.Struct, frozen=True):
    items: tuple[int, ...]


class BidTooLow(ValueError):
    """A bid under the item's price: it aborts (reported on ``errors``)."""


@ob_app.transaction(topic=TOPIC, event=LoadItem, keys=lambda e: {Item: [e.key]})
def ob_load(ctx: Context, e: LoadItem) -> None:
    ctx.put(e.key, Item(e.price, e.quantity))


@ob_app.transaction(topic=TOPIC, event=Bid, keys=lambda e: {Item: [e.item]}, aborts_to="errors")
def ob_bid(ctx: Context, e: Bid) -> None:
    """Too few left breaks ``quantity >= 0``: the bid aborts."""
    item = ctx.get(Item, e.item)
    if e.price < item.price:
        raise BidTooLow(f"bid {e.price} under the price {item.price} of item {e.item}")
    item.quantity -= e.quantity
    ctx.put(e.item, item)
    ctx.egress("results", Sold(e.item, item.price, item.quantity))


@ob_app.transaction(topic=TOPIC, event=Alter, keys=lambda e: {Item: e.items}, aborts_to="errors")
def ob_alter(ctx: Context, e: Alter) -> None:
    for key, price in zip(e.items, e.prices, strict=True):
        item = ctx.get(Item, key)
        item.price = price
        ctx.put(key, item)
    ctx.egress("results", Updated(e.items))


@ob_app.transaction(topic=TOPIC, event=Top, keys=lambda e: {Item: e.items}, aborts_to="errors")
def ob_top(ctx: Context, e: Top) -> None:
    for key, quantity in zip(e.items, e.quantities, strict=True):
        item = ctx.get(Item, key)
        item.quantity += quantity
        ctx.put(key, item)
    ctx.egress("results", Updated(e.items))


@dataclass(frozen=True)
class OnlineBidding(Workload):
    """OB's parameters: items, their prices and starting quantity, the largest quantity a bid
    buys or a top adds, keys per alter and top, the bid:alter:top mix, skew, multi-partition
    share and length (the most partitions one spans; of alters and tops: a bid has one key)."""

    name: ClassVar[str] = "tstream-ob"
    summary: ClassVar[str] = (
        "TStream's online bidding: 10,000 items; a bid buys from one item (aborting if it bids "
        "too low or too few are left), an alter re-prices 20, a top restocks 20, 6:1:1, Zipf 0.6, "
        "a quarter of alters and tops multi-partition."
    )
    app: ClassVar[str] = "bench.workloads.tstream:ob_app"
    outputs: ClassVar[tuple[str, ...]] = ("results", "errors")
    anchor: ClassVar[str] = ANCHOR

    items: int = ITEMS
    max_price: int = 100
    start: int = 100
    max_quantity: int = 10
    length: int = 20
    bids: int = 6
    alters: int = 1
    tops: int = 1
    zipf: float = 0.6
    multi_partition: float = 0.25
    multi_partition_length: int = 4

    def __post_init__(self) -> None:
        _check_multi_partition_length(self.multi_partition_length)

    def backlog(self, transactions: int, partitions: int, seed: int) -> Backlog:
        rng = random.Random(seed)
        choose = KeyChooser(ob_app, "Item", range(self.items), partitions, theta=self.zipf, rng=rng)
        records = [
            _record(key, LoadItem(key, rng.randint(1, self.max_price), self.start))
            for key in range(self.items)
        ]
        mix = (Bid, Alter, Top)
        weights = (self.bids, self.alters, self.tops)
        for _ in range(transactions):
            kind = rng.choices(mix, weights)[0]
            event: Alter | Top
            if kind is Bid:
                item = choose.one()
                price, quantity = rng.randint(1, self.max_price), rng.randint(1, self.max_quantity)
                records.append(_record(item, Bid(item, price, quantity)))
                continue
            spread = rng.random() < self.multi_partition
            keys = tuple(choose.distinct(self.length, spread, self.multi_partition_length))
            if kind is Alter:
                event = Alter(keys, tuple(rng.randint(1, self.max_price) for _ in keys))
            else:
                event = Top(keys, tuple(rng.randint(1, self.max_quantity) for _ in keys))
            records.append(_record(keys[0], event))
        return Backlog(records, transactions)

    def plain(self) -> PlainOnlineBidding:
        return PlainOnlineBidding()


class PlainOnlineBidding:
    """OB's rules over a dict of items: key -> (price, quantity)."""

    def __init__(self) -> None:
        self.state: dict[int, tuple[int, int]] = {}
        self._decoder = msgspec.msgpack.Decoder(LoadItem | Bid | Alter | Top)

    def __call__(self, topic: str, value: bytes) -> tuple[str, bytes] | None:
        event = self._decoder.decode(value)
        items = self.state
        if isinstance(event, LoadItem):
            items[event.key] = (event.price, event.quantity)
            return None
        if isinstance(event, Bid):
            price, quantity = items.get(event.item, (0, 0))
            if event.price < price or quantity < event.quantity:
                return "errors", encode(event)
            items[event.item] = (price, quantity - event.quantity)
            return "results", encode(Sold(event.item, price, quantity - event.quantity))
        if isinstance(event, Alter):
            for key, new_price in zip(event.items, event.prices, strict=True):
                items[key] = (new_price, items.get(key, (0, 0))[1])
        else:
            for key, more in zip(event.items, event.quantities, strict=True):
                price, quantity = items.get(key, (0, 0))
                items[key] = (price, quantity + more)
        return "results", encode(Updated(event.items))


# --- TP: Toll Processing ----------------------------------------------------------------------

SEGMENTS = 100
WINDOW = 100
"""Reports per segment a toll looks at: Linear Road's last minute, as a count (no clock kept)."""

tp_app = App("tstream_tp")


@tp_app.actor(key=int, key_sample=range(SEGMENTS))
class Segment(msgspec.Struct):
    """The segment's last ``WINDOW`` reports, oldest first: their cars and speeds."""

    cars: list[int] = msgspec.field(default_factory=list)
    speeds: list[int] = msgspec.field(default_factory=list)


class LoadSegment(msgspec.Struct, frozen=True, tag=True):
    key: int


class Report(msgspec.Struct, frozen=True, tag=True):
    """A car's position report: on ``segment`` at ``speed``."""

    car: int
    segment: int
    speed: int


class Toll(msgspec.Struct, frozen=True):
    car: int
    segment: int
    toll: int
    cars: int
    average_speed: int


def linear_road_toll(cars: int, average_speed: int) -> int:
    """Linear Road's toll: 2 * (cars - 50) ** 2 on a congested segment (more than 50 cars,
    averaging under 40), else none."""
    return 2 * (cars - 50) ** 2 if cars > 50 and average_speed < 40 else 0


@tp_app.transaction(topic=TOPIC, event=LoadSegment, keys=lambda e: {Segment: [e.key]})
def tp_load(ctx: Context, e: LoadSegment) -> None:
    ctx.put(e.key, Segment())


@tp_app.transaction(
    topic=TOPIC, event=Report, keys=lambda e: {Segment: [e.segment]}, aborts_to="errors"
)
def tp_report(ctx: Context, e: Report) -> None:
    segment = ctx.get(Segment, e.segment)
    segment.cars = [*segment.cars[1 - WINDOW :], e.car]
    segment.speeds = [*segment.speeds[1 - WINDOW :], e.speed]
    ctx.put(e.segment, segment)
    cars, average = len(set(segment.cars)), sum(segment.speeds) // len(segment.speeds)
    ctx.egress("results", Toll(e.car, e.segment, linear_road_toll(cars, average), cars, average))


@dataclass(frozen=True)
class TollProcessing(Workload):
    """TP's parameters: segments, cars, top speed, skew over segments (one key per report, so
    no multi-partition share)."""

    name: ClassVar[str] = "tstream-tp"
    summary: ClassVar[str] = (
        "TStream's toll processing: position reports over 100 road segments (Zipf 0.6); each "
        "updates its segment's last 100 reports and egresses the Linear Road toll."
    )
    app: ClassVar[str] = "bench.workloads.tstream:tp_app"
    outputs: ClassVar[tuple[str, ...]] = ("results", "errors")
    anchor: ClassVar[str] = ANCHOR

    segments: int = SEGMENTS
    cars: int = 1_000
    max_speed: int = 80
    zipf: float = 0.6

    def backlog(self, transactions: int, partitions: int, seed: int) -> Backlog:
        rng = random.Random(seed)
        choose = KeyChooser(
            tp_app, "Segment", range(self.segments), partitions, theta=self.zipf, rng=rng
        )
        records = [_record(key, LoadSegment(key)) for key in range(self.segments)]
        for _ in range(transactions):
            segment = choose.one()
            report = Report(rng.randrange(self.cars), segment, rng.randint(0, self.max_speed))
            records.append(_record(segment, report))
        return Backlog(records, transactions)

    def plain(self) -> PlainTollProcessing:
        return PlainTollProcessing()


class PlainTollProcessing:
    """TP's rules over a dict of segments: key -> (cars, speeds) of its last reports."""

    def __init__(self) -> None:
        self.state: dict[int, tuple[list[int], list[int]]] = {}
        self._decoder = msgspec.msgpack.Decoder(LoadSegment | Report)

    def __call__(self, topic: str, value: bytes) -> tuple[str, bytes] | None:
        event = self._decoder.decode(value)
        if isinstance(event, LoadSegment):
            self.state[event.key] = ([], [])
            return None
        cars, speeds = self.state.setdefault(event.segment, ([], []))
        cars.append(event.car)
        speeds.append(event.speed)
        del cars[:-WINDOW], speeds[:-WINDOW]
        distinct, average = len(set(cars)), sum(speeds) // len(speeds)
        toll = linear_road_toll(distinct, average)
        return "results", encode(Toll(event.car, event.segment, toll, distinct, average))
