"""``epochal stop``: stop a running app the clean way, at a savepoint, from another shell.

It finds the app's supervisor through ``<run-dir>/<app>/processes.json`` (written by
``epochal run``), checks that the pid is still that app's supervisor (a pid the system gave to
another program is left alone), sends it SIGTERM and waits for it to exit: the cluster runs a
final epoch, commits its snapshot and egress, and stops (docs/operations.md). How the stop ended
is the supervisor's to say, and it writes it down (:class:`StopRecord`) for ``epochal stop`` to
report: a savepoint, or not and why.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import msgspec

from epochal.actors.lifecycle import process_title
from epochal.errors import ConfigError

__all__ = ["StopRecord", "read_stop", "stop_app", "stop_file", "write_stop"]


class StopRecord(msgspec.Struct, frozen=True):
    """How a supervisor's stop ended: at a savepoint (``ssid``, its snapshot), or not, with
    ``reason``, and ``ssid`` the snapshot the next start resumes from (None: none yet)."""

    savepoint: bool
    ssid: int | None = None
    reason: str = ""


def stop_file(run_dir: Path, app: str) -> Path:
    """Where the supervisor of ``app`` writes its :class:`StopRecord`."""
    return run_dir / app / "stopped.json"


def write_stop(run_dir: Path, app: str, record: StopRecord) -> None:
    path = stop_file(run_dir, app)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(record))


def read_stop(run_dir: Path, app: str) -> StopRecord | None:
    """The record of the last stop, None if the supervisor wrote none (it was killed)."""
    try:
        return msgspec.json.decode(stop_file(run_dir, app).read_bytes(), type=StopRecord)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def stop_app(app: str, run_dir: Path, timeout_s: float) -> int:
    """SIGTERM the supervisor of ``app`` and wait until it is gone; its pid. ConfigError if
    the app is not running here, or did not stop within ``timeout_s``."""
    status = run_dir / app / "processes.json"
    try:
        pid = msgspec.json.decode(status.read_bytes())["supervisor"]
    except (OSError, msgspec.DecodeError, KeyError, TypeError):
        pid = None
    title = process_title(pid) if isinstance(pid, int) else None
    if title != f"epochal: supervisor of {app}":
        raise ConfigError(
            f"app {app!r} is not running here (no supervisor named in {status}): nothing to "
            "stop; pass the --run-dir its `epochal run` was given", app=app,
        )  # fmt: skip
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while process_title(pid) is not None:
        if time.monotonic() > deadline:
            raise ConfigError(
                f"app {app!r} did not stop within {timeout_s:g} s: its supervisor (pid {pid}) is "
                "still stopping; its log says why", app=app,
            )  # fmt: skip
        time.sleep(0.1)
    return pid
