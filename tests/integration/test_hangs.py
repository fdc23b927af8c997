"""A handler that never returns on one input is named like one that crashes: its worker's
watchdog logs handler, epoch, seq and input within the hang bound, before the cluster's own
failure detection kills the worker, and a fixed version deployed over the loop gets past it."""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.integration.cluster import Cluster, wait_until
from tests.integration.deploys import hangs
from tests.integration.test_deploys import V2, _poison, _receipts, _top_ups

pytestmark = pytest.mark.integration

HANGS = "tests.integration.deploys.hangs:app"
HANG_BOUND_S = 3.0  # the default: half of the default failure bound, 6 s
MARGIN_S = 3.0  # the epoch that takes the input, a loaded machine, the log reaching the file


def test_a_hanging_handler_is_named_within_the_bound_and_a_fixed_version_gets_past_it(
    cluster: Cluster,
) -> None:
    cluster.app_spec = HANGS
    defaults = ["--failure-timeout-ms", "6000"]  # the default bounds, not the tests' short one
    cluster.start(workers=2, partitions=2, snapshot_ms=60_000, extra=defaults)
    ups = _top_ups(cluster, [1, 2, 3])
    wait_until(lambda: len(_receipts(cluster)) == len(ups), 60, "no receipts", log=cluster.log)
    slow = time.monotonic()
    ups += _top_ups(cluster, [7, 4])  # 7 takes hangs.SLOW_S: slow, not hung
    wait_until(lambda: len(_receipts(cluster)) == len(ups), 60, "no receipts", log=cluster.log)
    assert time.monotonic() - slow >= hangs.SLOW_S
    assert cluster.generation() == 1 and "hung" not in cluster.log()

    produced = time.monotonic()
    ups += _top_ups(cluster, [13, 5])  # the poison, and one queued behind it
    wait_until(
        lambda: "transaction hung its worker" in cluster.log(),
        HANG_BOUND_S + MARGIN_S,
        "the hang was not named within the bound",
        log=cluster.log,
    )
    assert time.monotonic() - produced >= HANG_BOUND_S
    epoch, seq, offset = _poison(cluster)
    named = (
        f"transaction hung its worker handler=top_up epoch={epoch} seq={seq} origin=border "
        rf"input={cluster.name}\.in\.topups/\d+@{offset} has run for \d+\.\d s "
        r"\(the bound is 3 s\): "
        f"it will hang every replay; deploy a fixed version, or skip it: epochal skip APP "
        f"--epoch {epoch} --seq {seq}"
    )
    wait_until(
        lambda: f"a handler stopped a worker at epoch={epoch}" in cluster.log(),
        20,
        "the supervisor did not keep the state before the hang",
        log=cluster.log,
    )
    log = cluster.log()
    assert re.search(named, log), log
    assert len(re.findall(named, log)) == 1  # one line per hang
    assert "exited code=4 (a handler hung)" in log
    assert "a peer has been silent" not in log.split("transaction hung its worker")[0]

    loop = (
        rf"generation 2: worker \d failed 2 times in a row at epoch {epoch} \(handler 'top_up', "
        rf"seq {seq}; its handler hung\): deploy a fixed version or skip it with epochal skip "
        rf"APP --epoch {epoch} --seq {seq}"
    )
    wait_until(
        lambda: re.search(loop, cluster.log()) is not None,
        40,
        "no crash-loop line after the second hang",
        log=cluster.log,
    )
    cluster.processes[-1].send_signal(signal.SIGKILL)  # the operator gives up on this version
    cluster.processes[-1].wait(10)
    assert len(_receipts(cluster)) == 5  # nothing from the poison's epoch on was released

    cluster.app_spec = V2
    before = len(cluster.log())
    cluster.start(workers=2, partitions=2, snapshot_ms=60_000, extra=defaults)
    wait_until(
        lambda: len(_receipts(cluster)) == len(ups),
        60,
        "v2 did not get past the hang",
        log=cluster.log,
    )
    assert "never released: they run under this code" in cluster.log()[before:]
    balances: dict[int, int] = {}
    for receipt in _receipts(cluster):
        balances[receipt.wallet] = max(balances.get(receipt.wallet, 0), receipt.balance)
    assert balances[0] == 1 + 7 + 26 and balances[1] == 2 + 4 + 5  # v2 ran the 13 (doubled)
    cluster.stop()
