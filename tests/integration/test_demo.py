"""``epochal demo`` as a user meets it: run from any directory (the bank example comes from the
checkout the package is installed from, not from the working directory), and stopped by SIGTERM
the way Ctrl-C stops it: the cluster and the broker it started go with it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from epochal.config import CacheConfig
from tests.conftest import free_port_pair
from tests.integration.cluster import wait_until

pytestmark = pytest.mark.integration

EPOCHAL = str(Path(sys.executable).parent / "epochal")


def _running_with(name: str) -> list[int]:
    """Pids of processes whose command line or title names ``name``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if name in line:
            found.append(int(entry.name))
    return found


def test_the_demo_runs_from_any_directory_and_sigterm_stops_what_it_started(
    tmp_path: Path, own_cache: CacheConfig
) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a user's shell
    env["EPOCHAL_CACHE"] = str(own_cache.root)
    port = free_port_pair()
    log_path = fresh / "demo.log"
    with log_path.open("w") as log:
        demo = subprocess.Popen(
            [EPOCHAL, "demo", "--port", str(port)],
            cwd=fresh, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        started = re.compile(r"epochal run examples\.bank\.app:app as '(bank-demo-[0-9-]+)'")
        wait_until(
            lambda: started.search(log_path.read_text()) is not None,
            timeout_s=120,
            what="the demo did not start its cluster",
            alive=lambda: demo.poll() is None,
            log=log_path.read_text,
        )
        found = started.search(log_path.read_text())
        assert found is not None
        name = found.group(1)
        assert _running_with(name), "no process of the demo's cluster is running"
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(90) == 128 + signal.SIGTERM, log_path.read_text()
        assert not _running_with(name), "the demo's cluster outlived it"
        with pytest.raises(ConnectionRefusedError):  # the broker the demo started went with it
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(30)
        stop = [EPOCHAL, "kafka", "stop", "--port", str(port)]  # whatever a failure left
        subprocess.run(stop, env=env, capture_output=True, timeout=60, check=False)
