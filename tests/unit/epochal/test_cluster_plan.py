"""One ClusterConfig, each fact once, planned into the processes' own configs: the same plan
whether ``epochal run``'s flags or Python code said it."""

from __future__ import annotations

from pathlib import Path

import pytest

from epochal import ClusterConfig, ConfigError, SnapshotConfig
from epochal.cli import _cluster_config, _parser
from epochal.cluster_plan import plan_cluster

BANK = "examples.bank.app:app"


def test_flags_and_a_config_make_the_same_plan() -> None:
    flags = ["run", BANK, "--workers", "2", "--metrics-port", "9400", "--recovery", "weak",
             "--name", "bank-b", "--warehouse", "/tmp/w", "--epoch-ms", "50"]  # fmt: skip
    from_flags = plan_cluster(BANK, _cluster_config(_parser().parse_args(flags)))
    config = ClusterConfig(name="bank-b", workers=2, metrics_port=9400, recovery="weak",
                           snapshots=SnapshotConfig("/tmp/w"), epoch_ms=50)  # fmt: skip
    assert plan_cluster(BANK, config) == from_flags


def test_a_plan_states_each_fact_once_for_every_process() -> None:
    plan = plan_cluster(BANK, ClusterConfig(workers=2, metrics_port=9400, recovery="weak"))
    sequencer, worker = plan.sequencer, plan.worker
    assert sequencer.workers == worker.workers == 2 and worker.partitions == 4
    assert sequencer.recovery == "weak" and plan.snapshots is not None
    assert plan.snapshots.recovery == "weak"  # the snapshots' manifests say the cluster's mode
    assert sequencer.feed == worker.feed == "127.0.0.1:7602"  # after the 2 workers' peers
    assert worker.peers == ("127.0.0.1:7600", "127.0.0.1:7601")
    assert worker.query == ("127.0.0.1:7700", "127.0.0.1:7701")
    assert (worker.metrics_port, sequencer.metrics_port, plan.metrics_port) == (9400, 9402, 9403)
    assert sequencer.feed_timeout_ms == plan.failure.startup_timeout_ms


def test_no_snapshots_means_none_taken() -> None:
    plan = plan_cluster(BANK, ClusterConfig(workers=1, snapshots=None))
    assert plan.snapshots is None
    assert (plan.sequencer.snapshot_interval_ms, plan.sequencer.snapshot_every_epochs) == (0, 0)
    assert plan.worker.feed == "" and plan.worker.query == ("127.0.0.1:7700",)


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (lambda: ClusterConfig(recovery="weak", snapshots=None), "weak recovery needs snapshots"),
        (lambda: ClusterConfig(recovery="eventual"), "strong or weak"),
        (lambda: ClusterConfig(snapshots=SnapshotConfig(recovery="weak")), "recovery mode once"),
        (lambda: plan_cluster(BANK, ClusterConfig(workers=3, partitions=2)), "fewer than the 3"),
        (lambda: plan_cluster(BANK, ClusterConfig(workers=2, peers=("a:1",))), "peers names 1"),
        (lambda: plan_cluster(BANK, ClusterConfig(workers=1, query_host="0.0.0.0")), "token"),
    ],
)
def test_a_config_that_cannot_work_is_refused_saying_why(config: object, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        config()  # type: ignore[operator]


def test_query_endpoints_default_from_host_and_port() -> None:
    assert ClusterConfig(query_port=0).query_endpoints(2) == ()
    assert ClusterConfig(query=("h:1", "h:2")).query_endpoints(2) == ("h:1", "h:2")
    assert ClusterConfig(query_host="10.0.0.1").query_endpoints(1) == ("10.0.0.1:7700",)


def test_a_client_learns_what_it_was_not_told_from_the_cluster_config() -> None:
    from epochal import KafkaConfig, QueryClient
    from examples.bank.app import app

    config = ClusterConfig(kafka=KafkaConfig("k:9"), name="bank-b", query_port=7800,
                           query_token="t0k", snapshots=SnapshotConfig("/tmp/w"))  # fmt: skip
    client = QueryClient(app, config=config)
    assert client.app.name == "bank-b" and app.name == "bank"
    assert (client.seeds, client.token, client.kafka) == (["127.0.0.1:7800"], "t0k", config.kafka)
    assert client.snapshot_source == config.snapshots
    told = QueryClient(app, "h:1", config=config, token="other", snapshots=None)
    assert (told.seeds, told.token, told.snapshot_source) == (["h:1"], "other", config.snapshots)
    assert QueryClient(app, (), config=config).seeds == []  # snapshots only


def test_an_app_is_started_by_the_module_that_binds_it() -> None:
    from epochal import App, ConfigError
    from epochal.launch import app_spec
    from examples.bank.app import app

    assert app_spec(app) == "examples.bank.app:app"
    with pytest.raises(ConfigError, match="top level of a module file"):
        app_spec(App("nowhere"))  # bound by no module: the processes could not load it


def test_an_app_defined_in_the_script_run_is_loaded_by_its_file_name(tmp_path: Path) -> None:
    """``python tickets.py`` and ``python -m pkg.tickets``: never ``__main__``, which is another
    module (and another code hash) in each process the cluster starts."""
    import subprocess
    import sys

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    script = ("from epochal import App\nfrom epochal.launch import app_spec\n"
              "tickets = App('tickets')\nprint(app_spec(tickets))\n")  # fmt: skip
    (tmp_path / "pkg" / "tickets.py").write_text(script)
    as_file = [sys.executable, "pkg/tickets.py"]
    as_module = [sys.executable, "-m", "pkg.tickets"]
    said = [
        subprocess.run(c, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
        for c in (as_file, as_module)
    ]
    assert said == ["tickets:tickets", "pkg.tickets:tickets"]
