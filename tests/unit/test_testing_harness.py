"""epochal.testing: an app in this process, with the sequencer's ordering and the engine's
semantics (dead letters, aborts, interior transactions, ctx.call, windows, time, randomness),
a determinism check that can fail, and replay of a saved command log."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import msgspec
import pytest

from epochal.actors.api import App
from epochal.actors.context import Context
from epochal.actors.engine import EpochResult
from epochal.actors.oracle import SerialOracle
from epochal.actors.windows import TimeWindow
from epochal.errors import RecoveryError
from epochal.schemas.commands import InputPosition, KeyRef
from epochal.testing import (
    START_MS,
    Abort,
    AppTest,
    CommandLogWriter,
    Emit,
    SavedStart,
    read_command_log,
)
from epochal.testing_plugin import AppTestFactory
from examples.bank.app import Account, Deposit, Receipt, Transfer, app, transfer
from tests.unit.actors import workload

TRANSFERS = "bank.in.transfers"


def _bank(partitions: int = 4) -> AppTest:
    t = AppTest(app, partitions)
    t.send("transfers", Deposit("acct-0001", 100))
    t.send("transfers", Deposit("acct-9000", 50))
    t.run()
    return t


def _summary(results: list[EpochResult]) -> list[object]:
    return [
        (r.epoch, r.digest, [(o.seq, o.handler, o.committed, o.reason, o.egress, o.emits)
                             for o in r.outcomes])
        for r in results
    ]  # fmt: skip


# --- the bank ------------------------------------------------------------------------------


def test_a_transfer_commits_across_partitions_with_a_receipt_at_the_epoch_time() -> None:
    t = _bank()
    assert t.run().command_log == []  # nothing sent: no epoch
    partition_of = t.engine.ranges.partition_of
    source, target = (KeyRef("Account", k) for k in ("acct-0001", "acct-9000"))
    assert partition_of(source) != partition_of(target)
    at = t.now_ms
    t.send("transfers", Transfer("acct-0001", "acct-9000", 30))
    run = t.run()
    assert [len(r.txns) for r in run.command_log] == [1] and run.command_log[0].now_ms == at
    assert t.state(Account) == {"acct-0001": Account(70), "acct-9000": Account(80)}
    assert run.egress("receipts", Receipt) == [Receipt("acct-0001", "acct-9000", 30, 70, 80, at)]
    assert run.egress("bank.out.receipts")[0]["source_balance"] == 70  # plain msgpack, full name
    assert t.egress("receipts") == run.egress("receipts")  # cumulative = the one run with some
    assert run.aborts == [] and run.dead_letters == [] and t.get(Account, "acct-0002") is None


def test_an_overdraft_and_a_self_transfer_abort_with_their_reasons_and_change_nothing() -> None:
    t = _bank()
    before = t.digest
    over = t.send("transfers", Transfer("acct-0001", "acct-9000", 101))
    itself = t.send("transfers", Transfer("acct-0001", "acct-0001", 1))
    run = t.run()
    assert run.aborts == [
        Abort("transfer", "constraint 'balance >= 0' violated by Account['acct-0001']", 1, 0,
              over, ""),
        Abort("transfer", "ValueError: transfer from acct-0001 to itself", 1, 1, itself, ""),
    ]  # fmt: skip
    assert t.digest == before and t.get(Account, "acct-0001") == Account(100)
    assert run.egress("receipts") == []
    # the handler reports aborts to bank.out.errors, as a cluster's egress writer would
    reports = run.egress_records("errors")
    assert [(r.committed, r.reason, r.source) for r in reports] == [
        (False, a.reason, a.source) for a in run.aborts
    ]
    assert run.egress("errors") == []  # no committed outputs there


def test_json_is_accepted_and_invalid_bytes_are_dead_letters_with_reasons() -> None:
    t = AppTest(app)
    t.send("transfers", b'{"type":"Deposit","account":"acct-0001","amount":5}')
    t.send("transfers", b'{"type":"Deposit","account":"alice","amount":5}', partition=2)
    t.send("transfers", b'{"type":"Withdrawal","account":"acct-0001","amount":5}')
    t.send("transfers", b"\xc1", key=b"k")
    t.send("transfrs", Deposit("acct-0001", 5))  # a misspelt input topic: read, and refused
    run = t.run()
    assert [txn.handler for txn in run.command_log[0].txns] == ["deposit"]
    assert t.get(Account, "acct-0001") == Account(5)
    dead = run.dead_letters
    assert [(d.topic, d.partition, d.offset) for d in dead] == [
        (TRANSFERS, 0, 1), (TRANSFERS, 0, 2), (TRANSFERS, 2, 0), ("bank.in.transfrs", 0, 0),
    ]  # fmt: skip
    reasons = {(d.topic, d.partition, d.offset): d.reason for d in dead}
    assert "acct-" in reasons[(TRANSFERS, 2, 0)]
    assert "unknown event type" in reasons[(TRANSFERS, 0, 1)]
    assert "malformed" in reasons[(TRANSFERS, 0, 2)]
    assert "no transaction reads this topic" in reasons[("bank.in.transfrs", 0, 0)]
    assert next(d for d in dead if d.offset == 2).key == b"k"
    assert next(d for d in dead if d.partition == 2).value.startswith(b'{"type":"Deposit"')
    assert run.command_log[0].next_offsets == {
        f"{TRANSFERS}:0": 3, f"{TRANSFERS}:2": 1, "bank.in.transfrs:0": 1,
    }  # fmt: skip


def test_an_external_topic_is_fed_by_its_full_name() -> None:
    """A transaction that reads a topic epochal did not create takes records sent to that
    topic's name as it is, and its dead letters name it."""
    from tests.integration.external_app import Add, Tally
    from tests.integration.external_app import app as external

    t = AppTest(external)
    topic = external.external_topics()[0]
    t.send(topic, Add(3, 5))
    t.send(topic, b"\xc1")
    run = t.run()
    assert t.get(Tally, 3) == Tally(5)
    assert [(d.topic, d.offset) for d in run.dead_letters] == [(topic, 1)]


