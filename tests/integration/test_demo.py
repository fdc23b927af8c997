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
from tests.integration.cluster import executable, first_child, wait_until

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
    """SIGTERM lands as the demo forks its cluster's supervisor: inside ``Popen``, which has
    no handle to return yet. Landing before the child's ``exec`` takes a few tries."""
    for attempt in range(5):
        if _sigterm_as_the_cluster_forks(tmp_path / f"attempt-{attempt}", own_cache):
            break


def _sigterm_as_the_cluster_forks(folder: Path, own_cache: CacheConfig) -> bool:
    """Run the demo from a fresh directory, SIGTERM it as soon as it has forked the cluster's
    supervisor and check that nothing it started outlives it; whether the SIGTERM came before
    that child's ``exec``."""
    fresh = folder / "fresh"
    fresh.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a user's shell
    env |= {"EPOCHAL_CACHE": str(own_cache.root), "TMPDIR": str(folder)}
    port = free_port_pair()
    log_path = fresh / "demo.log"
    with log_path.open("w") as log:
        demo = subprocess.Popen(
            [EPOCHAL, "demo", "--port", str(port)],
            cwd=fresh, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        wait_until(
            lambda: "Kafka at" in log_path.read_text(),
            timeout_s=120,
            what="the demo did not start its broker",
            alive=lambda: demo.poll() is None,
            log=log_path.read_text,
        )
        cluster = first_child(demo, _runs_python, log=log_path.read_text)  # not the broker's JVM
        demo.send_signal(signal.SIGTERM)
        before_exec = _command_line(cluster) == _command_line(demo.pid)
        started = re.compile(r"epochal run examples\.bank\.app:app as '(bank-demo-[0-9-]+)'")
        found = started.search(log_path.read_text())
        assert found is not None, log_path.read_text()
        name = found.group(1)
        assert demo.wait(90) == 128 + signal.SIGTERM, log_path.read_text()
        wait_until(  # its last processes follow the supervisor out (a parent-death signal,
            lambda: not _running_with(name) and _command_line(cluster) is None,  # or a look
            timeout_s=5,  # every half second when the supervisor went before they could watch)
            what="the demo's cluster outlived it",
            log=lambda: _described([*_running_with(name), cluster]),
        )
        with pytest.raises(ConnectionRefusedError):  # the broker the demo started went with it
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return before_exec
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(30)
        _kill_all_under(folder)  # whatever a failure left


def _runs_python(pid: int) -> bool:
    return Path(executable(pid) or "").name.startswith("python")


def _command_line(pid: int) -> str | None:
    """``pid``'s command line; None once it is gone or a zombie."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() or None
    return None


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
