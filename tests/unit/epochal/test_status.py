"""``epochal status``: running, stopped, killed or never seen, and who is not reporting."""

from __future__ import annotations

import msgspec
from rich.console import Console

from epochal.schemas.status import (
    AnyStatus,
    KeyRange,
    PartitionStatus,
    ProcessState,
    SequencerStatus,
    SupervisorStatus,
    WorkerStatus,
)
from epochal.status import AppState, SnapshotSummary, StatusReport, summarize
from epochal.status_view import headline, print_status, size, status_json

NOW = 1_800_000_000_000


def _common(time_ms: int, run: str = "r1", generation: int = 2) -> dict[str, object]:
    return {
        "run_id": run,
        "generation": generation,
        "pid": 100,
        "host": "h1",
        "time_ms": time_ms,
        "started_ms": NOW - 60_000,
    }


def _supervisor(time_ms: int = NOW - 500, **changes: object) -> SupervisorStatus:
    fields = {
        **_common(time_ms),
        "workers": 2,
        "partitions": 4,
        "recovery": "strong",
        "rollbacks": 1,
        **changes,
    }
    return msgspec.convert(fields, SupervisorStatus)


def _sequencer(time_ms: int = NOW - 300, run: str = "r1") -> SequencerStatus:
    fields = {
        **_common(time_ms, run),
        "epoch": 41,
        "epochs": 40,
        "transactions": 900,
        "dead_letters": 1,
        "epochs_per_s": 20.0,
        "transactions_per_s": 450.0,
        "input_lag": {"bank.in.ops:0": 5},
    }
    return msgspec.convert(fields, SequencerStatus)


def _worker(index: int, time_ms: int = NOW - 200, run: str = "r1", epoch: int = 40) -> WorkerStatus:
    partition = PartitionStatus(index, (KeyRange("Account", None, 10),), actors=3)
    fields = {
        **_common(time_ms, run),
        "worker": index,
        "partitions": (partition,),
        "epoch": epoch,
        "epochs": 40,
        "committed": 400,
        "aborted": 3,
        "epochs_per_s": 20.0,
        "transactions_per_s": 200.0,
        "query": "127.0.0.1:7700",
    }
    return msgspec.convert(fields, WorkerStatus, from_attributes=True)


def _latest(*records: AnyStatus) -> dict[str, AnyStatus]:
    return {record.key.decode(): record for record in records}


SNAPSHOT = SnapshotSummary(ssid=30, time_ms=NOW - 4000, bytes=2048, actors={"Account": 40})


def test_a_cluster_whose_processes_all_report_is_running() -> None:
    latest = _latest(_supervisor(), _sequencer(), _worker(0), _worker(1, epoch=39))
    report = summarize("bank", latest, 3, SNAPSHOT, NOW)
    assert report.state is AppState.RUNNING
    assert (report.generation, report.epoch, report.rollbacks, report.dead_letters) == (2, 41, 1, 3)
    assert (report.epochs_per_s, report.transactions_per_s) == (20.0, 450.0)
    assert report.input_lag == {"bank.in.ops:0": 5}
    assert [w.worker for w in report.workers] == [0, 1]
    assert report.silent == []


def test_a_worker_whose_records_stopped_coming_is_named() -> None:
    latest = _latest(_supervisor(), _sequencer(), _worker(0), _worker(1, time_ms=NOW - 9000))
    report = summarize("bank", latest, 0, None, NOW)
    assert report.state is AppState.RUNNING
    assert report.silent == ["worker 1"]
    assert "not reporting: worker 1" in headline(report).plain


def test_records_of_an_earlier_run_do_not_count() -> None:
    latest = _latest(_supervisor(), _sequencer(run="old"), _worker(0), _worker(1, run="old"))
    report = summarize("bank", latest, 0, None, NOW)
    assert report.sequencer is None and [w.worker for w in report.workers] == [0]
    assert report.silent == ["sequencer", "worker 1"]


def test_a_supervisor_that_stopped_reporting_is_not_running_since_then() -> None:
    latest = _latest(_supervisor(time_ms=NOW - 42_000), _sequencer(), _worker(0), _worker(1))
    report = summarize("bank", latest, 0, SNAPSHOT, NOW)
    assert report.state is AppState.NOT_RUNNING
    line = headline(report).plain
    assert line.startswith("bank is not running: its supervisor pid 100 on h1 was last seen")
    assert "(42.0 s ago)" in line
    assert (report.epochs_per_s, report.transactions_per_s) == (0.0, 0.0)


def test_a_clean_stop_says_so() -> None:
    latest = _latest(_supervisor(time_ms=NOW - 1000, state=ProcessState.STOPPED))
    report = summarize("bank", latest, 0, None, NOW)
    assert report.state is AppState.STOPPED
    assert headline(report).plain.startswith("bank is not running: it stopped at ")


def test_an_app_never_seen_says_where_it_looked() -> None:
    report = summarize("bank", {}, 0, None, NOW)
    assert report.state is AppState.NEVER_SEEN
    assert "no status record on bank.status" in headline(report).plain


def test_the_table_and_the_json_show_every_process() -> None:
    latest = _latest(_supervisor(), _sequencer(), _worker(0), _worker(1))
    report = summarize("bank", latest, 0, SNAPSHOT, NOW)
    console = Console(width=250, record=True)
    print_status(report, console)
    text = console.export_text()
    for shown in (
        "supervisor",
        "sequencer",
        "worker 0",
        "worker 1",
        "Account […, 10)",
        "127.0.0.1:7700",
        "ssid 30, 4.0 s ago, 2.0 KiB",
        "bank.in.ops:0",
    ):
        assert shown in text, shown
    decoded = msgspec.json.decode(status_json(report), type=StatusReport)
    assert decoded == report


def test_sizes_read_like_people_write_them() -> None:
    assert [size(n) for n in (512, 2048, 5 * 2**20)] == ["512 B", "2.0 KiB", "5.0 MiB"]


def test_status_to_a_pipe_is_the_whole_table_with_one_key_range_a_line(capsys) -> None:
    """A pipe or a file (a tutorial's capture, a script) got the table squeezed into 80
    columns, every cell wrapped; a worker's partitions listed every key range on one line."""
    from epochal.cli import _stdout_for
    from epochal.status_view import processes

    low = (KeyRange("Rider", None, "r-0250"), KeyRange("Station", None, "9"))
    high = (KeyRange("Rider", "r-0250", None), KeyRange("Station", "9", None))
    both = (PartitionStatus(0, low, 44), PartitionStatus(1, high, 1))
    worker = msgspec.structs.replace(_worker(0), partitions=both)
    latest = _latest(_supervisor(metrics="127.0.0.1:9403"), _sequencer(), worker, _worker(1))
    report = summarize("bikes", latest, 0, SNAPSHOT, NOW)
    print_status(report, _stdout_for(processes(report)))
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if "worker 0" in line)
    assert "0: 44 actors" in row and "127.0.0.1:7700" in row and "s ago" in row, row
    ranges = [line for line in lines if "Rider" in line or "Station" in line]
    assert ["Rider […, 'r-0250')" in ranges[0], "Station […, '9')" in ranges[1]] == [True, True]
    assert "1: 1 actor " in "\n".join(lines)
