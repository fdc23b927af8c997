"""How ``epochal status`` shows a :class:`~epochal.status.StatusReport`: rich tables, or JSON."""

from __future__ import annotations

import datetime

import msgspec
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from epochal.schemas.status import KeyRange, ProcessStatus, WorkerStatus
from epochal.status import STALE_S, AppState, SnapshotSummary, StatusReport

__all__ = ["ago", "describe_range", "headline", "print_status", "size", "status_json"]


def status_json(report: StatusReport) -> str:
    """The report as one JSON document (records tagged by ``role``)."""
    return msgspec.json.encode(report).decode()


def print_status(report: StatusReport, console: Console) -> None:
    console.print(headline(report), highlight=False, soft_wrap=True)
    if report.state is AppState.RUNNING:
        console.print(processes(report))
        console.print(totals(report))
        if report.input_lag:
            console.print(input_lag(report))
    elif report.snapshot is not None:
        console.print(f"last snapshot: {snapshot_line(report.snapshot, report.time_ms)}")


def headline(report: StatusReport) -> Text:
    """One line: running (generation, rollbacks, supervisor) or why it is not."""
    name, now = report.app, report.time_ms
    supervisor = report.supervisor
    if report.state is AppState.NEVER_SEEN:
        return Text(
            f"{name} is not running: no status record on {name}.status (never started "
            "on this broker, or by an epochal that writes none)"
        )
    assert supervisor is not None, "seen: a supervisor's record"
    where = f"supervisor pid {supervisor.pid} on {supervisor.host}"
    if report.state is AppState.STOPPED:
        return Text(
            f"{name} is not running: it stopped at {when(supervisor.time_ms, now)} ({where})"
        )
    if report.state is AppState.NOT_RUNNING:
        return Text(
            f"{name} is not running: its {where} was last seen at "
            f"{when(supervisor.time_ms, now)}, and nothing since"
        )
    rollbacks = f"{report.rollbacks} rollback{'s' * (report.rollbacks != 1)}"
    line = Text("● ", style="green")
    line.append(
        f"{name} running: generation {report.generation}, {rollbacks}, {where}, up "
        f"{duration(now - supervisor.started_ms)}, run {supervisor.run_id}"
    )
    if report.silent:
        line.append(f"; not reporting: {', '.join(report.silent)}", style="bold red")
    return line


def processes(report: StatusReport) -> Table:
    """A row per process; a column no process fills (metrics, without ``--metrics-port``) is
    left out."""
    now = report.time_ms
    rows: list[dict[str, RenderableType]] = []
    if report.supervisor is not None:
        s = report.supervisor
        rows.append(
            {
                "process": "supervisor",
                "pid": str(s.pid),
                "host": s.host,
                "gen": str(s.generation),
                "metrics": s.metrics,
                "seen": seen(s, now),
            }
        )
    if report.sequencer is not None:
        q = report.sequencer
        rows.append(
            {
                "process": "sequencer",
                "pid": str(q.pid),
                "host": q.host,
                "gen": str(q.generation),
                "epoch": _epoch(q.epoch),
                "epochs/s": f"{q.epochs_per_s:,.1f}",
                "txns/s": f"{q.transactions_per_s:,.0f}",
                "committed": f"{q.transactions:,}",
                "metrics": q.metrics,
                "seen": seen(q, now),
            }
        )
    by_index = {w.worker: w for w in report.workers}
    count = report.supervisor.workers if report.supervisor is not None else len(by_index)
    for index in range(count):
        w = by_index.get(index)
        if w is None:
            rows.append({"process": f"worker {index}", "seen": Text("never", style="red")})
            continue
        rows.append(
            {
                "process": f"worker {index}",
                "pid": str(w.pid),
                "host": w.host,
                "gen": str(w.generation),
                "partitions: keys": partitions(w),
                "epoch": _epoch(w.epoch),
                "epochs/s": f"{w.epochs_per_s:,.1f}",
                "txns/s": f"{w.transactions_per_s:,.0f}",
                "committed": f"{w.committed:,}",
                "aborted": f"{w.aborted:,}",
                "query": w.query,
                "metrics": w.metrics,
                "seen": seen(w, now),
            }
        )
    columns = [c for c in _COLUMNS if any(row.get(c) for row in rows)]
    table = Table(title=f"processes of {report.app}", title_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if column in _NUMBERS else "left")
    for row in rows:
        table.add_row(*(row.get(column, "") for column in columns))
    return table


