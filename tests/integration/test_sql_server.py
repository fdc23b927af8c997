"""``epochal sql`` on its warm SQL server (real Spark Connect, Spark and Delta), run as a user runs
it: the first call starts the server and says so once, the next reuses it, a bad query is one
line, ``--stop-server`` ends it; a server that cannot start says why once.

Each test has a cache of its own (``own_cache``: the shared jars linked in), so its server is no
other run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from epochal.analytics.sql_server_state import ServerFiles, is_server
from epochal.config import CacheConfig
from tests.integration.snapshot_history import History, build_history

pytestmark = pytest.mark.integration

EPOCHAL = str(Path(sys.executable).parent / "epochal")
ROOT = Path(__file__).resolve().parents[2]
BY_SNAPSHOT = (
    "SELECT _ssid, count(*) AS accounts, sum(balance) AS total FROM account_history "
    "GROUP BY _ssid ORDER BY _ssid"
)


@dataclass(frozen=True)
class Shell:
    """``epochal`` with a cache of its own, in a directory of its own, the checkout's test apps
    importable (as a user's own are)."""

    cwd: Path
    cache: Path

    def run(self, *words: str) -> subprocess.CompletedProcess[str]:
        argv = [EPOCHAL, "--cache", str(self.cache), *words]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run(
            argv, cwd=self.cwd, env=env, capture_output=True, text=True, timeout=300, check=False
        )

    @property
    def files(self) -> ServerFiles:
        return ServerFiles(CacheConfig(self.cache).sql_server_dir())


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return build_history(tmp_path_factory.mktemp("history"), snapshots_wanted=6)


@pytest.fixture
def shell(tmp_path: Path, own_cache: CacheConfig) -> Iterator[Shell]:
    user = Shell(tmp_path, own_cache.root)
    yield user
    stopped = user.run("sql", "--stop-server")  # whatever the test did
    assert stopped.returncode == 0, stopped.stderr


def test_the_second_query_reuses_the_server_and_a_bad_one_is_one_line(
    shell: Shell, history: History
) -> None:
    expected = [
        {"_ssid": ssid, "accounts": len(a), "total": sum(v.balance for v in a.values())}
        for ssid, a in sorted(history.accounts.items())
    ]
    first = shell.run(
        "sql", BY_SNAPSHOT, "testbank", "--warehouse", history.warehouse, "--format", "json"
    )
    assert first.returncode == 0, first.stderr
    assert [json.loads(line) for line in first.stdout.splitlines()] == expected
    server = shell.files.read()
    assert server is not None and is_server(server.pid)
    assert first.stderr.count("started a SQL server") == 1, first.stderr
    assert f"pid {server.pid}" in first.stderr and "epochal sql --stop-server" in first.stderr
    connect = f"SparkSession.builder.remote('sc://127.0.0.1:{server.port}').getOrCreate()"
    query = f"from pyspark.sql import SparkSession; {connect}.sql('SELECT 1').collect()"
    anonymous = subprocess.run(
        [sys.executable, "-c", query], capture_output=True, text=True, timeout=120, check=False
    )
    assert anonymous.returncode != 0 and "UNAUTHENTICATED" in anonymous.stderr  # no token

    again = shell.run(
        "sql",
        "SELECT _key, balance FROM account ORDER BY _key",
        "tests.unit.actors.workload:app",
        "--warehouse",
        history.warehouse,
        "--format",
        "csv",
    )
    assert again.returncode == 0, again.stderr
    assert "started" not in again.stderr, again.stderr
    assert shell.files.read() == server  # the same server, pid and port
    latest = history.accounts[history.ssids[-1]]
    assert again.stdout.splitlines() == ["_key,balance"] + [
        f"{key},{account.balance}" for key, account in sorted(latest.items())
    ]

    for bad, condition in (
        ("SELECT nope FROM account", "UNRESOLVED_COLUMN"),
        ("SELEC 1", "PARSE_SYNTAX_ERROR"),
        ("SELECT * FROM nosuchview", "TABLE_OR_VIEW_NOT_FOUND"),
    ):
        failed = shell.run("sql", bad, "testbank", "--warehouse", history.warehouse)
        assert failed.returncode == 1 and failed.stdout == ""
        said = failed.stderr.strip()
        assert said.startswith("error: the query failed") and f"[{condition}" in said, said
        assert len(said.splitlines()) == 1, said
        assert "at org.apache" not in said and "Traceback" not in said
    assert shell.files.read() == server

    shell.files.write(msgspec.structs.replace(server, token="stolen"))  # not the server's
    refused = shell.run("sql", "SELECT 1", "testbank", "--warehouse", history.warehouse)
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"error: the SQL server (pid {server.pid}) failed: Invalid authentication token; its log "
        f"is {shell.files.log}; `epochal sql --stop-server` stops it"
    )
    shell.files.write(server)

    stopped = shell.run("sql", "--stop-server")
    assert stopped.returncode == 0 and f"SQL server stopped (pid {server.pid})" in stopped.stderr
    assert not is_server(server.pid) and shell.files.read() is None
    assert "no SQL server was running" in shell.run("sql", "--stop-server").stderr


def test_a_server_that_cannot_start_says_why_once(shell: Shell, history: History) -> None:
    failed = shell.run(
        "sql", "SELECT 1", "testbank", "--warehouse", history.warehouse, "--master", "nosuch://here"
    )
    assert failed.returncode == 1
    said = failed.stderr.strip()
    assert said.startswith("error: the SQL server ended while starting"), said
    assert "Master must either be yarn or start with spark, k8s, or local" in said, said
    assert str(shell.files.log) in said and "--no-server" in said
    assert len(said.splitlines()) == 1 and "Traceback" not in said, said
    assert shell.files.read() is None


def test_a_taken_port_is_named_before_anything_starts(shell: Shell, history: History) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        failed = shell.run(
            "sql",
            "SELECT 1",
            "testbank",
            "--warehouse",
            history.warehouse,
            "--connect-port",
            str(port),
        )
    assert failed.returncode == 1
    assert failed.stderr.strip() == (
        f"error: port {port} on 127.0.0.1 (Spark Connect queries of the SQL server) is taken by "
        "another process: stop it, or choose another port with epochal sql --connect-port"
    )
