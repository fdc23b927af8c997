"""A worker's heap gives back the big buffers its snapshots free, whatever it freed before."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_AFTER_A_SNAPSHOT = textwrap.dedent(
    """
    import sys
    from epochal.actors.lifecycle import steady_heap

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 1e6

    if sys.argv[1] == "steady":
        assert steady_heap()
    big = bytearray(b"z" * (32 << 20))
    del big  # glibc raises its threshold to what it unmapped: 32 MB
    buffers = [bytearray(b"x" * (1 << 20)) for _ in range(200)]  # the next snapshot's
    pin = bytearray(b"y" * (1 << 20))  # still in use, after them
    before = rss_mb()
    del buffers
    print(before, rss_mb())
    """
)


def _freed_mb(mode: str) -> float:
    command = [sys.executable, "-c", _AFTER_A_SNAPSHOT, mode]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    before, after = (float(x) for x in out.split())
    return before - after


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt, /proc")
def test_buffers_a_snapshot_frees_leave_the_rss_at_once() -> None:
    assert _freed_mb("steady") > 150
    assert _freed_mb("glibc's default") < 50  # what the test tells apart: it can fail


_POOLS = textwrap.dedent(
    """
    import os
    import pyarrow as pa
    from epochal.actors.lifecycle import system_heap_for_arrow

    system_heap_for_arrow()
    pid = os.fork()  # a worker's snapshot process
    if pid == 0:
        os.write(1, pa.default_memory_pool().backend_name.encode() + b" ")
        os._exit(0)
    os.waitpid(pid, 0)  # the child's line first
    print(pa.default_memory_pool().backend_name)
    """
)


def test_a_worker_and_its_snapshot_process_give_arrow_the_system_heap() -> None:
    out = subprocess.run([sys.executable, "-c", _POOLS], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert out.split() == ["system", "system"]


_BETWEEN_LIVE_CHUNKS = textwrap.dedent(
    """
    import sys
    from epochal.actors.lifecycle import give_back_heap

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 1e6

    chunks = [bytearray(b"x" * 8000) for _ in range(25_000)]  # under the mmap threshold
    kept = chunks[::64]  # a part's buffers freed, what was made between them still in use
    del chunks
    before = rss_mb()
    if sys.argv[1] == "trim":
        assert give_back_heap()
    print(before, rss_mb())
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, /proc")
def test_a_trim_gives_back_the_pages_freed_between_live_chunks() -> None:
    def freed(mode: str) -> float:
        command = [sys.executable, "-c", _BETWEEN_LIVE_CHUNKS, mode]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        before, after = (float(x) for x in out.split())
        return before - after

    assert freed("trim") > 150
    assert freed("none") < 20  # what the test tells apart: it can fail
