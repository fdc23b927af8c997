"""What ``epochal run`` checks before it starts, and the errors a server gives when its port is
taken later: one line naming the port, what it is for, and the flag that moves it."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from epochal.actors.api import load_app
from epochal.actors.engine import Engine
from epochal.actors.query_server import QueryServer
from epochal.actors.transport import Peers
from epochal.config import Listener, SnapshotConfig, resolve_warehouse
from epochal.errors import BindError, ConfigError
from epochal.metrics import Metrics, serve_metrics
from epochal.preflight import Binding, check_ports, check_warehouse
from tests.conftest import free_ports
from tests.unit.actors.workload import app


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("warehouse", os.path.join(os.getcwd(), "warehouse")),
        ("./w/../warehouse/", os.path.join(os.getcwd(), "warehouse")),
        ("~/w", os.path.expanduser("~/w")),
        ("/srv/w/", "/srv/w"),
        ("file:///srv/w", "/srv/w"),
        ("file://localhost/srv/my%20w", "/srv/my w"),
        ("s3://bucket/w/", "s3://bucket/w"),
        ("abfss://c@account.dfs.core.windows.net/w", "abfss://c@account.dfs.core.windows.net/w"),
    ],
)
def test_a_warehouse_means_the_same_to_every_process(given: str, expected: str) -> None:
    assert resolve_warehouse(given) == expected
    assert SnapshotConfig(given).warehouse == expected


@pytest.mark.parametrize(
    ("given", "error"),
    [("", "is empty"), ("ftp://host/w", "ftp:// is not supported"), ("file://other/w", "host")],
)
def test_a_warehouse_no_store_takes_is_refused_at_once(given: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        SnapshotConfig(given)


def test_a_relative_warehouse_is_written_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    check_warehouse(SnapshotConfig("warehouse"), "shop")
    assert (tmp_path / "warehouse" / "shop").is_dir()
    assert list((tmp_path / "warehouse" / "shop").iterdir()) == []  # the probe is gone


def test_a_warehouse_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(ConfigError, match=r"cannot write to the warehouse .*/file/shop"):
        check_warehouse(SnapshotConfig(str(tmp_path / "file")), "shop")


def _taken() -> tuple[socket.socket, str]:
    holder = socket.create_server(("127.0.0.1", free_ports(1)))
    return holder, f"127.0.0.1:{holder.getsockname()[1]}"


def test_a_taken_port_is_refused_at_start_naming_what_it_is_for() -> None:
    holder, address = _taken()
    free = f"127.0.0.1:{free_ports(1)}"
    with holder:
        check_ports([Binding(free, Listener.PEERS, "worker 0")])
        with pytest.raises(BindError) as refused:
            check_ports(
                [
                    Binding(free, Listener.PEERS, "worker 0"),
                    Binding(address, Listener.QUERIES, "worker 1"),
                ]
            )
    port = address.rpartition(":")[2]
    assert str(refused.value) == (
        f"port {port} on 127.0.0.1 (live queries of worker 1) is taken by another process: "
        "stop it, or choose another port with --query-port"
    )


def test_two_listeners_of_the_cluster_on_one_port_are_refused_naming_both_flags() -> None:
    """``--port-base 7700`` beside the default ``--query-port 7700``: each port is free, but
    worker 0 would take it twice; a wildcard host shares every interface's ports."""
    port = free_ports(2)
    peers = Binding(f"127.0.0.1:{port}", Listener.PEERS, "worker 0")
    queries = Binding(f"127.0.0.1:{port}", Listener.QUERIES, "worker 0")
    with pytest.raises(ConfigError) as refused:
        check_ports([peers, queries])
    assert str(refused.value) == (
        f"port {port} is asked for twice: connections from peer workers of worker 0 "
        "(--port-base or --peers) and live queries of worker 0 (--query-port); give one of "
        "them other ports"
    )
    with pytest.raises(ConfigError, match="asked for twice"):
        check_ports([peers, Binding(f"0.0.0.0:{port}", Listener.METRICS, "the supervisor")])
    check_ports([peers, Binding(f"127.0.0.1:{port + 1}", Listener.QUERIES, "worker 0")])


def test_a_port_taken_later_is_a_bind_error_from_every_server() -> None:
    holder, address = _taken()
    port = int(address.rpartition(":")[2])
    with holder:
        with pytest.raises(BindError, match=rf"port {port} .*Prometheus metrics of worker 3"):
            serve_metrics(Metrics(app="shop"), port, "worker 3")

        async def servers() -> None:
            free = f"127.0.0.1:{free_ports(1)}"
            peers = Peers(0, [address, free], generation=1, on_frame=lambda frame: None)
            with pytest.raises(BindError, match=rf"{port} .*peer workers of worker 0.*--peers"):
                await peers.start()
            engine = Engine(app, 2, 0, 1, None, queries=True)
            server = QueryServer(engine, [address], 1)
            with pytest.raises(BindError, match=rf"{port} .*live queries of worker 0"):
                await server.start()

        asyncio.run(servers())


def test_an_app_that_does_not_import_is_one_line_saying_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shop_broken.py").write_text("import json\n\nraise RuntimeError('no stock')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as refused:
        load_app("shop_broken:app")
    assert str(refused.value) == (
        "cannot load the app: RuntimeError: no stock "
        f"(app=shop_broken:app, at={tmp_path / 'shop_broken.py'}:3)"
    )
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        load_app("tests.unit.actors.workload:nope")
