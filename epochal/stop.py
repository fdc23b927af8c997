"""``epochal stop``: stop a running app the clean way, at a savepoint, from another shell.

It finds the app's supervisor through ``<run-dir>/<app>/processes.json`` (written by
``epochal run``), checks that the pid is still that app's supervisor (a pid the system gave to
another program is left alone), sends it SIGTERM and waits for it to exit: the cluster runs a
final epoch, commits its snapshot and egress, and stops (docs/operations.md).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from epochal.actors.lifecycle import process_title
from epochal.errors import ConfigError

__all__ = ["stop_app"]


def stop_app(app: str, run_dir: Path, timeout_s: float) -> int:
    """SIGTERM the supervisor of ``app`` and wait until it is gone; its pid. ConfigError if
    the app is not running here, or did not stop within ``timeout_s``."""
    status = run_dir / app / "processes.json"
    try:
        pid = json.loads(status.read_text())["supervisor"]
    except (OSError, ValueError, KeyError):
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
