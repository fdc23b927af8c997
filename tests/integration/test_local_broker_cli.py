"""``epochal kafka start|stop|status`` as a user runs it, including the broken set-ups."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from epochal.config import CacheConfig
from tests.conftest import free_port_pair, port_is_free
from tests.integration.cluster import executable, first_child, wait_until

pytestmark = pytest.mark.integration

EPOCHAL = str(Path(sys.executable).parent / "epochal")


def _epochal(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EPOCHAL, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def _broker_pids(data_dir: Path) -> list[int]:
    found = subprocess.run(
        ["pgrep", "-f", f"{data_dir}/server.properties"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [int(pid) for pid in found.stdout.split()]


def _command_line(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_start_twice_gives_one_broker_and_stop_frees_the_port(
    cache: CacheConfig, tmp_path: Path
) -> None:
    port = free_port_pair()
    flags = ["--cache", str(cache.root), "kafka"]
    where = ["--port", str(port), "--data-dir", str(tmp_path / "broker")]
    try:
        first = _epochal(*flags, "start", *where)
        assert first.returncode == 0, first.stderr
        assert f"running at 127.0.0.1:{port}" in first.stderr

        second = _epochal(*flags, "start", *where)
        assert second.returncode == 0, second.stderr
        assert "already running" in second.stderr and "nothing started" in second.stderr
        assert len(_broker_pids(tmp_path / "broker")) == 1
        # what docs/tutorial.md says it runs with: C1 only, at most 1 GB of heap
        jvm_flags = _command_line(_broker_pids(tmp_path / "broker")[0])
        assert "-XX:TieredStopAtLevel=1" in jvm_flags and "-Xmx1024m" in jvm_flags

        status = _epochal(*flags, "status", *where)
        assert status.returncode == 0 and "running at" in status.stderr

        # the port asked about, another data dir (this cache's default one, say): it runs
        other = _epochal(*flags, "status", "--port", str(port), "--data-dir", str(tmp_path / "x"))
        assert other.returncode == 0, other.stderr
        said = " ".join(other.stderr.split())
        assert f"running at 127.0.0.1:{port} (pid {_broker_pids(tmp_path / 'broker')[0]})" in said
        assert f"from data dir {tmp_path / 'broker'}, not from {tmp_path / 'x'}" in said
    finally:
        stop = _epochal(*flags, "stop", *where)
    assert stop.returncode == 0 and "stopped" in stop.stderr
    assert port_is_free(port) and port_is_free(port + 1)
    assert _broker_pids(tmp_path / "broker") == []
    after = _epochal(*flags, "status", *where)
    assert after.returncode == 3 and "not running" in after.stderr


def test_start_without_java_says_to_install_it(cache: CacheConfig, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)  # the venv only: no java on it
    port = free_port_pair()
    result = _epochal(
        "--cache", str(cache.root), "kafka", "start", "--port", str(port),
        "--data-dir", str(tmp_path), env=env,
    )  # fmt: skip
    assert result.returncode == 1
    assert "Java was not found" in result.stderr and "JAVA_HOME" in result.stderr
    assert port_is_free(port)


def test_start_on_a_taken_port_names_the_port(cache: CacheConfig, tmp_path: Path) -> None:
    port = free_port_pair()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result = _epochal(
            "--cache", str(cache.root), "kafka", "start", "--port", str(port),
            "--data-dir", str(tmp_path),
        )  # fmt: skip
    assert result.returncode == 1
    assert f"port {port}" in result.stderr and "already in use" in result.stderr
    assert _broker_pids(tmp_path) == []


def test_start_without_jars_says_how_to_fetch_them(tmp_path: Path) -> None:
    result = _epochal(
        "--cache", str(tmp_path / "empty-cache"), "kafka", "start",
        "--port", str(free_port_pair()), "--data-dir", str(tmp_path / "broker"),
    )  # fmt: skip
    assert result.returncode == 1
    assert "jars are missing" in result.stderr and "epochal jars fetch" in result.stderr


def test_status_on_a_port_another_process_holds_says_so(cache: CacheConfig, tmp_path: Path) -> None:
    port = free_port_pair()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        where = ["--port", str(port), "--data-dir", str(tmp_path)]
        result = _epochal("--cache", str(cache.root), "kafka", "status", *where)
    assert result.returncode == 3, result.stderr
    said = " ".join(result.stderr.split())
    assert f"Kafka is not running at 127.0.0.1:{port}" in said
    assert f"port {port} on 127.0.0.1 is taken by another process" in said


def test_ctrl_c_as_the_broker_is_launched_leaves_no_broker(
    cache: CacheConfig, tmp_path: Path
) -> None:
    """Ctrl-C lands as ``epochal kafka start`` forks the broker's JVM, inside ``Popen``: the
    start stops what it launched. Landing before the child's ``exec`` takes a few tries."""
    port = free_port_pair()
    data = tmp_path / "broker"
    command = [EPOCHAL, "--cache", str(cache.root), "kafka"]
    where = ["--port", str(port), "--data-dir", str(data)]
    formatted = _epochal(*command[1:], "start", *where)  # formatted once: the JVM is then
    assert formatted.returncode == 0, formatted.stderr  # the start's only child
    assert _epochal(*command[1:], "stop", *where).returncode == 0
    for _ in range(5):
        start = subprocess.Popen([*command, "start", *where], stderr=subprocess.PIPE, text=True)
        try:
            child = first_child(start)
            start.send_signal(signal.SIGINT)
            before_exec = executable(child) == executable(start.pid)  # still the CLI's Python
            _, said = start.communicate(timeout=60)
            assert start.returncode != 0, said  # interrupted, not started
            wait_until(lambda: not _broker_pids(data) and port_is_free(port), timeout_s=10,
                       what="the broker outlived the interrupted start",
                       log=lambda said=said: f"{_broker_pids(data)} {said}")  # fmt: skip
        finally:
            if start.poll() is None:
                start.kill()
            for pid in _broker_pids(data):  # what a failure left (no pid file names it)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if before_exec:
            break
