"""Where the warm SQL server of a cache says it runs, and whether it still does.

The server writes ``server.json`` (its pid, port and settings) once it answers, and removes it
when it stops; ``epochal sql`` touches ``used`` at each query, and the server stops itself once
``used`` is older than its idle timeout. A state file whose pid is gone, or is some other
program now, is stale: :func:`running_server` removes it.

    >>> files = ServerFiles(Path("~/.cache/epochal/sql-server"))
    >>> running_server(files)  # None, or ServerState(pid=..., port=..., ...)
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from epochal.config import SparkConfig

__all__ = [
    "SERVER_MODULE",
    "ServerFiles",
    "ServerSettings",
    "ServerState",
    "answers",
    "is_server",
    "running_server",
]

SERVER_MODULE = "epochal.analytics.sql_server"  # what the server's command line runs
_CONNECT_TIMEOUT_S = 1.0


class ServerSettings(msgspec.Struct, frozen=True):
    """What a server was started with; a query asking for other settings cannot reuse it. The
    Spark settings are kept as a digest: they may hold secrets (object-store keys)."""

    master: str
    driver_memory: str
    conf_digest: str

    @classmethod
    def of(cls, spark: SparkConfig) -> ServerSettings:
        conf = msgspec.json.encode(sorted(spark.conf.items()))
        return cls(spark.master, spark.driver_memory, hashlib.sha256(conf).hexdigest())


class ServerState(msgspec.Struct, frozen=True):
    """A running server: its process, its port on 127.0.0.1, when and how it started, and the
    token its clients bear."""

    pid: int
    port: int
    started_ms: int
    idle_timeout_s: float
    settings: ServerSettings
    token: str

    @property
    def url(self) -> str:
        """The Spark Connect address; ``localhost`` is what makes pyspark send the token over a
        plain (loopback) connection rather than ask for TLS."""
        return f"sc://localhost:{self.port}/;token={self.token}"


@dataclass(frozen=True)
class ServerFiles:
    """The files of one cache's server, all in ``directory``."""

    directory: Path

    @property
    def state(self) -> Path:
        return self.directory / "server.json"

    @property
    def log(self) -> Path:
        return self.directory / "server.log"

    @property
    def used(self) -> Path:
        return self.directory / "used"

    @property
    def lock(self) -> Path:
        return self.directory / "start.lock"

    @property
    def work_dir(self) -> Path:
        return self.directory / "spark"

    def read(self) -> ServerState | None:
        """The state file's record; None when there is none, or it is unreadable."""
        try:
            return msgspec.json.decode(self.state.read_bytes(), type=ServerState)
        except (FileNotFoundError, msgspec.DecodeError):
            return None

    def write(self, state: ServerState) -> None:
        """Atomically (a reader sees the whole record or none), readable by this user only."""
        partial = self.state.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(msgspec.json.encode(state))
        partial.replace(self.state)

    def remove(self, pid: int) -> None:
        """Remove the state file if it is still ``pid``'s."""
        state = self.read()
        if state is not None and state.pid == pid:
            self.state.unlink(missing_ok=True)

    def touch_used(self) -> None:
        self.used.touch()

    def idle_s(self, now: float | None = None) -> float:
        """Seconds since the last query began or ended (since the start, before the first)."""
        try:
            used = self.used.stat().st_mtime
        except FileNotFoundError:
            return 0.0
        return max(0.0, (time.time() if now is None else now) - used)


def is_server(pid: int) -> bool:
    """Process ``pid`` is alive and runs the server module (not a pid reused by another one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: not ours
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no /proc (macOS): the pid must do
    if status.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    return command == [b""] or SERVER_MODULE.encode() in command  # empty: still exec-ing


def answers(port: int) -> bool:
    """Something accepts connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def running_server(files: ServerFiles) -> ServerState | None:
    """The server the state file names, if it still runs; a stale state file is removed."""
    state = files.read()
    if state is None:
        return None
    if not is_server(state.pid):
        files.remove(state.pid)
        return None
    return state