def test_the_dead_letters_are_in_the_sequencers_order() -> None:
    t = AppTest(app)
    t.send("transfers", b"\xc1", partition=1)
    t.send("transfers", b"\xc1", partition=0)
    t.send("zzz", b"\xc1")
    run = t.run()
    assert [(d.topic, d.partition) for d in run.dead_letters] == [
        ("bank.in.transfers", 0), ("bank.in.transfers", 1), ("bank.in.zzz", 0),
    ]  # fmt: skip


def test_client_requests_get_replies_and_a_reused_request_id_runs_once() -> None:
    t = _bank()
    ok = t.request(transfer, Transfer("acct-0001", "acct-9000", 10))
    over = t.request("transfer", Transfer("acct-0001", "acct-9000", 1_000), request_id="r-2")
    t.request(transfer, Transfer("acct-0001", "acct-9000", 10), request_id=ok)  # a retry
    t.request("deposit", Deposit("acct-0001", 1))  # not a client transaction
    run = t.run()
    assert set(run.replies) == {ok, "r-2"} and over == "r-2"
    assert run.replies[ok].committed and run.replies[ok].result is None
    assert not run.replies[over].committed
    assert run.replies[over].reason == "constraint 'balance >= 0' violated by Account['acct-0001']"
    assert t.get(Account, "acct-0001") == Account(90)
    [dead] = run.dead_letters
    assert dead.topic == "bank.requests" and "no client transaction" in dead.reason
    t.request(transfer, Transfer("acct-0001", "acct-9000", 10), request_id=ok)
    assert t.run().command_log[0].txns == ()  # still remembered in the next epoch
    assert t.get(Account, "acct-0001") == Account(90)


def test_the_fixture_makes_a_harness(epochal_app: AppTestFactory) -> None:
    t = epochal_app(app, partitions=2)
    assert isinstance(t, AppTest) and t.partitions == 2
    t.send("transfers", Deposit("acct-0001", 5))
    t.run()
    assert t.state(Account) == {"acct-0001": Account(5)}


def test_the_harness_equals_the_serial_oracle_and_is_deterministic_on_5000_transfers() -> None:
    rng = random.Random(4)
    t = AppTest(app, partitions=3)
    accounts = [f"acct-{n:04d}" for n in range(0, 10_000, 97)]
    for account in accounts:
        t.send("transfers", Deposit(account, 100), partition=rng.randrange(3))
    for i in range(5_000):
        if i % 500 == 0:
            t.run()
        source, target = rng.choice(accounts), rng.choice(accounts)
        t.send("transfers", Transfer(source, target, rng.randrange(1, 80)),
               partition=rng.randrange(3))  # fmt: skip
    t.run()
    assert len(t.command_log) == 11
    assert _summary(t.results) == _summary(SerialOracle(app).run(t.command_log))
    assert sum(a.balance for a in t.state(Account).values()) == 100 * len(accounts)
    assert len(t.aborts) > 100  # overdrafts and self-transfers
    t.check_determinism(partitions=(1, 2, 4))


# --- interior transactions, ctx.random, ctx.call ------------------------------------------


