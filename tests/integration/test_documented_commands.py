"""The commands the README and docs show, run as written from a fresh working directory.

Every fenced ``epochal …`` or ``python -m examples…`` line of the docs is either run here
(:data:`RUN`, with only the broker address put in) or is a synopsis with placeholders whose
subcommand and flags ``--help`` must know. A command added to the docs fails
:func:`test_every_documented_command_is_run_here` until a test runs it: a default can no longer
go untested because every test passes its own flags.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec
import pytest

from epochal.config import CacheConfig, KafkaConfig
from epochal.errors import LogError
from epochal.log.client import KafkaClients
from epochal.schemas.codec import decode
from epochal.schemas.egress import EgressRecord
from tests.conftest import free_ports
from tests.integration.cluster import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# docs/tutorial.md's commands run in tests/integration/test_tutorial.py, which checks it runs
# every one of them, with the tutorial's own files in its working directory.
DOCS = [
    ROOT / "README.md",
    *sorted(set((ROOT / "docs").glob("*.md")) - {ROOT / "docs/tutorial.md"}),
]
EPOCHAL = str(Path(sys.executable).parent / "epochal")
_PLACEHOLDER = re.compile(r"\b(APP|NS|DIR)\b|…|\[|\|")

# What the docs run, in the order a user would; the test below runs each of them.
RUN = {
    "epochal jars fetch",
    "epochal run examples.bank.app:app --workers 2 --partitions 4 --bootstrap 127.0.0.1:9092",
    "python -m examples.bank.producer --count 10000",
    "epochal replay examples.bank.app:app --show Account",
    "epochal replay examples.bank.app:app --save-log incident.log",
    "epochal run examples.bank.app:app --workers 2 --query-port 7700",
    'epochal sql "SELECT _ssid, count(*), sum(balance) FROM account_history GROUP BY _ssid" bank',
    'epochal sql "SELECT * FROM commands WHERE NOT committed" bank --format json',
    'epochal sql "SELECT _key, balance FROM account" examples.bank.app:app --format csv',
    "epochal sql --stop-server",
    "epochal bench all --quick",
    "epochal bench tstream-gs --quick --sweep epoch_records=200,1000",
}
# Synopses (placeholders) run with the example app put in; the others are --help checked only.
SEARCH = (
    "epochal bench ycsbt|tstream-gs|tstream-sl|tstream-ob|tstream-tp|leaderboard [--rate search]"
)
LONG = "epochal bench long [--transfers N] [--quick]"
RUN_AS = {
    "epochal snapshots APP [--format table|json|csv]": "epochal snapshots examples.bank.app:app",
    "epochal recover APP --mode strong|weak [--into NS]": (
        "epochal recover examples.bank.app:app --mode strong"
    ),
    "epochal status APP": "epochal status bank",
    "epochal status APP --json": "epochal status examples.bank.app:app --json",
    SEARCH: "epochal bench tstream-sl --quick --rate search --phase-seconds 2",
    LONG: "epochal bench long --quick",
}
ACCOUNTS, OPENING_BALANCE, TRANSFERS = 1_000, 1_000, 10_000  # as the producer makes them


def documented_commands() -> list[str]:
    """Each command line in a fenced block of the docs, without its trailing comment."""
    commands = []
    for doc in DOCS:
        fenced = False
        for line in doc.read_text().splitlines():
            if line.startswith("```"):
                fenced = not fenced
                continue
            text = line.split("  #")[0].strip()
            if fenced and (text.startswith("epochal ") or text.startswith("python -m examples")):
                commands.append(text)
    return commands


def test_every_documented_command_is_run_here() -> None:
    runnable = {c for c in documented_commands() if not _PLACEHOLDER.search(c)}
    assert runnable == RUN, "a documented command no test runs, or a test of a command gone"


@pytest.mark.parametrize("synopsis", [c for c in documented_commands() if _PLACEHOLDER.search(c)])
def test_each_synopsis_names_a_command_and_flags_it_has(synopsis: str) -> None:
    """Synopses (``epochal run APP | replay APP``) name real commands and flags; those in
    :data:`RUN_AS` also run in :func:`test_the_readme_runs_as_written`."""
    words = synopsis.split()
    command = words[1]
    helped = subprocess.run(
        [EPOCHAL, command, "--help"], capture_output=True, text=True, check=False, timeout=60
    )
    assert helped.returncode == 0, helped.stderr
    for flag in re.findall(r"--[a-z][a-z-]+", synopsis):
        assert flag in helped.stdout, f"{synopsis}: {flag} is not an option of {command}"


def test_the_top_level_help_names_every_command() -> None:
    """``epochal --help`` says what the tool is for, and its description names each command."""
    from epochal.cli import _parser

    parser = _parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert isinstance(commands, dict) and parser.description
    named = set(re.findall(r"[a-z]+", parser.description))
    assert set(commands) <= named, set(commands) - named
    assert "``" not in parser.description  # prose for a terminal, not a docstring's markup


class User:
    """A user's shell: a fresh working directory, the checkout's examples importable, a cache of
    its own with the test's jars (its SQL server is no other test's), and the session's broker put
    in where the docs name the default one."""

    def __init__(self, cwd: Path, bootstrap: str, own_cache: CacheConfig) -> None:
        self.cwd = cwd
        self.bootstrap = bootstrap
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "EPOCHAL_CACHE": str(own_cache.root)}
        self.background: list[subprocess.Popen[str]] = []
        self.logs: list[IO[str]] = []

    def argv(self, command: str) -> list[str]:
        assert command in RUN or command in RUN_AS.values(), command
        words = shlex.split(command.replace("127.0.0.1:9092", self.bootstrap))
        talks_to_kafka = words[0] == "python" or words[1] in (
            "run",
            "replay",
            "recover",
            "status",
            "bench",
        )
        if talks_to_kafka and "--bootstrap" not in words:
            words += ["--bootstrap", self.bootstrap]
        if words[1:3] == ["bench", "long"]:  # its one cluster on free ports, not on 20000's:
            words += ["--port-base", str(free_ports(10))]  # another run may hold those
        if words[0] == "python":
            words[0] = sys.executable
        elif words[0] == "epochal":
            words[0] = EPOCHAL
        return words

    def run(self, command: str, timeout_s: float = 240) -> str:
        done = subprocess.run(
            self.argv(command),
            cwd=self.cwd,
            env=self.env,
            text=True,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
        return done.stdout + done.stderr

    def start(self, command: str) -> subprocess.Popen[str]:
        log = (self.cwd / f"run-{len(self.background)}.log").open("w")
        self.logs.append(log)
        process = subprocess.Popen(
            self.argv(command),
            cwd=self.cwd,
            env=self.env,
            text=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.background.append(process)
        return process

    def log(self, index: int) -> str:
        return (self.cwd / f"run-{index}.log").read_text()

    def stop(self, process: subprocess.Popen[str]) -> int:
        process.send_signal(signal.SIGTERM)
        return process.wait(60)


@pytest.fixture
def user(tmp_path: Path, kafka_config: KafkaConfig, own_cache: CacheConfig) -> Iterator[User]:
    shell = User(tmp_path / "fresh", kafka_config.bootstrap_servers, own_cache)
    shell.cwd.mkdir()
    yield shell
    for process in shell.background:
        if process.poll() is None:
            process.kill()
            process.wait()
    for log in shell.logs:
        log.close()


def _egress(kafka: KafkaClients, name: str) -> list[EgressRecord]:
    """The committed records of ``bank.out.<name>`` so far (none before the topic exists)."""
    topic = f"bank.out.{name}"
    try:
        ranges = {0: (0, kafka.end_offset(topic))}
    except LogError:
        return []
    return [decode(m.value() or b"", EgressRecord) for m in kafka.read_range(topic, ranges, topic)]


def _outcomes(kafka: KafkaClients) -> list[EgressRecord]:
    """Receipts and abort reports of the bank so far."""
    return _egress(kafka, "receipts") + _egress(kafka, "errors")


def _json_lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def _query_history(user: User, kafka: KafkaClients, total: int) -> None:
    """``epochal sql`` as docs/queries.md shows it: the first call starts the SQL server, the
    others reuse it, ``--stop-server`` ends it."""
    table = user.run(
        'epochal sql "SELECT _ssid, count(*), sum(balance) FROM account_history GROUP BY _ssid" '
        "bank"
    )
    assert "started a SQL server" in table, table  # docs/queries.md: the next ones reuse it
    cells = [line.strip("│┃ ").split("│") for line in table.splitlines() if "│" in line]
    snapshots = [[int(c) for c in row] for row in cells if row[0].strip().isdigit()]
    assert f"{len(snapshots)} rows" in table and len(snapshots) >= 2, table
    # money is conserved in every snapshot taken once each account had its opening deposit
    assert snapshots[-1][1] == ACCOUNTS, table
    assert all(row[2] == total for row in snapshots if row[1] == ACCOUNTS), table
    aborted = _json_lines(
        user.run('epochal sql "SELECT * FROM commands WHERE NOT committed" bank --format json')
    )
    assert aborted and all(row["committed"] is False and row["reason"] for row in aborted)
    assert len(aborted) == len(_egress(kafka, "errors"))
    rows = user.run(
        'epochal sql "SELECT _key, balance FROM account" examples.bank.app:app --format csv'
    ).splitlines()
    balances = [line.split(",") for line in rows if line.startswith("acct-")]
    assert len(balances) == ACCOUNTS and sum(int(b) for _, b in balances) == total
    assert not any("started a SQL server" in line for line in rows)
    assert "SQL server stopped" in user.run("epochal sql --stop-server")


def test_the_readme_runs_as_written(user: User, kafka: KafkaClients) -> None:
    """Running it, querying it, its history: the README's and docs' commands in order, in an
    empty directory with every default (the warehouse is ./warehouse)."""
    user.run("epochal jars fetch")
    total = ACCOUNTS * OPENING_BALANCE

    run = user.start(
        "epochal run examples.bank.app:app --workers 2 --partitions 4 --bootstrap 127.0.0.1:9092"
    )
    user.run("python -m examples.bank.producer --count 10000")
    wait_until(
        lambda: len(_outcomes(kafka)) >= TRANSFERS,
        300,
        "every transfer has its receipt or abort report",
        alive=lambda: run.poll() is None,
        log=lambda: user.log(0),
    )
    snapshots = user.cwd / "warehouse" / "bank" / "snapshots"
    wait_until(snapshots.exists, 30, "a snapshot in ./warehouse", log=lambda: user.log(0))
    time.sleep(1.5)  # one more snapshot interval: the last epochs are in a snapshot too
    assert user.stop(run) == 0, user.log(0)
    log = user.log(0)
    assert "Traceback" not in log and "rolling back" not in log, log
    sources = [msgspec.structs.astuple(r.source) for r in _outcomes(kafka) if r.source]
    assert len(sources) == len(set(sources)) == TRANSFERS  # once each, none twice

    replayed = user.run("epochal replay examples.bank.app:app --show Account")
    assert f"Account: {ACCOUNTS} actors" in replayed
    assert f"'balance': {total}" in replayed, replayed
    # docs/testing.md: the cluster's log as a file, and a unit test's harness replaying it
    saved = user.run("epochal replay examples.bank.app:app --save-log incident.log")
    from epochal.testing import AppTest
    from examples.bank.app import Account, app

    incident = AppTest.from_command_log(app, user.cwd / "incident.log")
    assert f"digest {incident.digest}" in saved, saved
    assert sum(a.balance for a in incident.state(Account).values()) == total

    _query_history(user, kafka, total)  # docs/queries.md

    listed = user.run(RUN_AS["epochal snapshots APP [--format table|json|csv]"])
    assert "snapshots of bank in" in listed and "no complete snapshot yet" not in listed
    recovered = user.run(RUN_AS["epochal recover APP --mode strong|weak [--into NS]"])
    assert "`epochal run` resumes from it" in recovered, recovered

    # docs/queries.md: run it again with queries on; the client reads what the replay showed
    again = user.start("epochal run examples.bank.app:app --workers 2 --query-port 7700")
    from epochal import Client

    with Client(app, "127.0.0.1:7700", timeout_s=60) as client:
        summed = client.aggregate(Account, "count", "sum:balance")
    assert list(summed.values()) == [ACCOUNTS, total], summed
    # docs/operations.md: the running cluster at a glance, from the same shell
    shown = user.run(RUN_AS["epochal status APP"])
    assert "bank running: generation 1" in shown and "last snapshot   ssid" in shown, shown
    (report,) = _json_lines(user.run(RUN_AS["epochal status APP --json"]))
    assert report["state"] == "running" and len(report["workers"]) == 2, report
    assert user.stop(again) == 0, user.log(1)
    assert "Traceback" not in user.log(1), user.log(1)


def test_every_benchmark_workload_runs_quick_and_equals_the_serial_oracle(user: User) -> None:
    """``epochal bench all --quick`` from an empty directory: each workload's app drains its
    backlog on a real cluster, stops at a savepoint equal to the serial oracle over its own
    command log, and leaves its result (with the machine and commit) in ./bench/results."""
    from bench.workloads import WORKLOADS

    out = user.run("epochal bench all --quick", timeout_s=600)
    checked = re.findall(r"checked \(1 worker\(s\)\): savepoint at epoch \d+ = the serial", out)
    assert len(checked) == len(WORKLOADS), out
    results = sorted((user.cwd / "bench" / "results").glob("*.json"))
    reports = {
        json.loads(path.read_text())["workload"]: json.loads(path.read_text()) for path in results
    }
    assert set(reports) == set(WORKLOADS), results
    for report in reports.values():
        (run,) = report["results"]
        assert run["transactions"] == 2_000 and run["rollbacks"] == 0, run
        assert {"worker0", "bench"} <= set(run["cpu_us_per_tx"]), run  # the reader's CPU too
        assert report["machine"]["cpus"] >= 1, report


def test_a_workload_searched_for_its_sustainable_rate_runs_quick(user: User) -> None:
    """The README's synopsis with ``--rate search``, on a workload ``all --quick`` drains but
    never feeds at a rate: after its checked drain, the open-loop search on one cluster (its
    first three phases, with ``--quick``) reports each phase's rate and latency, and the last
    rate that kept up."""
    out = user.run(RUN_AS[SEARCH], timeout_s=300)
    assert "checked (1 worker(s)): savepoint at epoch" in out, out
    (path,) = (user.cwd / "bench" / "results").glob("*.json")
    (search,) = json.loads(path.read_text())["search"]
    phases = search["phases"]
    assert 1 <= len(phases) <= 3 and phases[0]["rate"] == 200, phases
    assert all(
        p["sent"] > 0 and 0 < p["latency_ms"]["p50"] <= p["latency_ms"]["p99"] for p in phases
    )
    kept = [p["rate"] for p in phases if p["passed"]]
    assert search["sustainable_tps"] == (kept[-1] if kept else 0), search
    assert f"sustainable, 1 worker(s): {search['sustainable_tps']:,} tx/s" in out, out


def test_a_sweep_of_the_epoch_size_runs_quick_each_point_checked(user: User) -> None:
    """The README's sweep of a cluster setting, from an empty directory: a drain per epoch size
    on a cluster started with that ``--epoch-records``, each equal to the serial oracle, each
    report with its value, and the sweep (JSON, and its table in words) with a point per value."""
    out = user.run("epochal bench tstream-gs --quick --sweep epoch_records=200,1000", 400)
    epochs = re.findall(r"checked \(1 worker\(s\)\): savepoint at epoch (\d+) = the serial", out)
    assert len(epochs) == 2, out
    # 10,000 rows loaded and 2,000 transactions: epochs of at most 200 records are 60 or more
    assert int(epochs[0]) >= 60, out
    results = user.cwd / "bench" / "results"
    reports = [json.loads(p.read_text()) for p in results.glob("tstream-gs-epoch_records*.json")]
    ran = {r["parameters"]["epoch_records"]: r["results"] for r in reports}
    assert {size: [run["epoch_records"] for run in runs] for size, runs in ran.items()} == {
        200: [200],
        1000: [1000],
    }
    (swept,) = results.glob("tstream-gs-sweep-epoch_records-*.json")
    sweep = json.loads(swept.read_text())
    assert [p["value"] for p in sweep["points"]] == [200, 1000], sweep
    assert "throughput against epoch size (TStream's punctuation interval), records" in out, out


def test_the_long_run_runs_quick_with_its_memory_series_no_rollback_and_money_conserved(
    user: User,
) -> None:
    """The README's long run, ``--quick`` (20,000 transfers on 2 workers), from an empty
    directory: every transfer's egress out, no rollback, the savepoint's balances adding up to
    the deposits, and the RSS of every role against the transfers drained, as JSON and PNG in
    ./bench/results (too short a run for a verdict on memory: it says so)."""
    out = user.run(RUN_AS[LONG], timeout_s=300)
    (path,) = (user.cwd / "bench" / "results").glob("long-*.json")
    report = json.loads(path.read_text())
    assert path.with_suffix(".png").is_file()
    assert report["transfers"] == report["egress"] == 20_000 and report["workers"] == 2, out
    assert report["rollbacks"] == 0 and report["generation"] == 1, out
    money = report["conservation"]
    assert money["holds"] and money["total"] == money["deposits"] == 10_000 * 1_000, money
    series = report["series"]
    roles = {role for sample in series for role in sample["rss_mb"]}
    assert {"supervisor", "sequencer", "worker0", "worker1"} <= roles, roles
    assert any(role.startswith("snapshots") for role in roles), roles
    drained = [sample["transfers"] for sample in series]
    assert drained == sorted(drained) and drained[-1] > 0, drained
    assert set(report["memory"]) == roles and report["flat"] is None, report["memory"]
    assert "money: 10,000,000 in 10,000 accounts" in out and "conserved" in out, out
    assert "too short to judge" in out or "not judged" in out, out


def _service_commands() -> list[list[str]]:
    """The ``epochal`` command lines of docs/operations.md's systemd unit and compose file."""
    text = (ROOT / "docs" / "operations.md").read_text().replace("\\\n", " ")
    lines = text.splitlines()
    commands = [
        shlex.split(line.split("=", 1)[1]) for line in lines if line.startswith("ExecStart=")
    ]
    compose = [line.split(":", 1)[1] for line in lines if line.strip().startswith("command: [")]
    return commands + [json.loads(command) for command in compose]
    return commands


def test_the_service_definitions_run_commands_that_parse() -> None:
    """The systemd unit's and the compose file's commands (run by a service manager, not
    here) name a command and flags ``epochal`` has."""
    from epochal.cli import _parser

    commands = _service_commands()
    assert len(commands) == 2
    for argv in commands:
        assert Path(argv[0]).name == "epochal", argv
        _parser().parse_args(argv[1:])  # exits (a test failure) on an unknown flag
