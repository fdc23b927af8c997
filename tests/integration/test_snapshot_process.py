"""The snapshot process beside each worker (``actors/snapshot_process.py``), over real Delta
tables: snapshots written and committed through it equal the serial oracle and restore whole
(read there, not in the worker);
an error there is raised in the worker as what it was; it ignores the signals meant for its
worker, dies with it, leaves when closed, and a process gone is named, not waited on.

Each case runs in a process forked by the fork server workers come from: the fork is refused
once Arrow or a Kafka client has started threads, as they have in pytest's process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from epochal.actors.lifecycle import process_title
from epochal.supervisor import _children_context
from tests.integration.test_snapshots import _log

pytestmark = pytest.mark.integration

_WORKERS = _children_context()
_TITLE = "epochal: snapshots of worker 0 of forked-test"


def _beside(warehouse: str):  # type: ignore[no-untyped-def]
    from epochal.actors.snapshot_process import snapshots_beside
    from epochal.config import SnapshotConfig
    from epochal.recovery.snapshots import DeltaSnapshots
    from tests.unit.actors.workload import app

    config = SnapshotConfig(warehouse, keep=0)
    return snapshots_beside(DeltaSnapshots(app, config, partitions=4), _TITLE, app)


def _forked_snapshots(warehouse: str):  # type: ignore[no-untyped-def]
    from epochal.actors.snapshot_process import ForkedSnapshots

    forked = _beside(warehouse)
    assert isinstance(forked, ForkedSnapshots)
    return forked


def _snapshot_all(warehouse: str, answer: Connection) -> None:
    """Run the log, snapshotting through the process; answer what a worker would see."""
    import msgspec

    from epochal.actors import snapshot_process
    from epochal.actors.engine import Engine
    from epochal.actors.snapshot_process import _native_threads
    from epochal.actors.snapshots import with_log_position
    from epochal.config import SnapshotConfig
    from epochal.log.command_log import LoggedEpoch
    from epochal.recovery.log_tables import epochs_of
    from epochal.recovery.snapshots import DeltaSnapshots
    from tests.unit.actors.workload import app

    snapshot_process.STAGE_EPOCHS = 1  # each epoch of a part in a message of its own, ahead
    forked = _forked_snapshots(warehouse)
    forked.ensure_tables(app.code_hash())
    at_start = _schedulers(forked.pid)  # a start waits on it: not in the idle class yet
    engine = Engine(app, 4, snapshots=True)
    digests = {}
    archived: list[msgspec.Raw] = []
    for position, record in enumerate(_log()):
        result = asyncio.run(engine.run_epoch(record))
        archived.append(LoggedEpoch(position, record).msgpack())
        if result.changes is not None:
            part = forked.write(record.epoch, 0, result.changes, archived=archived,
                                reported=engine.take_reported())  # fmt: skip
            archived = []
            part = with_log_position(part, record, position + 1, engine.carried)
            manifest = forked.commit([part], record.epoch)
            forked.retain(manifest)
            digests[manifest.ssid] = manifest.digest
    restored = forked.restore()
    threads = _native_threads()  # delta-rs's runtime would leave its threads here
    by_itself = DeltaSnapshots(app, SnapshotConfig(warehouse, keep=0), partitions=4)
    read_here = by_itself.restore()
    commands = by_itself._table(by_itself.warehouse.log("commands")).to_pyarrow_table()
    epochs = [(r.epoch, r.txns) for r in epochs_of(commands)]
    title = process_title(forked.pid)
    niceness = (os.getpriority(os.PRIO_PROCESS, 0), os.getpriority(os.PRIO_PROCESS, forked.pid))
    scheduler = _schedulers(forked.pid)  # each of its threads, delta-rs's too
    os.kill(forked.pid, signal.SIGINT)  # a Ctrl-C reaches the worker's whole process group
    os.kill(forked.pid, signal.SIGTERM)
    time.sleep(0.2)
    raised, told, after = _errors(forked)
    pid = forked.pid
    forked.close()
    answer.send(
        {
            "digests": digests,
            "restored": restored.manifest.ssid if restored else None,
            "actors": restored.actors if restored else None,
            "threads": threads,
            "by_itself": read_here.actors if read_here else None,
            "epochs": epochs,
            "title": title,
            "niceness": niceness,
            "scheduler": scheduler,
            "at_start": at_start,
            "raised": raised,
            "told": told,
            "after": after,
            "closed": process_title(pid),
        }
    )


def _schedulers(pid: int) -> set[int]:
    """The scheduling policies of ``pid``'s threads."""
    policies = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            policies.add(os.sched_getscheduler(int(tid)))
    return policies


