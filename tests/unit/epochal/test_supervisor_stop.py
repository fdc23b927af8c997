"""A stop that is not a savepoint names the workers the system holds stopped (SIGSTOP)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

from epochal.supervisor import _frozen


def test_a_frozen_worker_is_named_and_a_running_one_is_not() -> None:
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=time.sleep, args=(30,))
    process.start()
    try:
        assert _frozen([process], [1]) == ""
        assert process.pid is not None
        os.kill(process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not _frozen([process], [1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _frozen([process], [1]) == " (worker 1 is stopped by a signal)"
        assert _frozen([process, process], [0, 1]) == " (workers 0, 1 are stopped by a signal)"
    finally:
        process.kill()
        process.join()
    assert _frozen([process], [1]) == ""  # gone
