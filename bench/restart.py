"""Restart and failure recovery of the bank: does restart time grow with the log, and how long
from ``kill -9`` of a worker to processing again?

(a) **Restart after a log of N transactions** (``--sizes``, default 10k and 1M), snapshots every
``--snapshot-ms``: the bank drains a backlog of N transfers, stops on SIGTERM, and is started
again ``--repeats`` times; each restart is timed from ``epochal run`` to the moment every
worker has logged ``recovered worker=...`` (loaded the latest snapshot, replayed the command log
after it), with each worker's own ``seconds`` and ``replayed_records`` from those lines and its
``epochal_recovery_seconds`` gauge.

(b) **kill -9 of one worker while transfers flow** at ``--rate`` per second (a fresh cluster per
repeat, fed from its start until ``--after`` seconds after the kill): ``--settle`` seconds after
the first egress record (snapshots taken, steady state) the worker's process, read
from the run's status file, gets SIGKILL. Measured from the kill: the rollback (a new
generation in the status file), the first egress record of the new generation (outputs flowing
again), the first egress record of an input produced after the kill (new input processed), and
every worker's ``recovered`` line.

Medians of the repeats; JSON and PNG go to ``--out``. The local broker listens on ``--port``
(and ``--port`` + 1); workers serve metrics from ``--ports`` and listen from ``--ports`` + 10,
below the kernel's ephemeral range (where any outgoing connection could take them first).

    python -m bench.restart                                  # (a) 10k vs 1M, then (b)
    python -m bench.restart --parts kill --rate 5000 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.bank import (
    ROOT,
    produce,
    produce_events,
)
from bench.open_loop import EgressWatcher, feed_at_rate
from bench.processes import count_egress
from bench.report import plot_bars
from bench.scratch import broker_unless, cleans_up, scratch_dir
from epochal.config import KafkaConfig
from epochal.interrupts import interrupts_held
from epochal.log.client import KafkaClients
from examples.bank.producer import events

console = Console(width=None if sys.stdout.isatty() else 140)

RECOVERED = re.compile(
    r"recovered worker=(?P<worker>\d+) from_ssid=(?P<ssid>-?\d+) "
    r"from_position=(?P<position>\d+) replayed_records=(?P<replayed>\d+) "
    r"seconds=(?P<seconds>[\d.]+)"
)


@dataclass
class Run:
    """``epochal run examples.bank.app:app`` as a subprocess; each start logs to its own file."""

    name: str
    bootstrap: str
    workers: int
    port: int  # metrics on port + w (sequencer port + workers), worker ports from port + 10
    snapshot_ms: int
    run_dir: Path = field(default_factory=lambda: scratch_dir("restart-"))
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"run-{self.starts}.log"

    def start(self) -> float:
        """Start (the previous run must be stopped); returns when (monotonic)."""
        self.starts += 1
        command = [
            sys.executable, "-m", "epochal.cli", "run", "examples.bank.app:app",
            "--name", self.name, "--bootstrap", self.bootstrap,
            "--workers", str(self.workers), "--partitions", str(2 * self.workers),
            "--port-base", str(self.port + 10), "--metrics-port", str(self.port),
            "--run-dir", str(self.run_dir), "--warehouse", str(self.run_dir / "warehouse"),
            "--snapshot-interval-ms", str(self.snapshot_ms),
        ]  # fmt: skip
        with open(self.log_file, "wb") as log, interrupts_held():  # stop() has it once it runs
            started = time.monotonic()
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=log,
                                            stderr=subprocess.STDOUT)  # fmt: skip
        return started

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.run_dir / self.name / "processes.json").read_text()))
        except (OSError, ValueError):
            return {}

    def recovered(self, since: int = 0) -> dict[int, dict[str, float]]:
        """The ``recovered`` lines in this start's log after character ``since``, by worker."""
        return {
            int(m["worker"]): {
                "ssid": int(m["ssid"]),
                "replayed": int(m["replayed"]),
                "seconds": float(m["seconds"]),
            }
            for m in RECOVERED.finditer(self.log()[since:])
        }

    def recovery_gauges(self) -> list[float]:
        """Each worker's ``epochal_recovery_seconds`` (NaN where it cannot be read)."""
        values = []
        for worker in range(self.workers):
            try:
                url = f"http://127.0.0.1:{self.port + worker}/metrics"
                with urllib.request.urlopen(url, timeout=5) as reply:
                    text = reply.read().decode()
                line = next(x for x in text.splitlines()
                            if x.startswith("epochal_recovery_seconds"))  # fmt: skip
                values.append(float(line.rsplit(" ", 1)[1]))
            except (OSError, StopIteration, ValueError):
                values.append(float("nan"))
        return values

    def wait(self, done: Any, timeout_s: float, what: str) -> float:
        """Poll ``done()`` every 20 ms; returns when (monotonic); fails with the log's tail."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline or (self.process and self.process.poll() is not None):
                raise SystemExit(f"{self.name}: {what}\n{self.log()[-3000:]}")
            time.sleep(0.02)
        return time.monotonic()


# --- (a) restart after a log of N transactions ----------------------------------------------


def restart_after(
    bootstrap: str, transfers: int, args: argparse.Namespace, port: int
) -> dict[str, Any]:
    """Drain ``transfers``, then time ``args.repeats`` restarts."""
    name = f"restart{transfers}x{uuid.uuid4().hex[:6]}"
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([f"{name}.in.transfers"])
    with console.status(f"producing {transfers:,} transfers"):
        produce(bootstrap, f"{name}.in.transfers", transfers, args.accounts)
    run = Run(name, bootstrap, args.workers, port, args.snapshot_ms)
    try:
        run.start()
        clients.create_topics([f"{name}.out.receipts", f"{name}.out.errors"])
        drained = time.monotonic()
        with Progress(console=console, transient=True) as progress:
            count_egress(clients, name, transfers, progress)
        drained = time.monotonic() - drained
        time.sleep(2 * args.snapshot_ms / 1000)  # the idle input's last snapshot
        run.stop()
        restarts: list[dict[str, Any]] = []
        for _ in range(args.repeats):
            started = run.start()
            at = run.wait(lambda: len(run.recovered()) == args.workers, 300, "never recovered")
            lines = run.recovered()
            restarts.append({
                "wall_s": at - started,
                "worker_seconds": [lines[w]["seconds"] for w in sorted(lines)],
                "replayed_records": [lines[w]["replayed"] for w in sorted(lines)],
                "from_ssid": [lines[w]["ssid"] for w in sorted(lines)],
                "recovery_seconds_gauge": run.recovery_gauges(),
            })  # fmt: skip
            run.stop()
            console.print(f"  after {transfers:,}: restart {at - started:.2f} s, replayed "
                          f"{restarts[-1]['replayed_records']}")  # fmt: skip
    finally:
        run.stop()
    command_log = clients.watermarks(f"{name}.cmd")
    return {
        "transactions": transfers,
        "drain_s": drained,
        "command_log": {"low": command_log[0], "high": command_log[1]},
        "wall_s": statistics.median(r["wall_s"] for r in restarts),
        "worker_seconds": statistics.median(max(r["worker_seconds"]) for r in restarts),
        "replayed_records": statistics.median(max(r["replayed_records"]) for r in restarts),
        "restarts": restarts,
    }


# --- (b) kill -9 of a worker under a steady rate -------------------------------------------


def _kill_once(bootstrap: str, args: argparse.Namespace, port: int) -> dict[str, Any]:
    name = f"kill{uuid.uuid4().hex[:8]}"
    topic = f"{name}.in.transfers"
    clients = KafkaClients(KafkaConfig(bootstrap))
    clients.create_topics([topic, f"{name}.out.receipts", f"{name}.out.errors"])
    source = events(10**9, args.accounts, seed=2)
    produce_events(bootstrap, topic, [next(source) for _ in range(args.accounts)])
    run = Run(name, bootstrap, args.workers, port, args.snapshot_ms)
    watcher = EgressWatcher(clients, name)
    stamps: dict[int, int] = {}
    stop = threading.Event()
    feeder = threading.Thread(
        target=feed_at_rate,
        args=(bootstrap, topic, source, args.rate, 3600),
        kwargs={"stamps": stamps, "stop": stop},
        daemon=True,
    )
    try:
        run.start()
        watcher.start()
        feeder.start()
        run.wait(lambda: bool(watcher.out), 120, "no egress before the kill")
        time.sleep(args.settle)
        generation = int(run.status()["generation"])
        pid = int(run.status()["workers"][args.kill_worker])
        before = len(run.log())
        killed_ms, killed = time.time() * 1000, time.monotonic()
        os.kill(pid, signal.SIGKILL)
        rolled = run.wait(lambda: int(run.status().get("generation", 0)) > generation, 60,
                          "no rollback")  # fmt: skip
        rolled_ms = time.time() * 1000 - (time.monotonic() - rolled) * 1000
        recovered = run.wait(lambda: len(run.recovered(before)) == args.workers, 120,
                             "no recovery")  # fmt: skip
        lines = run.recovered(before)
        time.sleep(max(0.0, killed + args.after - time.monotonic()))
        stop.set()
        feeder.join(60)
        time.sleep(3)
    finally:
        stop.set()
        watcher.stopping.set()
        run.stop()
        watcher.join(10)
    after_roll = [seen for _, seen in watcher.out.values() if seen > rolled_ms]
    fresh = [seen for offset, (_, seen) in watcher.out.items()
             if stamps.get(offset, 0) > killed_ms and seen > rolled_ms]  # fmt: skip
    return {
        "killed_worker": args.kill_worker,
        "rollback_s": rolled - killed,
        "first_output_s": (min(after_roll) - killed_ms) / 1000 if after_roll else None,
        "fresh_input_s": (min(fresh) - killed_ms) / 1000 if fresh else None,
        "recovered_s": recovered - killed,
        "worker_seconds": [lines[w]["seconds"] for w in sorted(lines)],
        "replayed_records": [lines[w]["replayed"] for w in sorted(lines)],
        "from_ssid": [lines[w]["ssid"] for w in sorted(lines)],
    }


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def kill_runs(bootstrap: str, args: argparse.Namespace, port: int) -> dict[str, Any]:
    runs = []
    for _ in range(args.repeats):
        runs.append(_kill_once(bootstrap, args, port))
        r = runs[-1]
        console.print(
            f"  kill -9 worker {args.kill_worker}: rollback {r['rollback_s']:.2f} s, outputs "
            f"again {_s(r['first_output_s'])} s, new input out {_s(r['fresh_input_s'])} s, "
            f"recovered {r['recovered_s']:.2f} s, replayed {r['replayed_records']}"
        )
    keys = ("rollback_s", "first_output_s", "fresh_input_s", "recovered_s")
    medians = {
        k: statistics.median([r[k] for r in runs if r[k] is not None] or [float("nan")])
        for k in keys
    }
    return {"rate": args.rate, "workers": args.workers, **medians,
            "replayed_records": statistics.median(max(r["replayed_records"]) for r in runs),
            "runs": runs}  # fmt: skip


# --- report --------------------------------------------------------------------------------


def _print(report: dict[str, Any]) -> None:
    if report["restart"]:
        every, repeats = report["snapshot_ms"], report["repeats"]
        table = Table(title=f"restart after N transactions (snapshots every {every} ms; "
                            f"median of {repeats})")  # fmt: skip
        for column in ("transactions", "command log", "start → all recovered s",
                       "worker recovery s", "replayed records", "runs s"):  # fmt: skip
            table.add_column(column, justify="right")
        for r in report["restart"]:
            table.add_row(
                f"{r['transactions']:,}", f"{r['command_log']['high']:,}", f"{r['wall_s']:.2f}",
                f"{r['worker_seconds']:.2f}", f"{r['replayed_records']:,.0f}",
                ", ".join(f"{x['wall_s']:.2f}" for x in r["restarts"]),
            )  # fmt: skip
        console.print(table)
    if report["kill"]:
        k = report["kill"]
        table = Table(title=f"kill -9 of a worker at {k['rate']:,} transfers/s: seconds from "
                            f"the kill (median of {len(k['runs'])})")  # fmt: skip
        for column in ("rollback", "outputs again", "new input out", "all recovered",
                       "replayed records"):  # fmt: skip
            table.add_column(column, justify="right")
        table.add_row(f"{k['rollback_s']:.2f}", f"{k['first_output_s']:.2f}",
                      f"{k['fresh_input_s']:.2f}", f"{k['recovered_s']:.2f}",
                      f"{k['replayed_records']:,.0f}")  # fmt: skip
        console.print(table)


def _panels(report: dict[str, Any]) -> list[tuple[str, str, dict[str, float]]]:
    panels = []
    if report["restart"]:
        panels.append(
            (
                "restart after N transactions",
                "seconds to all recovered (median)",
                {f"{r['transactions']:,}": r["wall_s"] for r in report["restart"]},
            )
        )
        records: dict[str, float] = {}
        for r in report["restart"]:
            records[f"{r['transactions']:,}: log"] = r["command_log"]["high"]
            records[f"{r['transactions']:,}: replayed"] = r["replayed_records"]
        panels.append(("command log and records replayed", "records (median)", records))
    if report["kill"]:
        k = report["kill"]
        panels.append(
            (
                f"kill -9 at {k['rate']:,}/s",
                "seconds after the kill (median)",
                {
                    "rollback": k["rollback_s"],
                    "outputs again": k["first_output_s"],
                    "new input out": k["fresh_input_s"],
                    "recovered": k["recovered_s"],
                },
            )
        )
    return panels  # fmt: skip


@cleans_up
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=["restart", "kill"],
                        default=["restart", "kill"])  # fmt: skip
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000],
                        help="transactions in the log before a restart")  # fmt: skip
    parser.add_argument("--accounts", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--snapshot-ms", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3, help="restarts / kills (median)")
    parser.add_argument("--rate", type=int, default=5000, help="transfers/s during the kills")
    parser.add_argument("--settle", type=float, default=8, help="seconds before the kill")
    parser.add_argument("--after", type=float, default=20, help="seconds fed after the kill")
    parser.add_argument("--kill-worker", type=int, default=1, help="which worker gets kill -9")
    parser.add_argument("--port", type=int, default=19692, help="local broker (and port + 1)")
    parser.add_argument("--ports", type=int, default=29500,
                        help="metrics from here, worker ports from here + 10")  # fmt: skip
    parser.add_argument("--bootstrap", help="an existing broker (default: a local one)")
    parser.add_argument("--out", default="bench/results", help="where the JSON and PNG go")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"bench": "restart", "machine": platform.node(),
                              "snapshot_ms": args.snapshot_ms, "repeats": args.repeats,
                              "workers": args.workers, "restart": [], "kill": None}  # fmt: skip
    with broker_unless(args.bootstrap, args.port) as broker:
        if "restart" in args.parts:
            for size in args.sizes:
                report["restart"].append(restart_after(broker.bootstrap, size, args, args.ports))
        if "kill" in args.parts:
            report["kill"] = kill_runs(broker.bootstrap, args, args.ports)
    _print(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"restart-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    plotted = plot_bars(stem.with_suffix(".png"), _panels(report))
    console.print(f"results in {stem}.json" + (f" and {stem}.png" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
