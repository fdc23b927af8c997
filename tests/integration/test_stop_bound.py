"""A stop is bounded even when a worker cannot take part: ``epochal stop``, or SIGTERM to
``epochal run``, of an app whose worker is frozen (SIGSTOP: it neither runs nor dies) ends
within ``--stop-timeout-ms``, says
that the stop is not a savepoint and which worker kept it from being one, and leaves no
process of the app behind."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.integration.cluster import SLACK_S, Cluster, gone, wait_until
from tests.integration.test_deploys import _epochal

pytestmark = pytest.mark.integration

STOP_S = 3.0
CLI_S = 3.0  # `epochal stop` imports the package and finds the supervisor before it signals


@pytest.mark.parametrize("how", ["epochal stop", "SIGTERM"])
def test_a_stop_with_a_frozen_worker_ends_within_its_bound_and_is_not_a_savepoint(
    cluster: Cluster, how: str
) -> None:
    # a long failure bound: no rollback before the stop reaches the cluster
    bounds = ["--failure-timeout-ms", "6000", "--stop-timeout-ms", str(int(STOP_S * 1000))]
    cluster.start(workers=2, partitions=4, extra=bounds)
    cluster.produce(20, deposits=True)
    wait_until(lambda: len(cluster.egress()) >= 20, 60, "no egress", log=cluster.log)
    status = cluster.status()
    pids = [*status["workers"], status["sequencer"], status["watch"]]
    frozen = status["workers"][1]
    supervisor = cluster.processes[-1]
    where = ["--name", cluster.name, "--run-dir", str(cluster.run_dir)]
    try:
        os.kill(frozen, signal.SIGSTOP)
        asked = time.monotonic()
        if how == "SIGTERM":
            supervisor.send_signal(signal.SIGTERM)
            assert supervisor.wait(60) == 0  # a stop that is not a savepoint is still a stop
            took, bound = time.monotonic() - asked, STOP_S + SLACK_S
        else:
            stopped = _epochal("stop", cluster.app_spec, *where)
            took, bound = time.monotonic() - asked, CLI_S + STOP_S + SLACK_S
            assert stopped.returncode == 1, stopped.stdout + stopped.stderr  # not a savepoint
            assert stopped.stdout.startswith(f"stopped {cluster.name} (supervisor pid ")
            assert ", not at a savepoint: workers [" in stopped.stdout
            assert "(worker 1 is stopped by a signal); the next start resumes from" in (
                stopped.stdout
            )
            assert supervisor.wait(1) == 0
        assert took < bound, f"the stop took {took:.1f} s\n{cluster.log()}"
        log = cluster.log()
        said = (  # worker 0 waits for its frozen peer at the final epoch
            r"the stop is not a savepoint: workers \[(0, )?1\] did not end on the final epoch "
            r"within 3 s \(worker 1 is stopped by a signal\); the next start resumes from "
        )
        assert re.search(said, log), log
        assert "stopped at a savepoint" not in log
        wait_until(
            lambda: all(gone(pid) for pid in pids),
            5,
            "processes outlived the stop",
            log=cluster.log,
        )
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