def _errors(forked):  # type: ignore[no-untyped-def]
    """What a worker sees of errors there: a write's own (with where it was raised), and one of
    the epochs staged ahead of a part (that part fails with it; the lane goes on)."""
    import msgspec

    from epochal.actors.store import Change
    from epochal.schemas.commands import KeyRef, PartitionId

    unknown = Change(KeyRef("NoSuchActor", 1), PartitionId(0), None, b"\x01")
    try:
        forked.write(99, 0, [unknown])
        raised = ""
    except KeyError as exc:  # the process's own exception, with where it was raised
        raised = "".join(getattr(exc, "__notes__", []))
    forked._parts.connection.send_bytes(b"!\xc1")  # a staging that fails, answered by no one
    try:
        forked.write(100, 0, [])
        told = ""
    except msgspec.DecodeError as exc:  # the part it was for fails with it
        told = "".join(getattr(exc, "__notes__", []))
    after = forked.write(101, 0, []).ssid  # and the lane goes on
    return raised, told, after


def _killed_process(warehouse: str, answer: Connection) -> None:
    from epochal.actors.snapshot_process import SnapshotProcessError

    forked = _forked_snapshots(warehouse)
    os.kill(forked.pid, signal.SIGKILL)
    os.waitpid(forked.pid, 0)
    try:
        forked.ensure_tables("x")
        answer.send("")
    except SnapshotProcessError as exc:
        answer.send(str(exc))


def _after_a_kafka_client(warehouse: str, answer: Connection) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": "127.0.0.1:9", "client.id": "threads"})
    answer.send(type(_beside(warehouse)).__name__)  # librdkafka's threads run by now
    producer.flush(0)


def _orphaned(warehouse: str, answer: Connection) -> None:
    forked = _forked_snapshots(warehouse)  # kept: dropping it closes the lanes
    answer.send(forked.pid)
    time.sleep(60)  # killed by the test


def _in_a_process(target, warehouse: Path):  # type: ignore[no-untyped-def]
    ours, theirs = _WORKERS.Pipe()
    process = _WORKERS.Process(target=target, args=(str(warehouse), theirs))
    process.start()
    deadline = time.monotonic() + 120
    while not ours.poll(0.1):
        assert process.is_alive() and time.monotonic() < deadline, "the case answered nothing"
    return process, ours.recv()


def test_snapshots_through_the_process_equal_the_oracle_and_its_errors_come_back(
    tmp_path: Path,
) -> None:
    from epochal.actors.oracle import SerialOracle
    from epochal.actors.snapshot_process import NICENESS
    from tests.unit.actors.workload import app

    records = _log()
    expected = {r.epoch: r.digest for r in SerialOracle(app).run(records)}
    process, seen = _in_a_process(_snapshot_all, tmp_path / "warehouse")
    process.join(30)
    assert process.exitcode == 0
    assert sorted(seen["digests"]) == [2, 5, 8, 11]
    assert all(digest == expected[ssid] for ssid, digest in seen["digests"].items())
    assert seen["restored"] == 11
    archived = sorted(seen["epochs"])  # each part's epochs staged one by one, none lost
    assert archived == [(r.epoch, r.txns) for r in records]
    assert seen["actors"] == seen["by_itself"] and seen["actors"]  # restored over there, whole
    assert seen["threads"] == 0  # and the worker never ran delta-rs (nor kept its threads)
    assert seen["title"] == _TITLE  # and it took no notice of SIGINT and SIGTERM
    worker, snapshots = seen["niceness"]  # it yields the cores to the epoch loops
    assert snapshots == min(worker + NICENESS, 19)
    assert seen["at_start"] == {os.SCHED_OTHER}  # its worker's start is waited for
    assert seen["scheduler"] == {os.SCHED_IDLE}  # then only on cores nothing else wants
    assert "in the snapshot process" in seen["raised"] and "NoSuchActor" in seen["raised"]
    assert "in the snapshot process" in seen["told"] and seen["after"] == 101
    assert seen["closed"] is None  # gone once closed, and reaped


def test_a_snapshot_process_that_is_gone_is_named(tmp_path: Path) -> None:
    process, said = _in_a_process(_killed_process, tmp_path / "warehouse")
    process.join(30)
    assert said.startswith("the snapshot process (pid ") and "is gone" in said


def test_a_worker_whose_app_started_threads_writes_snapshots_on_its_own_threads(
    tmp_path: Path,
) -> None:
    process, chosen = _in_a_process(_after_a_kafka_client, tmp_path / "warehouse")
    process.join(30)
    assert chosen == "DeltaSnapshots"  # no fork beside threads that could hold a lock


def test_the_snapshot_process_dies_with_its_worker(tmp_path: Path) -> None:
    process, pid = _in_a_process(_orphaned, tmp_path / "warehouse")
    assert _title_within(pid, 10) == _TITLE  # it titles itself once it runs
    os.kill(pid, signal.SIGSTOP)  # as if in the middle of a commit: it would never read EOF
    try:
        process.kill()
        process.join(30)
        assert _title_within(pid, 10, until=None) is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _title_within(pid: int, seconds: float, until: str | None = _TITLE) -> str | None:
    """``pid``'s title once it is ``until``, or what it is after ``seconds``."""
    deadline = time.monotonic() + seconds
    while process_title(pid) != until and time.monotonic() < deadline:
        time.sleep(0.05)
    return process_title(pid)
