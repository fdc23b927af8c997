"""The processes a benchmark run measures: a cluster (``epochal run``) or a baseline, each with a
sampler reading its roles' CPU and memory from ``/proc``, and the egress count that times a drain.

A cluster's roles come from its status file (``<run dir>/<name>/processes.json``: supervisor,
sequencer, workers) plus each worker's snapshot process (the worker's child) and the local
broker; CPU is user + system time from ``/proc/<pid>/stat``, summed over every process that held
a role (a rollback starts new ones), so that a run's CPU per transaction is a steady measure
where its wall-clock rate is not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from confluent_kafka import TopicPartition
from rich.progress import Progress

from bench.scratch import scratch_dir
from epochal.interrupts import interrupts_held
from epochal.log.client import KafkaClients, arrived

__all__ = [
    "BANK_APP",
    "BANK_OUTPUTS",
    "OUTSIDE",
    "ClusterProcess",
    "MeasuredProcess",
    "RssSampler",
    "Setup",
    "children",
    "count_egress",
    "cpu_s",
    "end_offset",
    "rollbacks_logged",
    "rss_mb",
    "snapshots_taken",
]

BANK_APP = "examples.bank.app:app"
BANK_OUTPUTS = ("receipts", "errors")  # the bank's egress: one record per transfer


def count_egress(
    clients: KafkaClients,
    name: str,
    transfers: int,
    progress: Progress,
    *,
    outputs: Sequence[str] = BANK_OUTPUTS,
    process: MeasuredProcess | None = None,
    timeout_s: float = 600,
    timeline: list[tuple[float, int]] | None = None,
) -> tuple[float, float]:
    """Reads app ``name``'s egress ``outputs`` (``read_committed``) until ``transfers`` records
    came out; when the first and the last did (monotonic). SystemExit, with where its log is,
    if ``process`` (the cluster, or the baseline) ends before, or after ``timeout_s``.
    ``timeline`` gets ``(monotonic time, records out so far)`` at each batch: what a long run
    plots its memory against."""
    consumer = clients.consumer(
        **{"isolation.level": "read_committed", "group.id": f"{name}.bench"}
    )
    consumer.assign([TopicPartition(f"{name}.out.{t}", 0, 0) for t in outputs])
    task = progress.add_task(f"{name}", total=transfers)
    seen, first, last = 0, 0.0, 0.0
    deadline = time.monotonic() + timeout_s
    while seen < transfers and time.monotonic() < deadline:
        if process is not None and process.exited():
            consumer.close()
            raise SystemExit(
                f"{name} ended after {seen} of {transfers} records: its log is "
                f"{process.run_dir / 'run.log'}"
            )
        batch = arrived(consumer, 10_000, 0.2)
        if batch:
            now = time.monotonic()
            first = first or now
            last = now
            seen += sum(1 for m in batch if m.error() is None)
            progress.update(task, completed=seen)
            if timeline is not None:
                timeline.append((now, seen))
    consumer.close()
    if seen < transfers:
        raise SystemExit(f"only {seen} of {transfers} transfers came out")
    return first, last


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime: fields 14 and 15


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux), none once it is gone."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


OUTSIDE = ("broker", "bench")  # roles whose memory is not the system's under test


class RssSampler(threading.Thread):
    """Samples a run's processes (from its status file, or ``pids``: a baseline's one process):
    their RSS every ``interval_s`` (the peak per role, and the whole series) and their CPU time
    every ``cpu_interval_s`` (per role, summed over every process that held it: a rollback
    starts new ones). The broker's and this process's CPU count too (``broker``, ``bench``: the
    load generator of an open-loop run, and the reader of the egress), not their memory, unless
    ``untracked`` says otherwise (a long run charts the broker's too)."""

    def __init__(
        self,
        status_file: Path | None,
        interval_s: float = 1.0,
        cpu_interval_s: float = 0.1,
        broker_pid: int | None = None,
        pids: dict[str, int] | None = None,
        *,
        untracked: Sequence[str] = OUTSIDE,
    ) -> None:
        super().__init__(daemon=True)
        self.status_file = status_file
        self.pids = pids or {}
        self.interval_s = interval_s
        self.cpu_interval_s = cpu_interval_s
        self.broker_pid = broker_pid
        self.untracked = tuple(untracked)  # roles whose RSS is not sampled
        self.peak: dict[str, float] = {}
        self.series: list[tuple[float, dict[str, float]]] = []  # (s since ``began``, role -> MB)
        self.began = 0.0  # monotonic time sampling started: ``series``' zero
        self.cpu: list[tuple[float, dict[str, float]]] = []  # (monotonic time, role -> CPU s)
        self.logging_from: float | None = None  # when the command log first held an epoch
        self.log_end: Callable[[], int] | None = None  # the command log's end offset
        self._cpu_of: dict[tuple[str, int], float] = {}  # last reading per (role, pid)
        self.generation = 0
        self.stopping = threading.Event()

    def _roles(self) -> dict[str, int]:
        if self.status_file is None:
            return dict(self.pids)
        status = json.loads(self.status_file.read_text())
        self.generation = int(status.get("generation", 0))
        roles = {"supervisor": status["supervisor"], "sequencer": status["sequencer"]}
        roles |= {f"worker{w}": pid for w, pid in enumerate(status["workers"])}
        roles = {role: int(pid) for role, pid in roles.items() if pid}
        for w, pid in enumerate(status["workers"]):  # each worker's snapshot process
            for child in children(int(pid)) if pid else ():
                roles[f"snapshots{w}"] = child
        return roles

    def run(self) -> None:
        started = next_rss = self.began = time.monotonic()
        while not self.stopping.wait(self.cpu_interval_s):
            try:
                roles = self._roles()
            except (OSError, ValueError, KeyError):
                continue
            if self.broker_pid is not None:
                roles["broker"] = self.broker_pid
            roles["bench"] = os.getpid()  # the load generator (open loop) and egress reader
            self._sample_cpu(roles)
            if self.logging_from is None and self.log_end is not None and self.log_end() > 0:
                self.logging_from = self.cpu[-2][0] if len(self.cpu) > 1 else self.cpu[-1][0]
            if time.monotonic() >= next_rss:  # not catching up after a gap: one sample
                next_rss = time.monotonic() + self.interval_s
                sample = {r: rss_mb(pid) for r, pid in roles.items() if r not in self.untracked}
                self.series.append((time.monotonic() - started, sample))
                for role, mb in sample.items():
                    self.peak[role] = max(self.peak.get(role, 0.0), mb)

    def _sample_cpu(self, roles: dict[str, int]) -> None:
        for role, pid in roles.items():
            used = cpu_s(pid)
            if used is not None:
                self._cpu_of[role, pid] = used
        totals: dict[str, float] = {}
        for (role, _), used in self._cpu_of.items():
            totals[role] = totals.get(role, 0.0) + used
        self.cpu.append((time.monotonic(), totals))

    def cpu_between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds each role used from ``start`` to ``end`` (monotonic times), from the
        last sample at or before ``start`` to the first at or after ``end``."""
        before = [s for t, s in self.cpu if t <= start] or [s for _, s in self.cpu[:1]]
        after = [s for t, s in self.cpu if t >= end] or [s for _, s in self.cpu[-1:]]
        if not before or not after:
            return {}
        first, last = before[-1], after[0]
        used = {role: cpu - first.get(role, 0.0) for role, cpu in last.items()}
        if self.logging_from is not None and "sequencer" in last:
            logging = [s for t, s in self.cpu if t <= self.logging_from] or [
                s for _, s in self.cpu[:1]
            ]
            used["sequencer"] = last["sequencer"] - logging[-1].get("sequencer", 0.0)
        return used


@dataclass(frozen=True)
class Setup:
    """One configuration compared: a checkout of epochal, a worker count, snapshot settings
    (``off``, an interval in ms, ``weak``: weak recovery with the default interval, or
    ``default``: the checkout's own default, no flag), and the records after which an epoch
    closes (``--epoch-records``; None: the checkout's default, no flag)."""

    checkout: Path
    workers: int
    snapshots: str = "default"
    epoch_records: int | None = None

    @property
    def label(self) -> str:
        snapshots = "" if self.snapshots == "default" else f", snapshots {self.snapshots}"
        epochs = "" if self.epoch_records is None else f", epochs of {self.epoch_records:,}"
        return f"{self.checkout.name}, {self.workers}w{snapshots}{epochs}"


def _command(
    setup: Setup, app: str, name: str, bootstrap: str, *, port_base: int, run_dir: Path
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "epochal.cli",
        "run",
        app,
        "--name",
        name,
        "--bootstrap",
        bootstrap,
        "--workers",
        str(setup.workers),
        "--partitions",
        str(2 * setup.workers),
        "--port-base",
        str(port_base),
        "--run-dir",
        str(run_dir),
    ]
    cli = (setup.checkout / "epochal" / "cli.py").read_text()  # the flags this checkout has
    if "--warehouse" in cli:  # a checkout with snapshots: never into its own tree
        command += ["--warehouse", str(run_dir / "warehouse")]
    if "--query-port" in cli:  # not the default 7700: clusters of one run each own
        command += ["--query-port", str(port_base + 8)]
    if setup.snapshots == "off":
        command.append("--no-snapshots")
    elif setup.snapshots == "weak":
        command += ["--recovery", "weak"]
    elif setup.snapshots != "default":
        command += ["--snapshot-interval-ms", setup.snapshots]
    if setup.epoch_records is not None and "--epoch-records" in cli:
        command += ["--epoch-records", str(setup.epoch_records)]
    return command


def snapshots_taken(run_dir: Path) -> int:
    """Snapshots committed during the run, as its log says."""
    try:
        return (run_dir / "run.log").read_text(errors="replace").count("snapshot committed ssid=")
    except OSError:
        return 0


def rollbacks_logged(run_dir: Path) -> int:
    """Rollbacks to a new generation during the run, as its supervisor logged them: a rollback
    the status file no longer shows (it is read every 0.1 s) is still counted."""
    try:
        return (run_dir / "run.log").read_text(errors="replace").count("rolling back generation=")
    except OSError:
        return 0


class MeasuredProcess:
    """A process a run measures, started from ``cwd`` (its log in ``run_dir/run.log``), its
    CPU and RSS sampled by ``sampler``; stopped by SIGTERM."""

    command: list[str]
    sampler: RssSampler

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.run_dir = scratch_dir("run-")
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def __enter__(self) -> Self:
        """Start it; a SIGTERM or Ctrl-C on the way (no ``__exit__`` then) stops it here."""
        env = {**os.environ, "PYTHONPATH": str(self.cwd)}
        try:
            with open(self.run_dir / "run.log", "wb") as log, interrupts_held():
                self.started = time.monotonic()
                self.process = subprocess.Popen(
                    self.command, cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT
                )
            self._started(self.process.pid)
            self.sampler.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def _started(self, pid: int) -> None:
        """Before sampling starts (a cluster's sampler finds its pids in its status file)."""

    def __exit__(self, *exc: object) -> None:
        self.sampler.stopping.set()
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)


class ClusterProcess(MeasuredProcess):
    """``epochal run`` of ``app`` (the bank by default) for one run, of ``setup``'s checkout."""

    def __init__(
        self,
        setup: Setup,
        name: str,
        bootstrap: str,
        port_base: int,
        broker_pid: int | None = None,
        *,
        app: str = BANK_APP,
    ) -> None:
        super().__init__(setup.checkout)
        self.setup = setup
        self.name = name
        self.command = _command(
            setup, app, name, bootstrap, port_base=port_base, run_dir=self.run_dir
        )
        self.sampler = RssSampler(self.run_dir / name / "processes.json", broker_pid=broker_pid)

    def facts(self) -> dict[str, Any]:
        return {
            "checkout": str(self.setup.checkout),
            "workers": self.setup.workers,
            "partitions": 2 * self.setup.workers,
            "snapshots": self.setup.snapshots,
            "epoch_records": self.setup.epoch_records,
            "snapshots_taken": snapshots_taken(self.run_dir),
            "rollbacks": max(0, self.sampler.generation - 1),
            "peak_rss_mb": self.sampler.peak,
        }


def end_offset(clients: KafkaClients, topic: str) -> int:
    """A topic's end offset, 0 while it does not exist yet (asked without creating it)."""
    if topic not in clients.admin().list_topics(timeout=5).topics:
        return 0
    return clients.end_offset(topic)
