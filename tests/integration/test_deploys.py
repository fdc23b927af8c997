"""Deploying over a running app's log, as an operator does it with ``epochal run`` and
``epochal skip``: a poison input skipped goes to the dead letters once and the cluster goes on;
new code never silently re-runs epochs whose egress was released under the old."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import threading
import time

import msgspec
import pytest

from epochal.log.amendments import read_amendments
from epochal.log.command_log import KafkaCommandLog
from epochal.recovery.replay import replay_command_log
from epochal.schemas.codec import decode
from epochal.schemas.commands import SKIPPED_REASON
from epochal.schemas.egress import EgressRecord
from tests.integration.cluster import EPOCHAL, ROOT, Cluster, gone, wait_until
from tests.integration.deploys import v1, v2

pytestmark = pytest.mark.integration

V1, V2, V3 = (f"tests.integration.deploys.v{n}:app" for n in (1, 2, 3))


def _top_ups(cluster: Cluster, amounts: list[int]) -> list[tuple[int, int]]:
    ups = [(i % 40, amount) for i, amount in enumerate(amounts)]
    values = [msgspec.msgpack.encode(v1.TopUp(w, a)) for w, a in ups]
    cluster.produce_values(values, topic="in.topups")
    return ups


def _receipts(cluster: Cluster) -> list[v1.Receipt]:
    records = [decode(value, EgressRecord) for value in cluster.read("out.receipts")]
    return [msgspec.msgpack.decode(r.value, type=v1.Receipt) for r in records]


def _epochal(*args: str) -> subprocess.CompletedProcess[str]:
    wide = {**os.environ, "COLUMNS": "300"}
    return subprocess.run([EPOCHAL, *args], cwd=ROOT, env=wide, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def _poison(cluster: Cluster) -> tuple[int, int, int]:
    """(epoch, seq, input offset) of the top-up of 13, from the command log."""
    log = KafkaCommandLog(cluster.kafka, f"{cluster.name}.cmd")
    for logged in log.epochs(to_end=True):
        for txn in logged.record.txns:
            if msgspec.msgpack.decode(txn.event, type=v1.TopUp).amount == 13:
                assert txn.source is not None
                return logged.record.epoch, txn.seq, txn.source.offset
    raise AssertionError("the poison input was never logged")


def test_a_skipped_poison_input_goes_to_the_dead_letters_once_and_the_app_goes_on(
    cluster: Cluster,
) -> None:
    cluster.app_spec = V1
    cluster.start(workers=1, partitions=2, snapshot_ms=0)  # each generation replays it all
    ups = _top_ups(cluster, [*range(1, 13), 13, *range(14, 30)])
    wait_until(lambda: cluster.generation() >= 2, 60, "the poison never crashed a worker",
               log=cluster.log)  # fmt: skip
    epoch, seq, offset = _poison(cluster)
    named = (
        f"transaction crashed its worker handler=top_up epoch={epoch} seq={seq} origin=border "
        rf"input={cluster.name}\.in\.topups/\d+@{offset} error=RecursionError: unlucky: it "
        f"will crash every replay; deploy a fixed version, or skip it: epochal skip APP "
        f"--epoch {epoch} --seq {seq}"
    )
    assert re.search(named, cluster.log()), cluster.log()
    skip = ["skip", V1, "--name", cluster.name, "--epoch", str(epoch), "--seq", str(seq),
            "--bootstrap", cluster.kafka.config.bootstrap_servers,
            "--warehouse", str(cluster.warehouse)]  # fmt: skip
    done = _epochal(*skip)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"transaction epoch={epoch} seq={seq} handler=top_up" in done.stdout
    assert f"input={cluster.name}.in.topups/" in done.stdout and "is skipped" in done.stdout
    again = _epochal(*skip)
    assert again.returncode == 0 and "was already skipped" in again.stdout, again.stdout

    wait_until(lambda: len(_receipts(cluster)) == len(ups) - 1, 60,
               "the app did not get past the skipped input", log=cluster.log)  # fmt: skip
    generation = cluster.generation()
    os.kill(cluster.status()["workers"][0], signal.SIGKILL)  # a replay runs the epoch again
    wait_until(lambda: cluster.generation() > generation, 30, "no rollback", log=cluster.log)
    _top_ups(cluster, [1])
    wait_until(lambda: len(_receipts(cluster)) == len(ups), 60, "the app stopped", log=cluster.log)

    (letter,) = cluster.dead_letters()  # once, however often its epoch ran
    assert (letter.reason, letter.offset, letter.topic) == (
        SKIPPED_REASON, offset, f"{cluster.name}.in.topups",
    )  # fmt: skip
    assert msgspec.msgpack.decode(letter.value, type=v1.TopUp) == v1.TopUp(12 % 40, 13)
    wallets = dataclasses.replace(v1.app, name=cluster.name)
    log = KafkaCommandLog(cluster.kafka, f"{cluster.name}.cmd")
    amendments = read_amendments(cluster.kafka, cluster.name)
    engine, _ = replay_command_log(wallets, log.epochs(to_end=True), amendments=amendments)
    balances = {ref.key: msgspec.structs.asdict(value)["balance"] for ref, value in engine.items()}
    expected: dict[int, int] = {}
    for wallet, amount in [*ups, (0, 1)]:
        if amount != 13:
            expected[wallet] = expected.get(wallet, 0) + amount
    assert balances == expected
    cluster.stop()


def test_a_skip_repeated_after_a_snapshot_of_its_epoch_is_already_skipped(cluster: Cluster) -> None:
    """Once the skipped transaction's epoch is in a snapshot, a repeated ``epochal skip`` still
    says it was skipped (it said the epoch could not be skipped any more) and writes nothing."""
    cluster.app_spec = V1
    cluster.start(workers=1, partitions=2, snapshot_ms=500)
    ups = _top_ups(cluster, [1, 13, 2])
    wait_until(lambda: cluster.generation() >= 2, 60, "the poison never crashed a worker",
               log=cluster.log)  # fmt: skip
    epoch, seq, _ = _poison(cluster)
    skip = ["skip", V1, "--name", cluster.name, "--epoch", str(epoch), "--seq", str(seq),
            "--bootstrap", cluster.kafka.config.bootstrap_servers,
            "--warehouse", str(cluster.warehouse)]  # fmt: skip
    done = _epochal(*skip)
    assert done.returncode == 0 and "is skipped" in done.stdout, done.stdout + done.stderr
    wait_until(lambda: len(_receipts(cluster)) == len(ups) - 1, 60,
               "the app did not get past the skipped transaction", log=cluster.log)  # fmt: skip
    latest = lambda: cluster.snapshots().latest()  # noqa: E731
    wait_until(lambda: (m := latest()) is not None and m.epoch >= epoch, 30, "no snapshot")
    amendments = f"{cluster.name}.amendments"
    written = cluster.kafka.end_offset(amendments)
    again = _epochal(*skip)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"transaction epoch={epoch} seq={seq} was already skipped" in again.stdout
    assert cluster.kafka.end_offset(amendments) == written  # nothing written again
    cluster.stop()
    assert len(cluster.dead_letters()) == 1


def test_in_weak_mode_a_poison_input_is_skipped_by_its_coordinates_once(cluster: Cluster) -> None:
    """Weak mode logs no epochs and sequences the input anew at each rollback: the poison line
    names the input, and ``epochal skip --input`` sends that record to the dead letters."""
    cluster.app_spec = V1
    cluster.start(workers=1, partitions=2, snapshot_ms=500, extra=["--recovery", "weak"])
    ups = _top_ups(cluster, [1, 2, 3])
    wait_until(lambda: len(_receipts(cluster)) == len(ups), 60, "no receipts", log=cluster.log)
    ups += _top_ups(cluster, [13, 7])
    named = (
        rf"(?m)input=({cluster.name}\.in\.topups/\d+@\d+) .*\(in weak recovery mode: --input \1\)$"
    )
    wait_until(lambda: re.search(named, cluster.log()), 60, "no poison line", log=cluster.log)
    match = re.search(named, cluster.log())
    assert match is not None
    where = ["--name", cluster.name, "--bootstrap", cluster.kafka.config.bootstrap_servers,
             "--warehouse", str(cluster.warehouse)]  # fmt: skip
    by_seq = _epochal("skip", V1, *where, "--epoch", "1", "--seq", "0")
    assert by_seq.returncode == 1 and "--input TOPIC/PARTITION@OFFSET" in by_seq.stderr
    done = _epochal("skip", V1, *where, "--input", match.group(1))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"input {match.group(1)} is skipped: the sequencer sends it")

    wait_until(lambda: len(_receipts(cluster)) == len(ups) - 1, 60,
               "the app did not get past the skipped input", log=cluster.log)  # fmt: skip
    topic, offset = match.group(1).split("@")
    position = topic.replace("/", ":")  # a snapshot has read past it: a repeat is still 'already'
    wait_until(lambda: _covered(cluster, position) > int(offset), 30, "no snapshot after it")
    again = _epochal("skip", V1, *where, "--input", match.group(1))
    assert "was already skipped" in again.stdout, again.stdout + again.stderr
    generation = cluster.generation()
    os.kill(cluster.status()["workers"][0], signal.SIGKILL)  # a rollback sequences anew
    wait_until(lambda: cluster.generation() > generation, 30, "no rollback", log=cluster.log)
    ups += _top_ups(cluster, [5])
    wait_until(lambda: len(_receipts(cluster)) == len(ups) - 1, 60, "stopped", log=cluster.log)
    cluster.stop()
    (letter,) = cluster.dead_letters()  # once, however often the input was sequenced
    assert (letter.reason, f"{letter.topic}/{letter.partition}", letter.offset) == (
        SKIPPED_REASON, topic, int(offset),
    )  # fmt: skip
    assert msgspec.msgpack.decode(letter.value, type=v1.TopUp) == v1.TopUp(0, 13)
    assert sorted(r.balance for r in _receipts(cluster) if r.wallet == 0) == [1, 6]


def test_new_code_never_silently_reruns_released_epochs_or_a_removed_handler_and_no_flag_sticks(
    cluster: Cluster,
) -> None:
    cluster.app_spec = V1
    cluster.start(workers=1, partitions=2, snapshot_ms=60_000)  # the epochs stay after it
    ups = _top_ups(cluster, list(range(1, 7)))
    wait_until(lambda: len(_receipts(cluster)) == len(ups), 60, "no receipts", log=cluster.log)
    topups = f"{cluster.name}.in.topups:0"  # the one partition epochal made it with
    wait_until(lambda: _covered(cluster, topups) == len(ups), 60, "no snapshot of the first 6",
               log=cluster.log)  # fmt: skip
    ups += _top_ups(cluster, list(range(7, 13)))  # in epochs after the first snapshot
    wait_until(lambda: len(_receipts(cluster)) == len(ups), 60, "no receipts", log=cluster.log)
    supervisor = cluster.processes[-1]
    supervisor.send_signal(signal.SIGKILL)  # no savepoint: a crash, or `kill -9`
    supervisor.wait(10)
    children = [*cluster.status()["workers"], cluster.status()["sequencer"]]
    wait_until(lambda: all(gone(pid) for pid in children), 10, "children outlived their parent")

    run = ["--name", cluster.name, "--bootstrap", cluster.kafka.config.bootstrap_servers,
           "--run-dir", str(cluster.run_dir), "--warehouse", str(cluster.warehouse),
           "--workers", "1", "--partitions", "2"]  # fmt: skip
    renamed = _epochal("run", V3, *run)  # its handler has another name
    assert renamed.returncode == 1, renamed.stdout + renamed.stderr
    (line,) = [line for line in renamed.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(
        "error: handler 'top_up' is not in this version of the app, but 6 transactions of epoch"
    ), line
    refused = _epochal("run", V2, *run)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert re.match(
        r"error: epochs? \d+(\.\.\d+)? after the latest snapshot ran under other code", line
    )
    assert "released egress" in line and "could contradict what was released" in line
    assert "`epochal stop`" in line and "--allow-code-change" in line

    cluster.app_spec = V2
    cluster.start(workers=1, partitions=2, snapshot_ms=60_000, extra=["--allow-code-change"])
    assert "--allow-code-change: epoch" in cluster.log() and "may be contradicted" in cluster.log()
    _top_ups(cluster, [13])
    wait_until(lambda: len(_receipts(cluster)) == len(ups) + 1, 60, "v2 did not run",
               log=cluster.log)  # fmt: skip
    cluster.processes[-1].send_signal(signal.SIGKILL)
    cluster.processes[-1].wait(10)

    before = len(cluster.log())
    cluster.start(workers=1, partitions=2, snapshot_ms=60_000)  # no flag: nothing to force
    _top_ups(cluster, [13])
    wait_until(lambda: len(_receipts(cluster)) == len(ups) + 2, 60, "v2 did not go on",
               log=cluster.log)  # fmt: skip
    assert "--allow-code-change" not in cluster.log()[before:]
    last = _receipts(cluster)[-1]
    assert last.wallet == 0 and last.balance == 1 + 7 + 26 + 26  # both 13s doubled: v2 ran them
    cluster.stop()


def test_a_stop_under_traffic_is_a_savepoint_and_new_code_starts_from_it(cluster: Cluster) -> None:
    cluster.app_spec = V1
    cluster.start(workers=2, partitions=4, snapshot_ms=60_000)  # only the stop snapshots
    ups = _top_ups(cluster, [a for a in range(1, 30) if a != 13])  # no poison here
    wait_until(lambda: len(_receipts(cluster)) == len(ups), 60, "no receipts", log=cluster.log)
    producing = threading.Thread(target=lambda: [_top_ups(cluster, [100]) for _ in range(40)])
    producing.start()  # input still arriving while the cluster stops
    time.sleep(0.2)
    cluster.stop()
    producing.join()
    ups += [(0, 100)] * 40
    log = cluster.log()
    (ssid,) = {int(m) for m in re.findall(r"stopped at a savepoint ssid=(\d+)", log)}
    last = KafkaCommandLog(cluster.kafka, f"{cluster.name}.cmd").last_epoch()
    assert last is not None and last.record.final and last.record.epoch == ssid
    assert cluster.snapshots().latest().epoch == ssid  # type: ignore[union-attr]
    released = len(_receipts(cluster))

    cluster.app_spec = V2  # another version: nothing to replay, nothing to check
    before = len(cluster.log())
    cluster.start(workers=2, partitions=4, snapshot_ms=60_000)
    ups += _top_ups(cluster, [100])  # at least one input v2 sequences itself
    wait_until(lambda: len(_receipts(cluster)) == len(ups), 60, "inputs lost", log=cluster.log)
    resumed = f"resumed from snapshot ssid={ssid} "
    went_on = f"worker started worker=\\d .* from_epoch={ssid + 1} "

    def both_said() -> bool:  # the children's lines reach the log file when they flush
        said = cluster.log()[before:]
        return said.count(resumed) == 2 and len(re.findall(went_on, said)) == 2

    wait_until(both_said, 20, "the workers did not resume from the savepoint", log=cluster.log)
    assert "other code" not in cluster.log()[before:]
    after = KafkaCommandLog(cluster.kafka, f"{cluster.name}.cmd").epochs(to_end=True)
    codes = {e.record.code_hash for e in after if e.record.epoch > ssid}
    assert codes == {v2.app.code_hash()}  # nothing of v1 was left to run after the savepoint
    records = [decode(v, EgressRecord) for v in cluster.read("out.receipts")]
    assert len({(r.epoch, r.seq) for r in records}) == len(records) == len(ups)
    assert len(records) > released  # some inputs came after the savepoint, run by v2

    where = ["--name", cluster.name, "--run-dir", str(cluster.run_dir)]
    stopped = _epochal("stop", V2, *where)  # from another shell, as an operator does
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert cluster.processes[-1].wait(5) == 0
    (ssid,) = {
        int(m) for m in re.findall(r"stopped at a savepoint ssid=(\d+)", cluster.log()[before:])
    }
    assert stopped.stdout.startswith(f"stopped {cluster.name} (supervisor pid ")
    assert stopped.stdout.rstrip().endswith(
        f"at a savepoint: ssid={ssid}; a start after it replays nothing"
    )
    again = _epochal("stop", V2, *where)
    assert again.returncode == 1 and f"app {cluster.name!r} is not running here" in again.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_a_fixed_version_deployed_over_a_crash_loop_resumes_from_the_state_before_it(
    cluster: Cluster, workers: int
) -> None:
    cluster.app_spec = V1
    cluster.start(workers=workers, partitions=4, snapshot_ms=60_000)  # no snapshot after its own
    ups = _top_ups(cluster, [1, 2, 3])
    wait_until(lambda: len(_receipts(cluster)) == len(ups), 60, "no receipts", log=cluster.log)
    ups += _top_ups(cluster, [4, 5, 6])  # epochs after the first snapshot: released
    wait_until(lambda: len(_receipts(cluster)) == len(ups), 60, "no receipts", log=cluster.log)
    ups += _top_ups(cluster, [13, 7, *[1] * 28, 9])  # the poison, and others (of each worker)
    wait_until(lambda: cluster.generation() >= 2, 60, "no crash", log=cluster.log)
    epoch, _, _ = _poison(cluster)
    kept = lambda: any(m.epoch == epoch - 1 for m in cluster.snapshots().manifests())  # noqa: E731
    wait_until(kept, 60, "the state before the poison was not kept", log=cluster.log)
    assert f"a handler stopped a worker at epoch={epoch}" in cluster.log()
    cluster.processes[-1].send_signal(signal.SIGKILL)  # the operator gives up on v1
    cluster.processes[-1].wait(10)
    assert len(_receipts(cluster)) == 6  # nothing from the poison's epoch on, by either worker

    cluster.app_spec = V2
    before = len(cluster.log())
    cluster.start(workers=workers, partitions=4, snapshot_ms=60_000)  # no flag
    wait_until(lambda: len(_receipts(cluster)) == len(ups), 60, "v2 did not go on", log=cluster.log)
    assert "never released: they run under this code" in cluster.log()[before:]
    balances: dict[int, int] = {}
    for receipt in _receipts(cluster):  # balances only grow: the largest is the latest
        balances[receipt.wallet] = max(balances.get(receipt.wallet, 0), receipt.balance)
    assert balances[0] == 1 + 4 + 26 and balances[1] == 2 + 5 + 7  # v2 ran the 13 (doubled)
    cluster.stop()


def _covered(cluster: Cluster, position: str) -> int:
    """The next offset of input partition ``position`` (``topic:partition``) the latest
    snapshot covers (0 before any)."""
    manifests = cluster.snapshots().manifests()
    return manifests[-1].input_positions.get(position, 0) if manifests else 0
