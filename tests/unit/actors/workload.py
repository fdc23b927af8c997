"""A test application that exercises every path of the engine, and a workload generator.

Transfers between accounts spread over partitions (multi-partition transactions), a constraint
(balance >= 0), a handler that touches an undeclared key, interior transactions (audits) that
sometimes abort, a count window, ctx.random and ctx.now, egress and deletes.

And handlers written the way careless users write them, each of which once made participants of
one transaction disagree: one that changes its event in place (``e.amount += e.fee``), one that
stores ill-typed values (a float in an int field, an int in a float field), one that emits an
event sharing a list with the state and then changes that list, and one that uses a key equal to
a declared one but of another type (``1.0`` or ``True`` for ``1``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import msgspec
from hypothesis import strategies as st

from epochal.actors.api import App
from epochal.actors.context import Context
from epochal.actors.windows import CountWindow
from epochal.log.command_log import MemoryCommandLog
from epochal.log.ordering import EpochStamp, order
from epochal.schemas.codec import encode
from epochal.schemas.commands import EpochRecord, InputRecord

ACCOUNTS = 40
app = App("testbank")


@app.actor(
    key=int, constraints={"balance >= 0": lambda a: a.balance >= 0}, key_sample=range(ACCOUNTS)
)
class Account(msgspec.Struct):
    balance: int = 0
    touched: int = 0


@app.actor(key=str, key_sample=["audit"])
class AuditLog(msgspec.Struct):
    count: int = 0
    total: int = 0
    lucky: float = 0.0
    recent: CountWindow[int] = msgspec.field(default_factory=lambda: CountWindow(size=5, slide=2))
    slides: int = 0


class Deposit(msgspec.Struct, frozen=True, tag=True):
    account: int
    amount: int


class Transfer(msgspec.Struct, frozen=True, tag=True):
    source: int
    target: int
    amount: int


class Close(msgspec.Struct, frozen=True, tag=True):
    account: int


class Split(msgspec.Struct, frozen=True, tag=True):
    """Half of ``amount`` to each target: three accounts, on up to three workers."""

    source: int
    first: int
    second: int
    amount: int


class Sneaky(msgspec.Struct, frozen=True, tag=True):
    account: int


class FeeTransfer(msgspec.Struct, tag=True):  # mutable: the handler changes it in place
    source: int
    target: int
    amount: int
    fee: int
    notes: list[str] = msgspec.field(default_factory=lambda: ["a", "b"])


class Scale(msgspec.Struct, frozen=True, tag=True):
    account: int
    percent: int


class Share(msgspec.Struct, frozen=True, tag=True):
    account: int


class Alias(msgspec.Struct, frozen=True, tag=True):
    account: int
    kind: int  # 0: the declared int, 1: the same as a float, 2: as a bool


class Audit(msgspec.Struct, frozen=True):
    source: int
    amount: int


class Note(msgspec.Struct):
    account: int
    items: list[int]


class Receipt(msgspec.Struct, frozen=True):
    source: int
    target: int
    amount: int
    at_ms: int


@app.transaction(topic="ops", event=Deposit, keys=lambda e: {Account: [e.account]})
def deposit(ctx: Context, e: Deposit) -> None:
    account = ctx.get(Account, e.account)
    account.balance += e.amount
    account.touched += 1
    ctx.put(e.account, account)


@app.transaction(
    topic="ops",
    event=Transfer,
    keys=lambda e: {Account: [e.source, e.target]},
    aborts_to="errors",
    client=True,
)
def transfer(ctx: Context, e: Transfer) -> None:
    if e.source == e.target:
        raise ValueError("transfer to itself")
    source, target = ctx.get(Account, e.source), ctx.get(Account, e.target)
    source.balance -= e.amount  # may break balance >= 0: then the whole transfer aborts
    target.balance += e.amount
    source.touched += 1
    target.touched += 1
    ctx.put(e.source, source)
    ctx.put(e.target, target)
    ctx.egress("receipts", Receipt(e.source, e.target, e.amount, ctx.now()))
    if e.amount >= 30:
        ctx.emit(Audit(e.source, e.amount))


@app.transaction(topic="ops", event=Split, keys=lambda e: {Account: [e.source, e.first, e.second]})
def split(ctx: Context, e: Split) -> None:
    half = e.amount // 2
    for key, change in ((e.source, -2 * half), (e.first, half), (e.second, half)):
        account = ctx.get(Account, key)  # a key named twice sees its own write
        account.balance += change
        ctx.put(key, account)


@app.transaction(topic="ops", event=Close, keys=lambda e: {Account: [e.account]})
def close(ctx: Context, e: Close) -> None:
    if ctx.get(Account, e.account).balance != 0:
        raise ValueError("only an empty account can be closed")
    ctx.delete(Account, e.account)


@app.transaction(topic="ops", event=Sneaky, keys=lambda e: {Account: [e.account]})
def sneaky(ctx: Context, e: Sneaky) -> None:
    account = ctx.get(Account, e.account)
    account.balance += 1
    ctx.put(e.account, account)
    with contextlib.suppress(Exception):  # not declared: aborts even though it is caught
        ctx.get(Account, e.account + 1)


@app.transaction(
    topic="ops", event=FeeTransfer, keys=lambda e: {Account: [e.source, e.target]}, client=True
)
def fee_transfer(ctx: Context, e: FeeTransfer) -> None:
    e.amount += e.fee  # normalises its event in place: the debit includes the fee
    note = e.notes.pop() if e.notes else "none"
    source, target = ctx.get(Account, e.source), ctx.get(Account, e.target)
    source.balance -= e.amount
    target.balance += e.amount - e.fee
    ctx.put(e.source, source)
    ctx.put(e.target, target)
    ctx.egress("receipts", {"fee": e.fee, "debit": e.amount, "note": note, "left": e.notes})


@app.transaction(topic="ops", event=Scale, keys=lambda e: {Account: [e.account]})
def scale(ctx: Context, e: Scale) -> None:
    account = ctx.get(Account, e.account)
    account.balance = account.balance * (100 + e.percent) / 100  # type: ignore[assignment]
    if e.percent % 2 == 0:
        account.balance = round(account.balance)  # an int again: fine
    ctx.put(e.account, account)  # odd percents leave a float in an int field: aborts


@app.transaction(topic="ops", event=Share, keys=lambda e: {AuditLog: ["audit"]})
def share(ctx: Context, e: Share) -> None:
    log = ctx.get(AuditLog, "audit")
    log.lucky = round(ctx.random() * 10)  # an int in a float field: stored as a float
    ctx.emit(Note(e.account, log.recent.items))  # shares a list with the state ...
    log.recent.items.append(1_000 + e.account)  # ... which then changes
    log.recent.items = log.recent.items[-5:]
    ctx.put("audit", log)


@app.transaction(topic="ops", event=Alias, keys=lambda e: {Account: [e.account]})
def alias(ctx: Context, e: Alias) -> None:
    key = [e.account, float(e.account), e.account == e.account][e.kind]
    account = ctx.get(Account, key)  # type: ignore[arg-type]
    account.touched += 1
    ctx.put(e.account, account)


@app.transaction(event=Note, keys=lambda e: {AuditLog: ["audit"], Account: [e.account]})
def note(ctx: Context, e: Note) -> None:
    log = ctx.get(AuditLog, "audit")
    log.total += sum(e.items) + len(e.items)
    e.items.append(-1)  # its own copy
    ctx.put("audit", log)
    account = ctx.get(Account, e.account)
    account.touched += len(e.items)
    ctx.put(e.account, account)


@app.transaction(event=Audit, keys=lambda e: {AuditLog: ["audit"], Account: [e.source]})
def audit(ctx: Context, e: Audit) -> None:
    if e.amount % 7 == 0:
        raise RuntimeError("auditor dislikes multiples of 7")
    log = ctx.get(AuditLog, "audit")
    log.count += 1
    log.total += e.amount
    log.lucky = ctx.random()
    if log.recent.add(e.amount):
        log.slides += 1
    ctx.put("audit", log)
    account = ctx.get(Account, e.source)
    account.touched += 100
    ctx.put(e.source, account)


# mostly a few hot accounts spread over every partition, so that transactions conflict often
keys = st.one_of(st.sampled_from(range(0, ACCOUNTS, 5)), st.integers(0, ACCOUNTS - 1))
operations = st.one_of(
    st.builds(Deposit, keys, st.integers(1, 100)),
    st.builds(Transfer, keys, keys, st.integers(1, 80)),
    st.builds(Close, keys),
    st.builds(Split, keys, keys, keys, st.integers(1, 60)),
    st.builds(Sneaky, keys),
    st.builds(FeeTransfer, keys, keys, st.integers(1, 40), st.integers(0, 10)),
    st.builds(Scale, keys, st.integers(0, 20)),
    st.builds(Share, keys),
    st.builds(Alias, keys, st.integers(0, 2)),
)
# a batch per epoch; b"\xc1" is never valid msgpack: a dead letter among the valid records
batches = st.lists(
    st.lists(st.one_of(operations, st.just(b"\xc1")), max_size=25), min_size=1, max_size=6
)


def command_log(
    batches: Sequence[Sequence[object]], partitions: int = 3, snapshot_every: int = 0
) -> list[EpochRecord]:
    """Sequence the batches as the sequencer would (records spread over input partitions) into
    the in-memory twin of the command log, and read the epochs back from it; with
    ``snapshot_every`` n, every n-th epoch ends with a snapshot."""
    log, offset = MemoryCommandLog(chunk_bytes=256), 0  # small chunks: epochs span several
    for epoch, batch in enumerate(batches):
        inputs = []
        for op in batch:
            value = op if isinstance(op, bytes) else encode(op)
            inputs.append(InputRecord("testbank.in.ops", offset % partitions, offset, value))
            offset += 1
        snapshot = snapshot_every > 0 and epoch % snapshot_every == snapshot_every - 1
        stamp = EpochStamp(epoch, 1_000_000 + epoch * 20, 1234 + epoch, app.code_hash(), snapshot)
        log.append(order(app, stamp, inputs).record)
    return [logged.record for logged in log.epochs()]


def several_slices(epochs: int = 3, seed: int = 11) -> list[EpochRecord]:
    """Deposits, then ``epochs`` epochs of random transfers, each more than two of the slices a
    worker plans and runs at a time (``PLAN_SLICE``); a third of the transfers emit an audit, so
    an epoch opens with more interior transactions than one slice holds."""
    import random

    from epochal.actors.plan import PLAN_SLICE

    rng = random.Random(seed)

    def transfer() -> Transfer:
        return Transfer(rng.randrange(ACCOUNTS), rng.randrange(ACCOUNTS), rng.randrange(1, 80))

    transfers = [[transfer() for _ in range(2 * PLAN_SLICE + 37)] for _ in range(epochs)]
    return command_log([[Deposit(a, 1_000) for a in range(ACCOUNTS)], *transfers])