def _audited(seed: int = 0) -> AppTest:
    t = AppTest(workload.app, partitions=4, seed=seed)
    t.send("ops", workload.Deposit(1, 100))
    t.send("ops", workload.Deposit(2, 100))
    t.run()
    t.send("ops", workload.Transfer(1, 2, 40))  # emits Audit(1, 40)
    t.send("ops", workload.Transfer(2, 1, 35))  # emits Audit(2, 35): 35 % 7 == 0 aborts it
    t.send("ops", workload.Transfer(1, 2, 5))  # emits nothing
    return t


def test_emitted_events_run_as_interior_transactions_in_a_follow_up_epoch() -> None:
    t = _audited()
    run = t.run()
    assert [r.epoch for r in run.command_log] == [1, 2]
    assert run.command_log[1].txns == ()  # a tick: the epoch only exists for the interior ones
    assert run.command_log[1].next_offsets["testbank.requests:0"] == 1
    assert run.emitted == [
        Emit("audit", workload.Audit(1, 40), 1, 0, 0),
        Emit("audit", workload.Audit(2, 35), 1, 1, 0),
    ]
    interior = run.results[1].outcomes
    assert [(o.handler, o.seq, o.committed) for o in interior] == [
        ("audit", -2, True), ("audit", -1, False),
    ]  # fmt: skip
    assert run.aborts[-1].reason == "RuntimeError: auditor dislikes multiples of 7"
    assert run.aborts[-1].source == InputPosition("testbank.in.ops", 0, 3)  # its chain's input
    log = t.get(workload.AuditLog, "audit")
    assert log is not None and (log.count, log.total, log.recent.items) == (1, 40, [40])
    assert 0 <= log.lucky < 1
    assert t.get(workload.Account, 1) == workload.Account(90, touched=104)
    assert t.run().command_log == []  # settled: nothing waits


def test_an_async_test_awaits_run_async_on_its_own_loop() -> None:
    """``run()`` starts an event loop; an async test (already on one) awaits ``run_async``,
    with the same results, interior epochs included."""
    synchronous = _audited()
    expected = synchronous.run()

    t = _audited()  # its first run, before the loop

    async def scenario() -> None:
        run = await t.run_async()
        assert [r.epoch for r in run.command_log] == [r.epoch for r in expected.command_log]
        assert t.digest == synchronous.digest and run.emitted == expected.emitted

    asyncio.run(scenario())


def test_ctx_random_is_the_same_for_the_same_seed_and_differs_for_another() -> None:
    def lucky(t: AppTest) -> float:
        t.run()
        log = t.get(workload.AuditLog, "audit")
        assert log is not None
        return log.lucky

    assert lucky(_audited()) == lucky(_audited())
    assert lucky(_audited()) != lucky(_audited(seed=1))


def test_a_count_window_slides_every_second_audit() -> None:
    t = AppTest(workload.app, partitions=2)
    t.send("ops", workload.Deposit(1, 1_000))
    t.run()
    for amount in (30, 31, 32, 33, 34, 36):
        t.send("ops", workload.Transfer(1, 2, amount))
    t.run()
    log = t.get(workload.AuditLog, "audit")
    assert log is not None and log.recent.items == [31, 32, 33, 34, 36] and log.slides == 3
    t.check_determinism()


calls = App("calls")


@calls.actor(key=str)
class Counter(msgspec.Struct):
    value: int = 0


class Add(msgspec.Struct, frozen=True):
    key: str
    amount: int


class Batch(msgspec.Struct, frozen=True):
    key: str
    amounts: list[int]


class Ping(msgspec.Struct, frozen=True):
    key: str


@calls.transaction(topic="adds", event=Add, keys=lambda e: {Counter: [e.key]})
def add(ctx: Context, e: Add) -> None:
    counter = ctx.get(Counter, e.key)
    counter.value += e.amount
    ctx.put(e.key, counter)
    ctx.egress("added", counter.value)
    if counter.value > 100:
        raise ValueError(f"{e.key} over 100")


@calls.transaction(topic="batches", event=Batch, keys=lambda e: {Counter: [e.key]})
def batch(ctx: Context, e: Batch) -> None:
    for amount in e.amounts:
        try:
            ctx.call(add, Add(e.key, amount))
        except ValueError:
            ctx.egress("refused", amount)  # the nested add's writes and egress are undone


@calls.transaction(event=Ping, keys=lambda e: {Counter: [e.key]})
def ping(ctx: Context, e: Ping) -> None:
    ctx.emit(Ping(e.key))  # forever


