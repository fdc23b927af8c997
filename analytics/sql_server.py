"""The warm SQL server: one Spark session served over Spark Connect on 127.0.0.1, started once by
``epochal sql`` and queried by every later call, which then pays for no JVM start.

It is this module run as a program, detached from the command that started it (``--detach``):
the session comes from :func:`~epochal.analytics.spark.spark_session` (Delta and the Kafka source
from the jar cache) with Spark's Connect plugin added, which serves it over gRPC. It writes its
state file once it listens, and stops (removing the file) on SIGTERM, or once no query came for
its idle timeout and no job runs.

    $ python -m epochal.analytics.sql_server --directory ~/.cache/epochal/sql-server \\
        --jar-dir ~/.cache/epochal/jars/spark --detach < launch.json  # {"conf": {}, "token": …}
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec

from epochal.analytics.spark import spark_session
from epochal.analytics.sql_server_state import ServerFiles, ServerSettings, ServerState
from epochal.config import SparkConfig, SqlServerConfig
from epochal.errors import EpochalError

__all__ = [
    "Launch",
    "command",
    "connect_settings",
    "main",
    "read_launch",
    "secrets_input",
    "serve",
    "should_stop",
    "wait_until_idle",
]

logger = logging.getLogger(__name__)

_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
_MAX_CHECK_S = 30.0  # the idle timeout is checked this often at most


def connect_settings(port: int) -> dict[str, str]:
    """Spark settings that serve a session over Spark Connect on 127.0.0.1 (port 0: any)."""
    return {
        "spark.plugins": _PLUGIN,
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
    }


def should_stop(idle_s: float, idle_timeout_s: float, active_jobs: int) -> bool:
    """Idle long enough, and no query is still running."""
    return idle_s >= idle_timeout_s and active_jobs == 0


def wait_until_idle(
    files: ServerFiles, idle_timeout_s: float, stop: threading.Event, active_jobs: Callable[[], int]
) -> None:
    """Return once ``stop`` is set, or once idle (:func:`should_stop`), checked every tenth of
    the timeout (at most every 30 s)."""
    check_s = min(_MAX_CHECK_S, max(0.1, idle_timeout_s / 10))
    while not stop.wait(check_s):
        if should_stop(files.idle_s(), idle_timeout_s, active_jobs()):
            logger.info("idle for %.0f s: stopping", files.idle_s())
            return


def serve(config: SqlServerConfig, token: str) -> None:
    """Serve until SIGTERM or SIGINT, or until idle (:func:`should_stop`), to clients that bear
    ``token``: another user of this host could otherwise run SQL as this one."""
    files = ServerFiles(config.directory)
    os.environ["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = token  # the JVM's: not on its command line
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    spark = spark_session(
        replace(
            config.spark,
            work_dir=files.work_dir,
            conf={**config.spark.conf, **connect_settings(config.port)},
        )
    )
    try:
        state = ServerState(
            pid=os.getpid(),
            port=_local_port(spark),
            started_ms=int(time.time() * 1000),
            idle_timeout_s=config.idle_timeout_s,
            settings=ServerSettings.of(config.spark),
            token=token,
        )
        files.touch_used()
        files.write(state)
        logger.info("serving port=%d pid=%d", state.port, state.pid)
        tracker = spark.sparkContext.statusTracker()
        wait_until_idle(files, config.idle_timeout_s, stop, lambda: len(tracker.getActiveJobsIds()))
    finally:
        files.remove(os.getpid())
        spark.stop()


def _local_port(spark: Any) -> int:
    """The port the Connect service listens on (the one asked for, or the one picked for 0)."""
    service = getattr(spark._jvm.org.apache.spark.sql.connect.service, "SparkConnectService$")
    return int(getattr(service, "MODULE$").localPort())


def command(config: SqlServerConfig) -> list[str]:
    """The command line that serves ``config``, detached (:func:`main` reads it back), its
    token and Spark settings on stdin (:func:`secrets_input`)."""
    spark = config.spark
    argv = [sys.executable, "-m", __name__, "--detach", "--directory", str(config.directory)]
    argv += ["--port", str(config.port), "--idle-timeout-s", str(config.idle_timeout_s)]
    argv += ["--jar-dir", str(spark.jar_dir), "--master", spark.master]
    argv += ["--app-name", spark.app_name, "--driver-memory", spark.driver_memory]
    return argv


class _Secrets(msgspec.Struct, frozen=True):
    conf: dict[str, str]
    token: str


def secrets_input(config: SqlServerConfig, token: str) -> bytes:
    """The server's stdin: the token clients must bear and the Spark settings (object-store
    keys, say), which ``ps`` would show on a command line."""
    return msgspec.json.encode(_Secrets(dict(config.spark.conf), token))


@dataclass(frozen=True)
class Launch:
    """What :func:`command` and :func:`secrets_input` tell the server."""

    config: SqlServerConfig
    token: str
    detach: bool


def read_launch(argv: Sequence[str] | None, secrets: bytes) -> Launch:
    """The launch :func:`command` and :func:`secrets_input` describe."""
    parser = argparse.ArgumentParser(prog=__name__, description=__doc__)
    parser.add_argument("--directory", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--idle-timeout-s", type=float, default=1800.0)
    parser.add_argument("--jar-dir", type=Path, required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--app-name", default="epochal-sql")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--detach", action="store_true", help="fork, print the pid, and leave")
    args = parser.parse_args(argv)
    given = msgspec.json.decode(secrets, type=_Secrets)
    spark = SparkConfig(
        args.jar_dir, args.master, args.app_name, driver_memory=args.driver_memory, conf=given.conf
    )
    config = SqlServerConfig(args.directory, spark, args.port, args.idle_timeout_s)
    return Launch(config, given.token, args.detach)


def _detach() -> None:
    """The classic daemon's fork: the parent prints the child's pid on stdout and exits at once
    (whoever started it waits for nothing more), the child leaves its session and process group
    (a Ctrl-C of the shell does not reach it), and its stdout joins stderr (the log)."""
    sys.stdout.flush()
    pid = os.fork()
    if pid:
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()
        os._exit(0)
    os.setsid()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    try:
        launch = read_launch(argv, sys.stdin.buffer.read())
    except msgspec.DecodeError as exc:
        print(f"error: stdin is not what `epochal sql` gives a server: {exc}", file=sys.stderr)
        return 2
    if launch.detach:
        _detach()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        serve(launch.config, launch.token)
    except EpochalError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)  # the log's last line
        return 1
    except Exception as exc:
        logger.exception("the SQL server failed")
        print(f"error: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
