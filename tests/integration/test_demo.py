"""``epochal demo`` as a user meets it: run from any directory (the bank example comes from the
checkout the package is installed from, not from the working directory), and stopped by SIGTERM
the way Ctrl-C stops it: the cluster and the broker it started go with it. ``epochal bench``
stops its broker on SIGTERM too."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from epochal.config import CacheConfig
from tests.conftest import free_port_pair, free_ports
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


def _described(pids: list[int]) -> str:
    """Each process's title and state, for a failure's message."""
    lines = []
    for pid in pids:
        with contextlib.suppress(OSError):
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
            lines.append(f"pid {pid} state {state}: {title[:160]}")
    return "\n".join(lines)


def _kill_all_under(folder: Path) -> None:
    """SIGKILL every process whose command line names ``folder`` (its data, logs or run dir)."""
    for pid in _running_with(str(folder)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_the_demo_runs_from_any_directory_and_sigterm_stops_what_it_started(
    tmp_path: Path, own_cache: CacheConfig
) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a user's shell
    env |= {"EPOCHAL_CACHE": str(own_cache.root), "TMPDIR": str(tmp_path)}
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
        wait_until(  # a title being set can hide a process from one look: look again
            lambda: bool(_running_with(name)), timeout_s=5,
            what="no process of the demo's cluster is running",
        )  # fmt: skip
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(90) == 128 + signal.SIGTERM, log_path.read_text()
        wait_until(  # its last processes follow the supervisor out (a parent-death signal,
            lambda: not _running_with(name),  # or a look every half second when the
            timeout_s=5,  # supervisor went before they could watch it)
            what="the demo's cluster outlived it",
            log=lambda: _described(_running_with(name)),
        )
        with pytest.raises(ConnectionRefusedError):  # the broker the demo started went with it
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(30)
        _kill_all_under(tmp_path)  # whatever a failure left


def test_a_benchmark_stopped_by_sigterm_stops_the_broker_it_started(
    tmp_path: Path, own_cache: CacheConfig
) -> None:
    env = {**os.environ, "EPOCHAL_CACHE": str(own_cache.root), "TMPDIR": str(tmp_path)}
    port = free_port_pair()
    bench = [EPOCHAL, "bench", "bank", "--transfers", "200000", "--workers", "1", "--repeats",
             "1", "--no-baselines", "--port", str(port), "--port-base", str(free_ports(10)),
             "--out", str(tmp_path / "results")]  # fmt: skip
    log_path = tmp_path / "bench.log"
    with log_path.open("w") as log:
        run = subprocess.Popen(bench, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)

    def broker_up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    try:
        wait_until(broker_up, timeout_s=120, what="the benchmark's broker did not start",
                   alive=lambda: run.poll() is None, log=log_path.read_text)  # fmt: skip
        run.send_signal(signal.SIGTERM)
        assert run.wait(90) == 128 + signal.SIGTERM, log_path.read_text()
        assert not broker_up(), "the benchmark's broker outlived it"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(30)
        _kill_all_under(tmp_path)  # whatever a failure left