@calls.transaction(topic="pings", event=Add, keys=lambda e: {Counter: [e.key]}, name="start")
def start_pinging(ctx: Context, e: Add) -> None:
    ctx.emit(Ping(e.key))


def test_ctx_call_is_a_nested_transaction_whose_failure_the_caller_may_catch() -> None:
    t = AppTest(calls, partitions=2)
    t.send("batches", Batch("a", [10, 95, 20]))
    t.send("adds", Add("b", 101))  # on its own: the whole transaction aborts
    run = t.run()
    assert t.state(Counter) == {"a": Counter(30)}
    assert run.egress("added") == [10, 30] and run.egress("refused") == [95]
    assert [(a.handler, a.reason) for a in run.aborts] == [("add", "ValueError: b over 100")]
    t.check_determinism()


def test_a_handler_that_always_emits_never_settles_and_the_error_names_it() -> None:
    t = AppTest(calls, max_epochs=50)
    t.send("pings", Add("a", 1))
    with pytest.raises(RuntimeError, match=r"after 50 epochs.*'ping' emits for 'ping'"):
        t.run()
    assert len(t.command_log) == 50  # what ran is kept: the log still replays the same
    t.check_determinism(partitions=(2,))


# --- time ----------------------------------------------------------------------------------

clock = App("clock")


@clock.actor(key=str)
class Rate(msgspec.Struct):
    window: TimeWindow[str] = msgspec.field(default_factory=lambda: TimeWindow(1_000, 1_000))
    fired: int = 0


class Hit(msgspec.Struct, frozen=True):
    page: str


@clock.transaction(topic="hits", event=Hit, keys=lambda e: {Rate: [e.page]})
def hit(ctx: Context, e: Hit) -> None:
    rate = ctx.get(Rate, e.page)
    if rate.window.add(ctx.now(), e.page):
        rate.fired += 1
        ctx.egress("rates", [ctx.now(), len(rate.window.items)])
    ctx.put(e.page, rate)


def test_advance_moves_ctx_now_and_a_time_window_slides_with_it() -> None:
    t = AppTest(clock, epoch_ms=0)
    for _ in range(3):
        t.send("hits", Hit("home"))
    assert t.run().egress("rates") == [[START_MS, 1]]
    t.advance(999).send("hits", Hit("home"))
    t.run()
    rate = t.get(Rate, "home")
    assert rate is not None and len(rate.window.items) == 4 and rate.fired == 1
    t.advance(1).send("hits", Hit("home"))
    assert t.run().egress("rates") == [[START_MS + 1_000, 2]]  # the first three slid out
    assert [r.now_ms for r in t.command_log] == [START_MS, START_MS + 999, START_MS + 1_000]


def test_each_epoch_takes_epoch_ms_of_time() -> None:
    t = AppTest(clock, start_ms=5_000, epoch_ms=20)
    t.send("hits", Hit("a"))
    t.run()
    t.advance(100).send("hits", Hit("a"))
    t.run()
    assert [r.now_ms for r in t.command_log] == [5_000, 5_120] and t.now_ms == 5_140
    with pytest.raises(ValueError, match="forward"):
        t.advance(-1)


# --- determinism -----------------------------------------------------------------------------

careless = App("careless")
_calls = [0]


@careless.actor(key=str)
class Draw(msgspec.Struct):
    value: float = 0.0
    count: int = 0


class Roll(msgspec.Struct, frozen=True):
    key: str


@careless.transaction(topic="rolls", event=Roll, keys=lambda e: {Draw: [e.key]})
def roll(ctx: Context, e: Roll) -> None:
    ctx.put(e.key, Draw(random.random()))  # not ctx.random(): another value on every replay


counted = App("counted")


@counted.actor(key=str)
class Tally(msgspec.Struct):
    count: int = 0


@counted.transaction(topic="rolls", event=Roll, keys=lambda e: {Tally: [e.key]})
def count(ctx: Context, e: Roll) -> None:
    _calls[0] += 1  # state outside the actors
    if _calls[0] % 3 == 0:
        raise ValueError("every third call in this process")
    ctx.put(e.key, Tally(_calls[0]))


def test_check_determinism_fails_on_a_handler_that_uses_an_unseeded_random() -> None:
    t = AppTest(careless, partitions=4)
    t.send("rolls", Roll("a"))
    t.send("rolls", Roll("b"))
    t.run()
    with pytest.raises(AssertionError, match=r"epoch 0 seq 0 \(handler 'roll'\).*on 1: writes"):
        t.check_determinism()


