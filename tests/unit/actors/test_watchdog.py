"""The hang watchdog: what it calls hung (one invocation over the bound, never a slow epoch of
many short ones), the line it logs, and that the executor tells it what runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict

import msgspec

from epochal.actors.api import App
from epochal.actors.context import Context, hang_line, poison_line
from epochal.actors.executor import EpochExecutor, Step
from epochal.actors.partitioning import KeyRanges
from epochal.actors.plan import EpochClock, Invocation
from epochal.actors.store import StateStore
from epochal.actors.watchdog import RUNNING, Hang, HangJudge, HangWatch, Running
from epochal.schemas.commands import InputPosition, Origin, PartitionId

app = App("dog")


@app.actor(key=int)
class Box(msgspec.Struct):
    n: int = 0


class Put(msgspec.Struct, frozen=True):
    key: int


seen: list[Invocation | None] = []


@app.transaction(topic="puts", event=Put, keys=lambda e: {Box: [e.key]})
def put(ctx: Context, e: Put) -> None:
    seen.append(RUNNING.invocation)
    ctx.put(e.key, Box(1))


def _invocation(seq: int = 3, epoch: int = 812) -> Invocation:
    event = Put(seq)
    keys = app.declared_keys(app.handlers["put"], event)
    source = InputPosition("dog.in.puts", 0, 8842)
    return Invocation(epoch, seq, app.handlers["put"], event, keys, Origin.BORDER, source=source)


def test_one_invocation_is_hung_only_once_it_has_run_for_longer_than_the_bound() -> None:
    judge, inv = HangJudge(bound_s=3.0), _invocation()
    assert [judge.look(inv, now) for now in (10.0, 11.0, 12.9, 13.0)] == [None] * 4
    hang = judge.look(inv, 13.5)
    assert hang == Hang(inv, 3.5)


def test_many_short_invocations_are_never_a_hang_however_long_the_epoch() -> None:
    judge = HangJudge(bound_s=3.0)
    looks = [judge.look(_invocation(seq), now=seq * 0.5) for seq in range(100)]  # a 50 s epoch
    looks += [judge.look(None, now=60.0), judge.look(None, now=120.0)]  # then idle
    assert looks == [None] * 102


def test_a_new_invocation_starts_its_own_clock() -> None:
    judge, first, second = HangJudge(bound_s=3.0), _invocation(1), _invocation(2)
    judge.look(first, 0.0)
    assert judge.look(second, 2.9) is None
    assert judge.look(second, 5.0) is None  # 2.1 s of its own
    assert judge.look(second, 6.0) == Hang(second, 3.1)


def test_the_watch_thread_reports_a_hang_once_and_a_finite_run_not_at_all() -> None:
    running, hangs = Running(), []
    reported = threading.Event()

    def on_hang(hang: Hang) -> None:
        hangs.append(hang)
        reported.set()

    watch = HangWatch(bound_ms=300, on_hang=on_hang, running=running)
    assert watch.interval_s == 0.03
    watch.start()
    try:
        running.invocation = _invocation(1)
        time.sleep(0.2)  # slow, under the bound
        running.invocation = None
        time.sleep(0.2)
        assert not hangs
        running.invocation = _invocation(2)
        assert reported.wait(2.0)
        time.sleep(0.4)
    finally:
        watch.stop()
    (hang,) = hangs
    assert hang.invocation.seq == 2 and 0.3 < hang.seconds < 0.5


def test_the_hang_line_names_the_transaction_like_the_crash_line() -> None:
    inv = _invocation()
    said = hang_line(inv, 31.24, 30.0)
    assert said == (
        "transaction hung its worker handler=put epoch=812 seq=3 origin=border "
        "input=dog.in.puts/0@8842 has run for 31.2 s (the bound is 30 s): it will hang every "
        "replay; deploy a fixed version, or skip it: epochal skip APP --epoch 812 --seq 3 "
        "(in weak recovery mode: --input dog.in.puts/0@8842)"
    )
    crashed = poison_line(inv, RecursionError("deep"))
    named = "handler=put epoch=812 seq=3 origin=border input=dog.in.puts/0@8842"
    assert crashed.startswith(f"transaction crashed its worker {named} error=RecursionError")


def test_the_executor_says_what_runs_while_a_handler_runs_and_nothing_after() -> None:
    partitions = [PartitionId(0), PartitionId(1)]
    executor = EpochExecutor(app, 0, partitions, StateStore(partitions))
    plan = [_invocation(seq, epoch=1) for seq in range(3)]
    parts = [KeyRanges.even(app, 2).partitions_of_keys(inv.keys) for inv in plan]
    steps = [Step(inv, (0,), inv.keys, p, min(p), 0) for inv, p in zip(plan, parts, strict=True)]
    seen.clear()

    class NoExchange:
        def send_reads(self, *args: object) -> None: ...

        def send_writes(self, *args: object) -> None: ...

        async def flush(self) -> None: ...

    asyncio.run(executor.run_epoch(EpochClock(1, 0, 0), steps, NoExchange(), defaultdict(int)))
    assert plan == seen
    assert RUNNING.invocation is None
