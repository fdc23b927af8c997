"""The warm SQL server's bookkeeping, without Spark: its command line read back, its idle rule, a
state file that is stale or names a server with other settings (real processes and sockets)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochal.analytics.sql_server import (
    Launch,
    command,
    read_launch,
    secrets_input,
    should_stop,
    wait_until_idle,
)
from epochal.analytics.sql_server_control import find_server, stop_server
from epochal.analytics.sql_server_state import (
    SERVER_MODULE,
    ServerFiles,
    ServerSettings,
    ServerState,
    running_server,
)
from epochal.config import SparkConfig, SqlServerConfig
from epochal.errors import ConfigError


def _config(tmp_path: Path, **spark: object) -> SqlServerConfig:
    return SqlServerConfig(tmp_path / "sql-server", SparkConfig(tmp_path / "jars", **spark))  # type: ignore[arg-type]


def _state(pid: int, port: int, spark: SparkConfig) -> ServerState:
    settings = ServerSettings.of(spark)
    return ServerState(pid, port, started_ms=0, idle_timeout_s=60, settings=settings, token="t")


@pytest.fixture
def fake_server() -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line names the server module, as the server's does."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", SERVER_MODULE])
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def test_the_command_line_and_stdin_give_back_the_launch(tmp_path: Path) -> None:
    config = SqlServerConfig(
        tmp_path,
        SparkConfig(tmp_path / "jars", "local[1]", "epochal-sql", conf={"spark.x.secret": "s3"}),
        port=15002,
        idle_timeout_s=90.0,
    )
    argv = command(config)
    assert argv[:4] == [sys.executable, "-m", SERVER_MODULE, "--detach"]
    assert "s3" not in " ".join(argv)  # settings go on stdin: `ps` shows the command line
    assert read_launch(argv[3:], secrets_input(config, "tok")) == Launch(config, "tok", True)


@pytest.mark.parametrize(
    ("idle_s", "active_jobs", "stops"),
    [(59.0, 0, False), (60.0, 0, True), (600.0, 1, False)],
)
def test_the_server_stops_once_idle_and_no_job_runs(
    idle_s: float, active_jobs: int, stops: bool
) -> None:
    assert should_stop(idle_s, 60.0, active_jobs) is stops


def test_the_server_waits_while_used_or_busy_and_returns_once_idle(tmp_path: Path) -> None:
    files = ServerFiles(tmp_path)
    files.touch_used()
    jobs = iter([1] * 6)  # checked every 0.1 s: a query runs past the timeout, then none does
    started = time.monotonic()
    wait_until_idle(files, 0.3, threading.Event(), lambda: next(jobs, 0))
    assert 0.6 <= time.monotonic() - started < 3
    stop = threading.Event()
    stop.set()
    files.touch_used()
    started = time.monotonic()
    wait_until_idle(files, 60, stop, lambda: 0)  # SIGTERM: at once, idle or not
    assert time.monotonic() - started < 1


def test_idle_time_counts_from_the_last_use(tmp_path: Path) -> None:
    files = ServerFiles(tmp_path)
    assert files.idle_s() == 0.0  # not used yet: the server has just started
    files.touch_used()
    os.utime(files.used, (time.time() - 100, time.time() - 100))
    assert 99 < files.idle_s() < 110


def test_a_state_file_of_a_gone_or_other_process_is_stale(tmp_path: Path) -> None:
    files = ServerFiles(tmp_path)
    said = [sys.executable, "-c", "import os; print(os.getpid())"]
    ended = subprocess.run(said, capture_output=True, text=True, check=True)
    files.write(_state(int(ended.stdout), 1, SparkConfig(tmp_path)))
    assert stat.S_IMODE(files.state.stat().st_mode) == 0o600  # it holds the clients' token
    assert running_server(files) is None
    assert not files.state.exists()
    files.write(_state(os.getpid(), 1, SparkConfig(tmp_path)))  # a pid now some other program's
    assert running_server(files) is None
    assert not files.state.exists()
    files.state.write_text("{not json")
    assert running_server(files) is None


def test_a_running_server_is_reused_only_with_the_same_settings(
    tmp_path: Path, fake_server: subprocess.Popen[bytes], listener: int
) -> None:
    config = _config(tmp_path, conf={"spark.sql.ansi.enabled": "true"})
    config.directory.mkdir()
    ServerFiles(config.directory).write(_state(fake_server.pid, listener, config.spark))
    found = find_server(config)
    assert found is not None and (found.pid, found.port) == (fake_server.pid, listener)
    with pytest.raises(ConfigError, match=r"other settings.*--stop-server"):
        find_server(_config(tmp_path, conf={"spark.sql.ansi.enabled": "false"}))
    with pytest.raises(ConfigError, match="other settings"):
        find_server(_config(tmp_path, master="local[1]"))


def test_a_server_that_does_not_answer_is_named_with_its_log(
    tmp_path: Path, fake_server: subprocess.Popen[bytes]
) -> None:
    config = _config(tmp_path)
    config.directory.mkdir()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        closed = taken.getsockname()[1]
    ServerFiles(config.directory).write(_state(fake_server.pid, closed, config.spark))
    with pytest.raises(ConfigError, match=r"does not answer.*--stop-server.*server\.log"):
        find_server(config)


def test_stopping_ends_the_server_and_its_state(
    tmp_path: Path, fake_server: subprocess.Popen[bytes], listener: int
) -> None:
    config = _config(tmp_path)
    config.directory.mkdir()
    ServerFiles(config.directory).write(_state(fake_server.pid, listener, config.spark))
    stopped = stop_server(config, timeout_s=10)
    assert stopped is not None and stopped.pid == fake_server.pid
    assert fake_server.wait(10) == -15  # SIGTERM
    assert not ServerFiles(config.directory).state.exists()
    assert stop_server(config) is None