def test_check_determinism_fails_on_a_handler_with_state_outside_its_actors() -> None:
    t = AppTest(counted)
    t.send("rolls", Roll("a"))
    t.run()
    t.send("rolls", Roll("b"))
    t.run()
    with pytest.raises(AssertionError, match=r"not deterministic: epoch 0 seq 0 \(handler 'count"):
        t.check_determinism(partitions=(1,))


def test_check_determinism_passes_on_a_deterministic_app() -> None:
    t = _audited()
    t.run()
    t.check_determinism(partitions=(1, 2, 4))


# --- replay of a saved command log ---------------------------------------------------------


def test_a_saved_command_log_replays_to_the_same_state_and_outputs(tmp_path: Path) -> None:
    t = _audited()
    t.request(workload.transfer, workload.Transfer(2, 3, 1), request_id="r")
    t.run()
    path = tmp_path / "incident.log"
    with CommandLogWriter(path) as out:
        for record in t.command_log:
            out.write(record)
    assert read_command_log(path) == (SavedStart(), t.command_log)
    replayed = AppTest.from_command_log(workload.app, path, partitions=2)
    assert replayed.digest == t.digest and _summary(replayed.results) == _summary(t.results)
    assert replayed.written == t.written and replayed.replies["r"].committed
    assert replayed.state(workload.Account) == t.state(workload.Account)
    # the incident is now a unit test: go on from it; the request id is still remembered
    replayed.request(workload.transfer, workload.Transfer(2, 3, 1), request_id="r")
    replayed.send("ops", workload.Deposit(3, 7))
    run = replayed.run()
    assert [r.epoch for r in run.command_log] == [t.epoch]
    assert [txn.source for txn in run.command_log[0].txns] == [InputPosition(
        "testbank.in.ops", 0, 5)]  # fmt: skip
    assert replayed.get(workload.Account, 3) == workload.Account(8, touched=2)


def test_replay_refuses_a_log_of_other_code_unless_allowed_and_a_cut_file(tmp_path: Path) -> None:
    t = _bank()
    other = [msgspec.structs.replace(r, code_hash="other") for r in t.command_log]
    with pytest.raises(RecoveryError, match="other application code"):
        AppTest.replay(app, other)
    assert AppTest.replay(app, other, allow_code_change=True).digest == t.digest
    path = tmp_path / "cut.log"
    with CommandLogWriter(path) as out:
        out.write(t.command_log[0])
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match="ends inside an epoch"):
        read_command_log(path)


def test_epochal_replay_save_log_writes_the_epochs_replay_runs(tmp_path: Path) -> None:
    from epochal.cli import _parser, _saving
    from epochal.log.amendments import Amendments
    from epochal.log.command_log import MemoryCommandLog
    from epochal.recovery.replay import replay_command_log

    args = _parser().parse_args(["replay", "examples.bank.app:app", "--save-log", "x.log"])
    assert args.save_log == "x.log"
    t = _audited()
    t.run()
    log = MemoryCommandLog(chunk_bytes=256)
    for record in t.command_log:
        log.append(record)
    path = tmp_path / "saved.log"
    engine, epochs = replay_command_log(
        workload.app, _saving(workload.app, None, log.epochs(), Amendments(), str(path))
    )
    assert epochs == len(t.command_log) and engine.digest() == t.digest
    assert read_command_log(path) == (SavedStart(), t.command_log)
    assert AppTest.from_command_log(workload.app, path).digest == t.digest


def test_a_saved_log_after_a_snapshot_replays_from_its_state(tmp_path: Path) -> None:
    """A cluster's log is trimmed back to its oldest snapshot: a saved log starts with the
    snapshot's state and carried interior transactions, then the epochs after it."""
    t = _audited()
    t.run()
    start = SavedStart.of(t.engine)  # as a snapshot of the state so far
    assert start.epoch == t.epoch - 1 and start.actors
    done = len(t.command_log)
    t.send("ops", workload.Deposit(3, 7))
    t.request(workload.transfer, workload.Transfer(3, 2, 4), request_id="after")
    t.run()
    path = tmp_path / "after-snapshot.log"
    with CommandLogWriter(path, start) as out:
        for record in t.command_log[done:]:
            out.write(record)
    replayed = AppTest.from_command_log(workload.app, path, partitions=2)
    assert replayed.digest == t.digest
    assert replayed.state(workload.Account) == t.state(workload.Account)
    assert replayed.replies["after"] == t.replies["after"]
    replayed.check_determinism(partitions=(1, 4))  # from the same start
    assert replayed.epoch == t.epoch  # and it goes on where the cluster would
    # without the snapshot's state the same epochs give another state: the test can fail
    bare = AppTest.replay(workload.app, t.command_log[done:])
    assert bare.digest != t.digest
