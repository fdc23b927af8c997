"""Children of a supervisor die with it, even when it dies before they are set up; ps tells
the roles apart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from epochal.actors.lifecycle import is_title_of, kill_earlier
from tests.conftest import gone

CHILD = textwrap.dedent("""
    import os, sys, time
    from epochal.actors.lifecycle import die_with_parent, set_title
    die_with_parent(int(sys.argv[1]))
    set_title("epochal: worker 1 of bank (generation 3)")
    print(os.getpid(), flush=True)
    time.sleep(60)
""")
PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())],
                             stdout=subprocess.PIPE, text=True)
    print(child.stdout.readline().strip(), flush=True)
    time.sleep(60)
""")


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_child_dies_when_its_parent_is_killed_and_shows_its_role_in_ps() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").strip()
        assert cmdline == b"epochal: worker 1 of bank (generation 3)"
        parent.kill()
        parent.wait()
        assert _gone(child, timeout_s=2.0)
    finally:
        parent.kill()
        if parent.stdout is not None:
            parent.stdout.close()


def test_a_child_whose_parent_died_before_it_was_set_up_dies_at_once() -> None:
    # the pid passed down is not the parent's any more: as if it had died and been replaced
    not_the_parent = str(os.getpid() + 1_000_000)
    done = subprocess.run([sys.executable, "-c", CHILD, not_the_parent], check=False,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("title", "mine"),
    [
        ("epochal: supervisor of bank", True),
        ("epochal: watch of bank", True),
        ("epochal: worker 12 of bank (generation 3)", True),
        ("epochal: sequencer of bank.eu", False),
        ("epochal: supervisor of bank2", False),
        ("vim epochal: supervisor of bank", False),
        ("python -m epochal run bank", False),
    ],
)
def test_only_titles_of_the_apps_processes_are_its_own(title: str, mine: bool) -> None:
    assert is_title_of(title, "bank") is mine


TITLED = (
    "import sys, time, setproctitle; setproctitle.setproctitle(sys.argv[1]); print(1, "
    "flush=True); time.sleep(60)"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_earlier_runs_processes_are_killed_and_nothing_else() -> None:
    titles = [
        "epochal: worker 0 of bank (generation 2)",
        "epochal: worker 0 of bank2 (generation 2)",
    ]
    processes = [
        subprocess.Popen([sys.executable, "-c", TITLED, t], stdout=subprocess.PIPE, text=True)
        for t in titles
    ]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline()  # titled
        pids = [p.pid for p in processes]
        assert kill_earlier([*pids, os.getpid()], "bank") == pids[:1]
        assert processes[0].wait(5) == -signal.SIGKILL
        assert processes[1].poll() is None  # another app's
    finally:
        for process in processes:
            process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()