_COLUMNS = (
    "process",
    "pid",
    "host",
    "gen",
    "partitions: keys",
    "epoch",
    "epochs/s",
    "txns/s",
    "committed",
    "aborted",
    "query",
    "metrics",
    "seen",
)
_NUMBERS = {"pid", "gen", "epoch", "epochs/s", "txns/s", "committed", "aborted"}


def totals(report: StatusReport) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    executed = _epoch(report.executed_epoch)
    grid.add_row("epoch", f"{_epoch(report.epoch)} (every worker has executed {executed})")
    grid.add_row("epochs/s", f"{report.epochs_per_s:,.1f}")
    grid.add_row(
        "transactions/s",
        f"{report.transactions_per_s:,.0f} sequenced, {report.executed_per_s:,.0f} executed",
    )
    grid.add_row("input lag", f"{sum(report.input_lag.values()):,} records")
    grid.add_row("dead letters", f"{report.dead_letters:,}")
    grid.add_row("rollbacks", f"{report.rollbacks}")
    snapshot = report.snapshot
    grid.add_row("last snapshot", snapshot_line(snapshot, report.time_ms) if snapshot else "none")
    return grid


def input_lag(report: StatusReport) -> Table:
    table = Table(title="input lag", title_justify="left")
    table.add_column("topic:partition")
    table.add_column("lag", justify="right")
    for key, lag in sorted(report.input_lag.items()):
        table.add_row(key, f"{lag:,}")
    return table


def partitions(worker: WorkerStatus) -> RenderableType:
    """Each partition's actor count, then its key range of each actor type, one to a line (a
    line of every range made the column too wide for a terminal)."""
    lines = []
    for p in worker.partitions:
        lines.append(f"{p.partition}: {p.actors:,} actor{'s' * (p.actors != 1)}")
        lines.extend(f"  {describe_range(r)}" for r in p.ranges)
    return Group(*(Text(line) for line in lines))


def describe_range(key_range: KeyRange) -> str:
    """``Account [10, 20)``; an open end is ``…``."""
    low = "…" if key_range.low is None else repr(key_range.low)
    high = "…" if key_range.high is None else repr(key_range.high)
    return f"{key_range.actor_type} [{low}, {high})"


def snapshot_line(snapshot: SnapshotSummary, now_ms: int) -> str:
    actors = ", ".join(f"{name} {count:,}" for name, count in sorted(snapshot.actors.items()))
    return (
        f"ssid {snapshot.ssid}, {ago(now_ms - snapshot.time_ms)}, "
        f"{size(snapshot.bytes)}, actors: {actors or 'none'}"
    )


def seen(record: ProcessStatus, now_ms: int) -> Text:
    """How long ago the record was written; red once it is stale."""
    age = now_ms - record.time_ms
    return Text(ago(age), style="red" if age > STALE_S * 1000 else "")


def when(time_ms: int, now_ms: int) -> str:
    at = datetime.datetime.fromtimestamp(time_ms / 1000, datetime.UTC)
    return f"{at.isoformat(timespec='seconds')} ({ago(now_ms - time_ms)})"


def ago(age_ms: int) -> str:
    return f"{duration(age_ms)} ago"


def duration(ms: int) -> str:
    seconds = max(0.0, ms / 1000)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _epoch(epoch: int) -> str:
    return "—" if epoch < 0 else f"{epoch:,}"
