"""``--epoch-records`` and ``--sweep`` of a cluster setting: a sweep of ``epoch_records`` runs the
same workload once per epoch size, each cluster started with that ``--epoch-records`` (and none
when it is not given), and each report records its value where the sweep reads it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from bench import cli
from bench.drain import ROOT
from bench.processes import Setup, _command
from bench.workloads.base import Backlog, Workload
from bench.workloads.tstream import GrepSum


def _points(argv: list[str]) -> list[cli.Point]:
    """The points ``epochal bench tstream-gs ARGV`` runs, as its parser reads them."""
    parser = cli._workload_parser(GrepSum)
    args = parser.parse_args(argv)
    point = cli.Point(GrepSum(zipf=args.zipf), args.epoch_records, args.snapshots)
    return cli._swept(parser, point, args.sweep)


def test_a_sweep_of_epoch_records_varies_the_clusters_alone() -> None:
    points = _points(["--zipf", "0.9", "--sweep", "epoch-records=100,2000"])
    assert [p.epoch_records for p in points] == [100, 2_000]
    assert {p.workload for p in points} == {GrepSum(zipf=0.9)}
    assert [p.parameters()["epoch_records"] for p in points] == [100, 2_000]
    assert [p.setup(2) for p in points] == [
        Setup(ROOT, 2, epoch_records=100),
        Setup(ROOT, 2, epoch_records=2_000),
    ]


def test_a_sweep_of_snapshots_runs_the_clusters_with_and_without_them(tmp_path: Path) -> None:
    """``--sweep snapshots=default,off,500`` at a workload's own actor count: each point's
    cluster starts with its snapshot flags (none for the default), and reports say which."""
    points = _points(["--epoch-records", "500", "--sweep", "snapshots=default,off,500"])
    assert [p.setup(1) for p in points] == [
        Setup(ROOT, 1, "default", 500),
        Setup(ROOT, 1, "off", 500),
        Setup(ROOT, 1, "500", 500),
    ]
    assert [p.parameters()["snapshots"] for p in points] == ["default", "off", "500"]
    commands = [_command(p.setup(1), "a:app", "n", "b:9092", port_base=1, run_dir=tmp_path)
                for p in points]  # fmt: skip
    assert ["--no-snapshots" in c for c in commands] == [False, True, False]
    assert [c[c.index("--snapshot-interval-ms") + 1] for c in commands[2:]] == ["500"]
    (given,) = _points(["--snapshots", "off"])
    assert given.setup(2) == Setup(ROOT, 2, "off") and given.parameters()["snapshots"] == "off"
    (default,) = _points([])
    assert default.setup(2) == Setup(ROOT, 2) and "snapshots" not in default.parameters()


def test_a_sweep_of_a_parameter_keeps_the_epoch_records_given() -> None:
    points = _points(["--epoch-records", "500", "--sweep", "zipf=0,0.9"])
    assert [(p.parameters()["zipf"], p.epoch_records) for p in points] == [(0.0, 500), (0.9, 500)]
    (default,) = _points([])
    assert default.epoch_records is None and "epoch_records" not in default.parameters()


@pytest.mark.parametrize(
    ("sweep", "error"),
    [
        ("epoch_ms=10,20", "with FIELD one of ['length', "),
        ("epoch_records=0,100", "epoch_records: 1 record or more, not 0"),
        ("epoch_records=many", "invalid literal for int()"),
        ("snapshots=default,0", "snapshots: off, weak or an interval in ms, not '0'"),
        ("snapshots=never", "snapshots: off, weak or an interval in ms, not 'never'"),
    ],
)
def test_a_sweep_the_clusters_cannot_run_is_a_usage_error(
    sweep: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _points(["--sweep", sweep])
    assert exited.value.code == 2 and error in capsys.readouterr().err


def test_the_cluster_gets_epoch_records_only_when_given_and_known(tmp_path: Path) -> None:
    def command(setup: Setup) -> list[str]:
        return _command(setup, "a:app", "n", "b:9092", port_base=1, run_dir=tmp_path)

    given = command(Setup(ROOT, 1, epoch_records=200))
    assert given[given.index("--epoch-records") + 1] == "200"
    assert "--epoch-records" not in command(Setup(ROOT, 1))
    older = tmp_path / "older"  # a checkout whose epochal run has no such flag
    (older / "epochal").mkdir(parents=True)
    (older / "epochal" / "cli.py").write_text('run.add_argument("--workers")\n')
    assert "--epoch-records" not in command(Setup(older, 1, epoch_records=200))


def test_a_report_records_the_epoch_records_its_clusters_ran_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setups: list[Setup] = []

    def drain(workload: Workload, backlog: Backlog, bootstrap: str, setup: Setup, **_: Any) -> Any:
        setups.append(setup)
        return {"workers": setup.workers, "tps": 1.0}

    monkeypatch.setattr(cli, "drain_cluster", drain)
    args = argparse.Namespace(workers=[1], repeats=1, transactions=3, seed=1, quick=True)
    args.baselines = args.check = args.anchor_rates = args.anchor_search = False
    args.port_base, args.rate = 1, None
    report = cli.run_workload(cli.Point(GrepSum(rows=100), 500), args, "b:9092", None)
    assert setups == [Setup(ROOT, 1, epoch_records=500)]
    assert report["parameters"]["epoch_records"] == 500
    assert report["title"] == "tstream-gs rows=100 epoch_records=500"


def test_the_command_line_sweep_saves_one_point_per_epoch_size(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``epochal bench tstream-gs --quick --sweep epoch_records=200,1000``, drains stubbed: the
    sweep's JSON has a point per value, each report's own value."""

    def reports(points: list[cli.Point], args: argparse.Namespace) -> list[dict[str, Any]]:
        return [
            {
                "workload": p.workload.name,
                "description": "",
                "parameters": p.parameters(),
                "transactions": args.transactions,
                "repeats": args.repeats,
                "machine": {"cpus": 2},
                "results": [{"workers": 1, "tps": 1_000.0 / p.parameters()["epoch_records"]}],
                "baselines": [],
            }
            for p in points
        ]

    monkeypatch.setattr(cli, "_run_workloads", reports)
    argv = ["tstream-gs", "--quick", "--sweep", "epoch_records=200,1000", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    (saved,) = tmp_path.glob("tstream-gs-sweep-epoch_records-*.json")
    sweep = json.loads(saved.read_text())
    assert sweep["field"] == "epoch_records" and "epoch_records" not in sweep["fixed"]
    assert [(p["value"], p["tps"]["epochal, 1 worker(s)"]) for p in sweep["points"]] == [
        (200, 5.0),
        (1000, 1.0),
    ]


def test_a_sweep_of_open_loop_runs_alone_saves_no_throughput_sweep(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--transactions 0 --rate N --sweep snapshots=default,off``: no drain, so no throughput
    table of empty rows; each point's report (its latency) is all there is."""
    seen: list[list[cli.Point]] = []

    def reports(points: list[cli.Point], args: argparse.Namespace) -> list[dict[str, Any]]:
        seen.append(points)
        return []

    monkeypatch.setattr(cli, "_run_workloads", reports)
    argv = ["tspoon-bank", "--transactions", "0", "--rate", "100", "--sweep",
            "snapshots=default,off", "--out", str(tmp_path)]  # fmt: skip
    assert cli.main(argv) == 0
    assert [p.snapshots for p in seen[0]] == ["default", "off"]
    assert not list(tmp_path.glob("*sweep*"))
