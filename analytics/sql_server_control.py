"""``epochal sql``'s side of the warm SQL server (``sql_server.py``): find the one running for a
cache, start one (one start at a time), stop it, and open a Spark Connect session on it.

A session opened here is a Spark Connect one: pyspark then builds Connect columns process-wide,
so the process must not also hold a classic session.

    >>> config = SqlServerConfig(cache.sql_server_dir(), SparkConfig(cache.jar_dir("spark")))
    >>> server = find_server(config) or start_server(config)
    >>> with remote_session(server, config) as spark:
    ...     register_views(spark, "bank", "warehouse")
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from epochal.analytics.spark import spark_jars
from epochal.analytics.sql_server import command, secrets_input
from epochal.analytics.sql_server_state import (
    ServerFiles,
    ServerSettings,
    ServerState,
    answers,
    is_server,
    running_server,
)
from epochal.config import SqlServerConfig
from epochal.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["find_server", "remote_session", "start_server", "stop_server"]

logger = logging.getLogger(__name__)

_JVM_FAILURE = re.compile(r'^Exception in thread "main" (.+)$')
_GRPC_DETAILS = re.compile(r'details = "([^"]*)"')
_POLL_S = 0.2
_SPAWN_TIMEOUT_S = 30.0  # the detaching parent only forks and prints a pid
_STOP = "`epochal sql --stop-server` stops it"
_NO_SERVER = "`epochal sql --no-server` runs a query without one"


def find_server(config: SqlServerConfig) -> ServerState | None:
    """The server running for ``config``'s directory, checked to answer and to have the settings
    asked for; None if none runs."""
    files = ServerFiles(config.directory)
    state = running_server(files)
    if state is None:
        return None
    if not answers(state.port):
        raise ConfigError(
            f"the SQL server (pid {state.pid}) does not answer on 127.0.0.1:{state.port}: "
            f"{_STOP}; its log is {files.log}"
        )
    asked = ServerSettings.of(config.spark)
    if state.settings != asked or config.port not in (0, state.port):
        raise ConfigError(
            f"the SQL server running (pid {state.pid}, port {state.port}, --master "
            f"{state.settings.master}) was started with other settings than this command's: "
            f"{_STOP}, or {_NO_SERVER}"
        )
    return state


def start_server(config: SqlServerConfig) -> ServerState:
    """A server started now and answering, or the one another command started meanwhile."""
    files = ServerFiles(config.directory)
    files.directory.mkdir(parents=True, exist_ok=True)
    spark_jars(config.spark.jar_dir)  # missing jars: said here in one line, not in a log
    with _start_lock(files):
        running = find_server(config)
        if running is not None:
            return running
        pid = _spawn(config, files, secrets.token_urlsafe(32))
        return _wait_until_serving(pid, config, files)


@contextlib.contextmanager
def _start_lock(files: ServerFiles) -> Iterator[None]:
    with files.lock.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _spawn(config: SqlServerConfig, files: ServerFiles, token: str) -> int:
    """Run the server detached; its pid (the detaching parent has exited)."""
    with files.log.open("wb") as log:
        done = subprocess.run(
            command(config),
            input=secrets_input(config, token),
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=files.directory,
            timeout=_SPAWN_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        raise ConfigError(
            f"the SQL server could not be started: {_why(files)}; its log is {files.log}; "
            f"{_NO_SERVER}"
        )
    pid = int(done.stdout)
    logger.info("sql server started pid=%d log=%s", pid, files.log)
    return pid


def _wait_until_serving(pid: int, config: SqlServerConfig, files: ServerFiles) -> ServerState:
    """The server's state once it answers; one ConfigError if it ends or takes too long."""
    deadline = time.monotonic() + config.startup_timeout_s
    while time.monotonic() < deadline:
        state = files.read()
        if state is not None and state.pid == pid and answers(state.port):
            return state
        if not is_server(pid):
            raise ConfigError(
                f"the SQL server ended while starting: {_why(files)}; its log is "
                f"{files.log}; {_NO_SERVER}"
            )
        time.sleep(_POLL_S)
    _kill(pid)
    raise ConfigError(
        f"the SQL server did not answer within {config.startup_timeout_s:g} s and was stopped; "
        f"its log is {files.log}; {_NO_SERVER}"
    )


def _why(files: ServerFiles) -> str:
    """Why the server failed, from its log: the JVM's own failure if it had one (the Python side
    then only says that the JVM exited), else the server's last line."""
    lines = files.log.read_text(errors="replace").strip().splitlines() if files.log.exists() else []
    for line in lines:
        failed = _JVM_FAILURE.match(line)
        if failed:
            return failed.group(1)
    return lines[-1].strip().removeprefix("error: ") if lines else "it said nothing"


def stop_server(config: SqlServerConfig, timeout_s: float = 30.0) -> ServerState | None:
    """Stop the running server (SIGTERM, then SIGKILL to its process group after ``timeout_s``);
    the server stopped, or None if none ran."""
    files = ServerFiles(config.directory)
    state = running_server(files)
    if state is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(state.pid, signal.SIGTERM)
    if not _gone_within(state.pid, timeout_s):
        _kill(state.pid)
    files.remove(state.pid)
    return state


def _gone_within(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while is_server(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _kill(pid: int) -> None:
    """SIGKILL the server and its JVM: the server leads its own process group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _gone_within(pid, 10.0)


def _grpc_reason(exc: Exception) -> str:
    """What gRPC said (its ``details``), not the repr of the call it wraps."""
    text = str(exc)
    details = _GRPC_DETAILS.search(text)
    return details.group(1) if details else (text.strip().splitlines() or [repr(exc)])[0]


@contextlib.contextmanager
def remote_session(state: ServerState, config: SqlServerConfig) -> Iterator[SparkSession]:
    """A Spark Connect session on the server, released at the end; the server counts its idle
    time from the start and the end of each such session. A failure of the server itself (not
    of a query, which the history views translate) is one ConfigError naming its log."""
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException
    from pyspark.sql import SparkSession

    files = ServerFiles(config.directory)
    files.touch_used()
    spark = SparkSession.builder.remote(state.url).getOrCreate()
    try:
        yield spark
    except SparkConnectGrpcException as exc:
        raise ConfigError(
            f"the SQL server (pid {state.pid}) failed: {_grpc_reason(exc)}; its log is "
            f"{files.log}; {_STOP}"
        ) from exc
    finally:
        spark.stop()
        files.touch_used()
