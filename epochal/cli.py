"""The ``epochal`` command: run an app, stop, skip and replay it, recover it with Spark, query its
history, and the local broker and jars for development.

Config objects are built here, once, from flags and the environment (``EPOCHAL_CACHE``); library
code never reads the environment. An :class:`EpochalError` ends the command with its message and
exit code 1, or 2 for a usage error found after parsing (like argparse's own); anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.logging import RichHandler

from epochal.actors.api import App, load_app
from epochal.actors.lifecycle import LOG_FORMAT_ENV, child_logging
from epochal.config import (
    CacheConfig,
    ClusterConfig,
    FailureConfig,
    KafkaConfig,
    LocalBrokerConfig,
    LogFormat,
    RebalanceConfig,
    SnapshotConfig,
    SparkConfig,
    SqlServerConfig,
    cache_dir_from_env,
)
from epochal.errors import ConfigError, EpochalError, LogTruncatedError
from epochal.jvm import JarSet, fetch_jars
from epochal.log.local_broker import LocalBroker

if TYPE_CHECKING:
    from rich.console import RenderableType

    from epochal.actors.snapshots import Restored
    from epochal.log.amendments import Amendments
    from epochal.log.client import KafkaClients
    from epochal.log.command_log import LoggedEpoch
    from epochal.log.status import StatusReader
    from epochal.recovery.snapshots import Warehouse
    from epochal.recovery.spark_recovery import RecoveryReport
    from epochal.schemas.snapshots import Manifest

__all__ = ["entry", "main"]

logger = logging.getLogger(__name__)

console = Console(stderr=True)


class _UsageError(ConfigError):
    """A flag's value that only the app can refute (``--show`` of an actor type it lacks): a
    usage error found after parsing, exit code 2 like argparse's."""


def _cache(args: argparse.Namespace) -> CacheConfig:
    return CacheConfig(Path(args.cache) if args.cache else cache_dir_from_env())


def _broker(args: argparse.Namespace) -> LocalBroker:
    cache = _cache(args)
    data_dir = Path(args.data_dir) if args.data_dir else cache.broker_dir(args.port)
    config = LocalBrokerConfig(
        port=args.port,
        data_dir=data_dir,
        jar_dir=cache.jar_dir(JarSet.KAFKA_BROKER.value),
        startup_timeout_s=args.timeout,
    )
    return LocalBroker(config)


def _jars_fetch(args: argparse.Namespace) -> int:
    cache = _cache(args)
    for jar_set in JarSet:
        with console.status(f"fetching {jar_set.value} jars from Maven Central"):
            directory = fetch_jars(cache, jar_set)
        console.print(f"[green]✓[/] {jar_set.value} jars in {directory}")
    return 0


def _kafka_start(args: argparse.Namespace) -> int:
    broker = _broker(args)
    with console.status(f"starting Kafka on {broker.config.bootstrap}"):
        started = broker.start()
    status = broker.status()
    if started:
        console.print(f"[green]✓[/] Kafka running at {status.bootstrap} (pid {status.pid})")
        console.print(f"  log: {status.log_file}")
    else:
        console.print(
            f"Kafka is already running at {status.bootstrap} (pid {status.pid}); nothing started"
        )
    return 0


def _kafka_stop(args: argparse.Namespace) -> int:
    broker = _broker(args)
    with console.status(f"stopping Kafka on {broker.config.bootstrap}"):
        stopped = broker.stop()
    console.print("[green]✓[/] Kafka stopped" if stopped else "Kafka was not running")
    return 0


def _kafka_status(args: argparse.Namespace) -> int:
    """Exit code 0 when a broker answers on the port, whichever data dir it runs from; 3 (like
    ``systemctl status``) when none does."""
    status = _broker(args).status()
    holder = status.holder
    if status.running:
        said = f"Kafka running at {status.bootstrap} (pid {status.pid}), data in {status.data_dir}"
    elif holder is not None and holder.data_dir is not None:
        said = (
            f"Kafka is running at {status.bootstrap} (pid {holder.pid}) from data dir "
            f"{holder.data_dir}, not from {status.data_dir}: --data-dir {holder.data_dir} names it"
        )
    elif holder is not None and holder.pid is not None:
        said = (
            f"a Kafka broker that epochal did not start is running at {status.bootstrap} "
            f"(pid {holder.pid}); none runs from {status.data_dir}"
        )
    else:
        port = status.bootstrap.rpartition(":")[2]
        taken = f", and port {port} on 127.0.0.1 is taken by another process" if holder else ""
        said = f"Kafka is not running at {status.bootstrap} (data dir {status.data_dir}){taken}"
        console.print(said, highlight=False, soft_wrap=True)
        return 3
    console.print(said, highlight=False, soft_wrap=True)
    return 0


def _apps_from_working_directory() -> None:
    """Like ``python -m``: apps (``examples.bank.app:app``) import from the working directory."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _settings(pairs: list[str]) -> dict[str, str]:
    """``key=value`` pairs passed through: librdkafka settings (``-X``: SASL, SSL, timeouts),
    delta-rs storage options (``--storage-option``)."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"expected key=value, got {pair!r}")
        settings[key.strip()] = value.strip()
    return settings


def _run(args: argparse.Namespace) -> int:
    from epochal.cluster_plan import check_before_start, plan_cluster
    from epochal.supervisor import Supervisor

    _apps_from_working_directory()
    plan = plan_cluster(args.app, _cluster_config(args))
    with console.status(f"checking Kafka at {plan.kafka.bootstrap_servers}"):
        check_before_start(plan)
    return Supervisor(plan).run()


def _cluster_config(args: argparse.Namespace) -> ClusterConfig:
    """The ClusterConfig ``epochal run``'s flags say."""
    if bool(args.query_tls_cert) != bool(args.query_tls_key):
        raise ConfigError("TLS for queries needs both --query-tls-cert and --query-tls-key")
    if args.recovery == "weak" and args.no_snapshots:
        raise ConfigError("--recovery weak needs snapshots: they release its egress")
    return ClusterConfig(
        kafka=KafkaConfig(args.bootstrap, _settings(args.kafka_setting)),
        name=args.name, workers=args.workers, partitions=args.partitions,
        input_partitions=args.input_partitions, input_retention_ms=args.input_retention_ms,
        epoch_ms=args.epoch_ms, epoch_records=args.epoch_records,
        snapshots=None if args.no_snapshots else SnapshotConfig(
            args.warehouse, _settings(args.storage_option), keep=args.keep_snapshots,
            keep_inputs=args.keep_inputs,
        ),
        snapshot_interval_ms=args.snapshot_interval_ms,
        snapshot_every_epochs=args.snapshot_every_epochs,
        recovery=args.recovery,
        peers=tuple(args.peers.split(",")) if args.peers else (),
        port_base=args.port_base, feed=args.feed or "",
        query_port=args.query_port, query_host=args.query_host,
        query=tuple(args.query.split(",")) if args.query else (),
        query_token=args.query_token,
        query_tls=(args.query_tls_cert, args.query_tls_key) if args.query_tls_cert else None,
        metrics_port=args.metrics_port,
        run_dir=Path(args.run_dir),
        failure=FailureConfig(failure_timeout_ms=args.failure_timeout_ms,
                              startup_timeout_ms=args.startup_timeout_ms,
                              stop_timeout_ms=args.stop_timeout_ms,
                              hang_timeout_ms=args.hang_timeout_ms),
        rebalance=RebalanceConfig(args.rebalance_check_ms, args.rebalance_skew),
        allow_code_change=args.allow_code_change,
    )  # fmt: skip


def _replay(args: argparse.Namespace) -> int:
    from collections import defaultdict

    from rich.progress import Progress

    from epochal.log.amendments import read_amendments
    from epochal.log.client import KafkaClients
    from epochal.log.command_log import KafkaCommandLog
    from epochal.recovery.replay import replay_command_log
    from epochal.recovery.snapshots import DeltaSnapshots

    _apps_from_working_directory()
    app = load_app(args.app, args.name)
    for actor_type in args.show:
        if actor_type not in app.actor_types:
            known = ", ".join(sorted(app.actor_types))
            raise _UsageError(
                f"--show {actor_type}: {app.name} has no such actor type (its actor types: {known})"
            )
    clients = KafkaClients(KafkaConfig(args.bootstrap, _settings(args.kafka_setting)))
    restored = None
    if args.from_start:
        _check_whole_log(clients, app, args.app)
    else:
        snapshots = DeltaSnapshots(app, SnapshotConfig(args.warehouse), partitions=1)
        with console.status(f"loading the latest snapshot from {snapshots.warehouse.uri()}"):
            restored = snapshots.restore()
    start = restored.manifest.command_log_position if restored else 0
    if restored:
        manifest = restored.manifest
        console.print(f"from snapshot ssid={manifest.ssid} (epoch {manifest.epoch}, "
                      f"command-log position {start})")  # fmt: skip
    end = clients.end_offset(app.topics.command_log)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"replaying {app.topics.command_log}", total=end - start)
        logged = KafkaCommandLog(clients, app.topics.command_log).epochs(start, to_end=True)
        amendments = read_amendments(clients, app.name)
        if args.save_log:
            logged = _saving(app, restored, logged, amendments, args.save_log)
        engine, epochs = replay_command_log(
            app, logged, allow_code_change=args.allow_code_change,
            on_epoch=lambda position: progress.update(task, completed=position + 1 - start),
            restored=restored, amendments=amendments,
        )  # fmt: skip
    by_type: dict[str, list[tuple[object, Any]]] = defaultdict(list)
    for ref, value in engine.items():
        by_type[ref.actor_type].append((ref.key, value))
    console.print(f"replayed {epochs} epochs of {app.topics.command_log}; digest {engine.digest()}")
    for actor_type, items in sorted(by_type.items()):
        console.print(f"  {actor_type}: {len(items)} actors")
    for actor_type in args.show:
        _print_actors(app, actor_type, by_type.get(actor_type, []), args.limit)
    if args.save_log:
        console.print(f"saved the {epochs} epochs to {args.save_log} "
                      "(epochal.testing.AppTest.from_command_log reads it)")  # fmt: skip
    return 0


def _check_whole_log(clients: KafkaClients, app: App, spec: str) -> None:
    """``--from-start`` needs the command log from offset 0, which retention deletes back to
    the oldest snapshot kept: say so, and what replays instead, rather than fail mid-read."""
    topic = app.topics.command_log
    first = clients.watermarks(topic)[0]
    if first > 0:
        raise LogTruncatedError(
            f"--from-start replays the whole command log, but it was trimmed back to the oldest "
            f"snapshot kept and now starts at offset {first}: replay from the latest snapshot "
            f"(leave out --from-start), or run `epochal recover {spec}` to replay the log "
            "after it in Spark",
            topic=topic,
            partition=0,
            missing=f"0..{first - 1}",
        )


def _saving(
    app: App, restored: Restored | None, epochs: Iterable[LoggedEpoch], amendments: Amendments,
    path: str,
) -> Iterator[LoggedEpoch]:  # fmt: skip
    """The snapshot replay starts from (its migrations run), then the epochs as they are read
    (amended, as replay runs them), written to ``path``."""
    from epochal.actors.engine import LocalEngine
    from epochal.actors.snapshots import carried_of
    from epochal.testing import CommandLogWriter, SavedStart

    start = SavedStart()
    if restored is not None:
        engine = LocalEngine(app, 1)
        manifest = restored.manifest
        engine.load(restored.actors, manifest.epoch, carried_of(manifest), restored.migrations)
        start = SavedStart.of(engine)
    with CommandLogWriter(path, start) as saved:
        for logged in epochs:
            saved.write(amendments.apply(logged.record))
            yield logged


def _recover(args: argparse.Namespace) -> int:
    """The PySpark strong-recovery job, with a progress bar per phase."""
    from rich.progress import Progress

    from epochal.analytics.spark import spark_session
    from epochal.jvm import JarSet
    from epochal.recovery.spark_recovery import RecoveryProgress, recover_strong

    _apps_from_working_directory()
    config = SnapshotConfig(args.warehouse, _settings(args.storage_option))
    jars = _cache(args).jar_dir(JarSet.SPARK.value)
    with console.status(f"starting Spark ({args.master})"):
        spark = spark_session(SparkConfig(jar_dir=jars, master=args.master,
                                          app_name="epochal-recover",
                                          conf=_settings(args.spark_conf)))  # fmt: skip
    if args.mode == "weak":
        return _recover_weak(args, config, spark)
    with Progress(console=console, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def progress(step: RecoveryProgress) -> None:
            if step.phase not in tasks:
                tasks[step.phase] = bar.add_task(step.phase, total=step.total)
            bar.update(tasks[step.phase], completed=step.done, total=step.total)

        report = recover_strong(
            args.app, args.name, config, spark,
            kafka=KafkaConfig(args.bootstrap, _settings(args.kafka_setting)),
            from_ssid=args.from_ssid, into=args.into,
            allow_code_change=args.allow_code_change, progress=progress,
        )  # fmt: skip
    if not report.ssids:  # in place, and no epoch after the snapshot: nothing was written
        _say_nothing_to_recover(report)
        return 0
    how = (f"in parallel: {report.groups:,} key groups in {report.tasks} tasks"
           if report.parallel else f"as one ordered task ({report.ordered_reason})")  # fmt: skip
    console.print(
        f"[green]✓[/] replayed {report.transactions:,} transactions of {report.epochs:,} epochs "
        f"from ssid={report.from_ssid} {how} in {report.seconds:.1f} s "
        f"({report.transactions / max(report.seconds, 1e-9):,.0f}/s)"
    )
    console.print(f"  snapshots {list(report.ssids)} committed under {report.tables!r}; "
                  f"digest {report.digest}")  # fmt: skip
    if args.into is None:
        console.print(f"  `epochal run` resumes from it (command-log position "
                      f"{report.command_log_position})")  # fmt: skip
    return 0


def _say_nothing_to_recover(report: RecoveryReport) -> None:
    """Said instead of 'replayed 0 transactions' and 'snapshots [] committed'."""
    position = report.command_log_position
    if report.from_ssid is None:
        said = f"nothing to recover: {report.tables} has no snapshot and an empty command log"
    else:
        said = (
            f"nothing to recover: snapshot ssid={report.from_ssid} is already the latest, and the "
            "command log holds no epoch after it; `epochal run` resumes from it (command-log "
            f"position {position})"
        )
    console.print(said, highlight=False, soft_wrap=True)


def _recover_weak(args: argparse.Namespace, config: SnapshotConfig, spark: Any) -> int:
    from rich.progress import Progress

    from epochal.recovery.spark_weak import recover_weak

    if args.from_ssid is not None or args.into is not None:
        raise ConfigError("--from-ssid and --into are for --mode strong")
    app = load_app(args.app, args.name)
    with Progress(console=console, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        kafka = KafkaConfig(args.bootstrap, _settings(args.kafka_setting))
        report = recover_weak(app, config, spark, kafka, progress=progress)
    if report.ssid is None:
        console.print(f"nothing after snapshot ssid={report.from_ssid} to re-sequence")
        return 0
    console.print(
        f"[green]✓[/] re-sequenced {report.records:,} input records after ssid="
        f"{report.from_ssid} into {report.epochs:,} epochs ({report.transactions:,} "
        f"transactions, {report.dead_letters} dead letters) in {report.seconds:.1f} s"
    )
    console.print(f"  snapshot {report.ssid} committed, digest {report.digest}; it holds "
                  f"{report.egress:,} egress records and the dead letters, which "
                  "`epochal run --recovery weak` releases")  # fmt: skip
    return 0


def _stop(args: argparse.Namespace) -> int:
    """SIGTERM an app's supervisor and wait: the run ends on a savepoint (``epochal/stop.py``)."""
    from epochal.stop import read_stop, stop_app

    app = None
    if ":" in args.app:
        _apps_from_working_directory()
        app = load_app(args.app, args.name)
    name = app.name if app is not None else (args.name or args.app)
    with console.status(f"stopping {name}: a final epoch, its snapshot and egress"):
        pid = stop_app(name, Path(args.run_dir), args.timeout)
    said = f"stopped {name} (supervisor pid {pid})"
    ended = read_stop(Path(args.run_dir), name)
    if ended is not None and ended.savepoint:
        said += f" at a savepoint: ssid={ended.ssid}; a start after it replays nothing"
    elif ended is not None:
        resumes = f"ssid={ended.ssid}" if ended.ssid is not None else "the command log's start"
        said += (f", not at a savepoint: {ended.reason}; the next start resumes from {resumes} "
                 "and replays the epochs after it")  # fmt: skip
    Console().print(said, highlight=False, soft_wrap=True)
    return 0 if ended is not None and ended.savepoint else 1


def _skip(args: argparse.Namespace) -> int:
    """Record that one logged transaction goes to the dead letters (``epochal/skip.py``)."""
    from epochal.log.client import KafkaClients
    from epochal.recovery.snapshots import DeltaSnapshots
    from epochal.skip import Skipped, SkippedInput, parse_input, skip_input, skip_transaction

    if (args.input is None) == (args.epoch is None or args.seq is None):
        raise ConfigError("name the transaction with --epoch and --seq, or the input (weak "
                          "mode) with --input TOPIC/PARTITION@OFFSET")  # fmt: skip
    _apps_from_working_directory()
    app = load_app(args.app, args.name)
    clients = KafkaClients(KafkaConfig(args.bootstrap, _settings(args.kafka_setting)))
    config = SnapshotConfig(args.warehouse, _settings(args.storage_option))
    snapshots = DeltaSnapshots(app, config, partitions=1)
    skipped: Skipped | SkippedInput
    if args.input is not None:
        skipped = skip_input(app, clients, snapshots, parse_input(args.input))
    else:
        skipped = skip_transaction(app, clients, snapshots, args.epoch, args.seq)
    Console().print(skipped.describe(app), highlight=False, soft_wrap=True)  # the answer: stdout
    return 0


def _status(args: argparse.Namespace) -> int:
    """Where a cluster stands, from its status records, dead letters and snapshots
    (``epochal/status.py``); exit code 3 when it is not running, like ``kafka status``."""
    from epochal.log.client import KafkaClients
    from epochal.log.status import StatusReader
    from epochal.recovery.snapshots import Warehouse
    from epochal.status import AppState, read_report
    from epochal.status_view import print_status, processes, status_json

    name = args.name or args.app
    if ":" in args.app:
        _apps_from_working_directory()
        name = load_app(args.app, args.name).name
    clients = KafkaClients(KafkaConfig(args.bootstrap, _settings(args.kafka_setting)))
    warehouse = Warehouse(args.warehouse, name, _settings(args.storage_option) or None)
    if args.serve:
        return _serve_status(StatusReader(clients, name), warehouse, args.serve, args.token)
    report = read_report(StatusReader(clients, name), warehouse)
    if args.json:
        sys.stdout.write(status_json(report) + "\n")
    else:
        widest = processes(report) if report.state is AppState.RUNNING else None
        print_status(report, _stdout_for(widest) if widest else Console())  # the answer: stdout
    return 0 if report.state is AppState.RUNNING else 3


def _serve_status(reader: StatusReader, warehouse: Warehouse, port: int, token: str) -> int:
    """The status page until Ctrl-C or SIGTERM (``epochal/status_page.py``)."""
    import contextlib

    from epochal.status import recent_snapshots
    from epochal.status_page import StatusPage, serve_status

    page = StatusPage(reader, lambda: recent_snapshots(warehouse, 5))
    server = serve_status(page, port, token)
    host = "every interface" if token else "127.0.0.1"
    console.print(f"status of {reader.names.app} on http://{host}:{port}/ (Ctrl-C stops)")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.set())
    with contextlib.suppress(KeyboardInterrupt):
        stopped.wait()
    server.shutdown()
    return 0


def _snapshots(args: argparse.Namespace) -> int:
    """The manifest, a row per snapshot: what each holds, and where replay would start."""
    from epochal.recovery.snapshots import DeltaSnapshots

    _apps_from_working_directory()
    app = load_app(args.app, args.name)
    config = SnapshotConfig(args.warehouse, _settings(args.storage_option))
    snapshots = DeltaSnapshots(app, config, partitions=1)
    manifests = snapshots.manifests()
    short = args.format == "table"  # a table shows a digest's start; JSON and CSV all of it
    rows = [_manifest_row(m, short) for m in manifests]
    title = f"snapshots of {app.name} in {snapshots.warehouse.uri()}"
    _print_rows(list(_MANIFEST_COLUMNS), rows, args.format, title)
    if not manifests:
        console.print("no complete snapshot yet")
    return 0


_MANIFEST_COLUMNS = (
    "ssid",
    "epoch",
    "time",
    "mode",
    "command_log_position",
    "actors",
    "partition_actors",
    "state_versions",
    "digest",
)


def _manifest_row(m: Manifest, short_digest: bool) -> list[Any]:
    """One snapshot's row of ``epochal snapshots`` (:data:`_MANIFEST_COLUMNS`)."""
    import datetime

    return [
        m.ssid,
        m.epoch,
        datetime.datetime.fromtimestamp(m.time_ms / 1000, datetime.UTC),
        m.recovery,
        m.command_log_position,
        dict(m.actors),
        m.partition_actors or None,  # None: a snapshot older than the count
        dict(m.state_versions),
        m.digest[:16] if short_digest else m.digest,
    ]


def _sql(args: argparse.Namespace) -> int:
    """Register the app's history views on a Spark session and print a query's rows: the warm
    SQL server's (started if none runs), or one in this process with ``--no-server``."""
    from epochal.analytics.history import query_rows, register_views
    from epochal.jvm import JarSet

    server = _sql_server_config(args, _cache(args).jar_dir(JarSet.SPARK.value))
    if args.stop_server:
        return _stop_sql_server(server)
    if not args.query or not args.app:
        raise ConfigError('epochal sql needs a query and an app: epochal sql "SELECT ..." APP')
    app: App | str = args.app
    if ":" in args.app:  # module:attribute; a plain name needs no code
        _apps_from_working_directory()
        app = load_app(args.app, args.name)
    with _sql_session(args, server) as spark:
        register_views(spark, app, args.warehouse)
        columns, rows = query_rows(spark, args.query)
    _print_rows(columns, rows, args.format)
    return 0


def _sql_server_config(args: argparse.Namespace, jars: Path) -> SqlServerConfig:
    spark = SparkConfig(
        jar_dir=jars, master=args.master, app_name="epochal-sql", conf=_settings(args.spark_conf)
    )
    directory = _cache(args).sql_server_dir()
    return SqlServerConfig(directory, spark, args.connect_port, args.idle_minutes * 60)


@contextlib.contextmanager
def _sql_session(args: argparse.Namespace, server: SqlServerConfig) -> Iterator[Any]:
    """The warm server's Spark session (started if none runs, said once), or one in this
    process (pyspark's types stay in analytics/)."""
    from epochal.analytics.sql_server_control import find_server, remote_session, start_server

    if args.no_server:
        from epochal.analytics.spark import spark_session

        with console.status(f"starting Spark ({args.master})"):
            yield spark_session(server.spark)
        return
    running = find_server(server)
    if running is None:
        if server.port:
            from epochal.config import Listener
            from epochal.preflight import Binding, check_ports

            check_ports([Binding(f"127.0.0.1:{server.port}", Listener.SQL, "the SQL server")])
        with console.status(f"starting the SQL server (Spark {args.master} over Spark Connect)"):
            running = start_server(server)
        console.print(
            f"started a SQL server (pid {running.pid}, 127.0.0.1:{running.port}) that later "
            f"`epochal sql` commands reuse; it stops after {args.idle_minutes:g} minutes without "
            "a query, or with `epochal sql --stop-server`",
            highlight=False,
            soft_wrap=True,
        )
    with remote_session(running, server) as spark:
        yield spark


def _stop_sql_server(server: SqlServerConfig) -> int:
    from epochal.analytics.sql_server_control import stop_server

    with console.status("stopping the SQL server"):
        stopped = stop_server(server)
    if stopped is None:
        console.print("no SQL server was running")
    else:
        console.print(f"[green]✓[/] SQL server stopped (pid {stopped.pid})")
    return 0


def _print_rows(
    columns: list[str], rows: list[list[Any]], form: str, title: str | None = None
) -> None:
    """Rows on stdout: a table, JSON lines, or CSV with a header; timestamps in UTC."""
    import csv

    import msgspec
    from rich.table import Table

    values = [[_plain(v) for v in row] for row in rows]
    if form == "json":
        for row in values:
            sys.stdout.write(msgspec.json.encode(dict(zip(columns, row, strict=True))).decode())
            sys.stdout.write("\n")
    elif form == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        for row in values:
            writer.writerow(["" if v is None else v if isinstance(v, str | int | float)
                             else msgspec.json.encode(v).decode() for v in row])  # fmt: skip
    else:
        table = Table(*columns, title=title, caption=f"{len(rows)} rows")
        for row in values:
            table.add_row(*("NULL" if v is None else f"<{len(v)} bytes>" if isinstance(v, bytes)
                            else str(v) for v in row))  # fmt: skip
        _stdout_for(table).print(table)


def _stdout_for(table: RenderableType) -> Console:
    """A terminal's width on a terminal; a pipe or a file gets the whole table, not a table
    squeezed into 80 columns with its values cut short."""
    from rich.measure import Measurement

    stdout = Console()
    if stdout.is_terminal:
        return stdout
    wide = stdout.options.update_width(1 << 20)
    return Console(width=Measurement.get(stdout, wide, table).maximum)


def _plain(value: Any) -> Any:
    """A Spark value for output: naive datetimes (Spark gives local time) as UTC."""
    import datetime

    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.UTC).isoformat(timespec="milliseconds")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class _IntermixedParser(argparse.ArgumentParser):
    """``epochal sql``'s parser: its query and app are optional (``--stop-server`` needs
    neither), and flags may still come between them, as when they were required."""

    _intermixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._intermixing:  # parse_known_intermixed_args calls back here
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def _sql_command(commands: Any) -> None:
    """``epochal sql``."""
    sql = commands.add_parser("sql", help="Spark SQL over an app's snapshot history")
    sql.__class__ = _IntermixedParser  # add_parser makes every command's parser of one class
    sql.add_argument(
        "query",
        nargs="?",
        help='e.g. "SELECT _ssid, sum(balance) FROM account_history GROUP BY _ssid"',
    )
    sql.add_argument("app", nargs="?", help="the app's name, or module:attribute of the App")
    sql.add_argument("--name", help="app name (with module:attribute; default: the App's)")
    sql.add_argument("--warehouse", default="warehouse", help="where the snapshots are")
    sql.add_argument("--format", choices=("table", "json", "csv"), default="table",
                     help="a table, JSON lines or CSV")  # fmt: skip
    sql.add_argument("--master", default="local[2]", help="Spark master")
    sql.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                     help="a Spark setting (spark.hadoop.fs.s3a.* for object stores)")  # fmt: skip
    sql.add_argument(
        "--no-server",
        action="store_true",
        help="run the query on a Spark session in this process, not on the warm SQL server",
    )
    sql.add_argument(
        "--connect-port",
        type=int,
        default=0,
        help="the port on 127.0.0.1 a SQL server started now listens on (0: a free one)",
    )
    sql.add_argument(
        "--idle-minutes",
        type=float,
        default=30.0,
        help="a SQL server started now stops after this long without a query",
    )
    sql.add_argument(
        "--stop-server",
        action="store_true",
        help="stop the warm SQL server of this cache, and do nothing else",
    )
    sql.set_defaults(handler=_sql)


def _print_actors(app: App, actor_type: str, actors: list[tuple[object, Any]], limit: int) -> None:
    """A table of the first actors of a type, and the totals of its numeric fields."""
    from rich.table import Table

    actors = sorted(actors, key=lambda item: str(item[0]))
    fields = app.actor_types[actor_type].state.__struct_fields__
    table = Table(title=f"{actor_type} (first {limit} of {len(actors)})")
    for column in ("key", *fields):
        table.add_column(column)
    for key, value in actors[:limit]:
        table.add_row(str(key), *(str(getattr(value, f)) for f in fields))
    console.print(table)
    totals = {
        f: sum(getattr(v, f) for _, v in actors)
        for f in fields
        if all(isinstance(getattr(v, f), int | float) for _, v in actors)
    }
    console.print(f"  totals over all {len(actors)}: {totals}")


def _demo(args: argparse.Namespace) -> int:
    from epochal.demo import run_demo  # pulls in Spark; only this command needs it

    checkout = _checkout_root("demo", "examples/bank/app.py")  # it runs the bank example
    return run_demo(_cache(args), _broker(args), Path(args.warehouse), console, checkout)


def _checkout_root(command: str, needs: str) -> Path:
    """The checkout of epochal this package runs from, put on ``sys.path`` whatever the working
    directory: ``bench/`` and ``examples/`` are beside the package in a checkout, not in a
    wheel."""
    root = Path(__file__).resolve().parent.parent
    if not (root / needs).is_file():
        folder = Path(needs).parts[0]
        raise ConfigError(
            f"epochal {command} runs from a checkout of epochal (its {folder}/ folder is not "
            "installed): clone the repository and run it there (its ./dev sets everything up)",
            looked_in=str(root),
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root


def _bench(args: argparse.Namespace) -> int:
    """The benchmarks live beside the package in a checkout (``bench/``), not in a wheel."""
    _checkout_root("bench", "bench/cli.py")
    bench: Any = importlib.import_module("bench.cli")
    return int(bench.main(args.arguments))


def _positive(text: str) -> int:
    """A count of processes or partitions: 0 or less is a usage error, not a default."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {number}")
    return number


def _run_flags(run: argparse.ArgumentParser) -> None:
    """The flags of ``epochal run``: layout, epochs, failures, snapshots."""
    run.add_argument(
        "--workers",
        type=_positive,
        help="worker processes (default: usable cores - 1, at least 1)",
    )
    run.add_argument("--partitions", type=_positive, help="partitions (default 2 per worker)")
    run.add_argument(
        "--log-format",
        choices=[f.value for f in LogFormat],
        default=os.environ.get(LOG_FORMAT_ENV, LogFormat.TEXT.value),
        help="every process's log lines: text, or one JSON object a line ($EPOCHAL_LOG_FORMAT)",
    )
    run.add_argument("--epoch-ms", type=int, default=20, help="close an epoch after this long")
    run.add_argument("--epoch-records", type=int, default=5000, help="... or this many records")
    run.add_argument("--peers", help="host:port of every worker, comma-separated")
    run.add_argument("--port-base", type=int, default=7600, help="local worker ports from here")
    run.add_argument("--input-partitions", type=int, default=1, help="partitions of new topics")
    run.add_argument("--input-retention-ms", type=int, default=-1,
                     help="retention of input and requests topics (-1: forever)")  # fmt: skip
    run.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="Prometheus: worker w on port+w, then the sequencer, the supervisor (0: off)",
    )
    run.add_argument(
        "--query-port",
        type=int,
        default=7700,
        help="live queries: worker w listens on this port + w (0: no queries)",
    )
    run.add_argument(
        "--query-host",
        default="127.0.0.1",
        help="the address query servers bind (beyond 127.0.0.1 needs a token)",
    )
    run.add_argument("--query", help="host:port of every worker's query server, comma-separated")
    run.add_argument(
        "--query-token",
        default=os.environ.get("EPOCHAL_QUERY_TOKEN", ""),
        help="the token query clients must present (default $EPOCHAL_QUERY_TOKEN)",
    )
    run.add_argument("--query-tls-cert", help="serve queries over TLS with this certificate")
    run.add_argument("--query-tls-key", help="... and this private key")
    run.add_argument("--run-dir", default=".epochal/run", help="where pids and status go")
    run.add_argument("--stop-timeout-ms", type=int, default=30_000,
                     help="SIGTERM ends the cluster on a savepoint (a final snapshot); after "
                          "this long, what is left is killed instead")  # fmt: skip
    run.add_argument("--failure-timeout-ms", type=int, default=6000,
                     help="a process or peer silent this long has failed (the broker's "
                          "group.min.session.timeout.ms is the least)")  # fmt: skip
    run.add_argument(
        "--hang-timeout-ms",
        type=int,
        default=0,
        help="a handler running this long on one input is hung: its worker names it and exits "
        "(0: half of --failure-timeout-ms, the most allowed)",
    )
    run.add_argument("--startup-timeout-ms", type=int, default=30_000,
                     help="a process must join the cluster within this")  # fmt: skip
    run.add_argument("--warehouse", default="warehouse",
                     help="Delta root of the snapshots, a path or URI")  # fmt: skip
    run.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                     help="delta-rs storage option (object-store credentials)")  # fmt: skip
    run.add_argument("--snapshot-interval-ms", type=int, default=1000,
                     help="snapshot every this long (0: not by time)")  # fmt: skip
    run.add_argument("--snapshot-every-epochs", type=int, default=0,
                     help="... or every this many epochs (0: not by count)")  # fmt: skip
    run.add_argument("--keep-snapshots", type=int, default=10,
                     help="snapshots kept (0: every one, and the whole logs)")  # fmt: skip
    run.add_argument("--keep-inputs", action="store_true",
                     help="never trim input topics (their own retention applies)")  # fmt: skip
    run.add_argument(
        "--rebalance-check-ms",
        type=int,
        default=30_000,
        help="look this often at the latest snapshot for partitions holding skewed shares of "
        "the actors, and rebalance (0: never)",
    )
    run.add_argument(
        "--rebalance-skew",
        type=float,
        default=2.0,
        help="skewed: the fullest partition holds over this many times the mean",
    )
    run.add_argument("--no-snapshots", action="store_true",
                     help="no snapshots: a restart replays the whole command log")  # fmt: skip
    run.add_argument("--recovery", choices=("strong", "weak"), default="strong",
                     help="strong: a command log, replayed on recovery; weak: none, the input "
                          "is re-sequenced from the latest snapshot, egress waits for "
                          "snapshots (docs/recovery.md)")  # fmt: skip
    run.add_argument("--feed", help="weak mode: host:port the sequencer sends epochs on "
                                    "(default: 127.0.0.1, port-base + workers)")  # fmt: skip


def _recovery_commands(commands: Any, app_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    """``epochal recover`` and ``epochal snapshots``."""
    recover = commands.add_parser(
        "recover", help="strong recovery as a Spark job: a snapshot + the command log -> a new one"
    )
    app_flags(recover)
    recover.add_argument("--mode", choices=("strong", "weak"), default="strong",
                         help="strong: replay the command log after a snapshot; weak: "
                              "re-sequence the input after a weak-mode snapshot")  # fmt: skip
    recover.add_argument("--warehouse", default="warehouse", help="where the snapshots are")
    recover.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                         help="delta-rs storage option")  # fmt: skip
    recover.add_argument("--from-ssid", type=int,
                         help="the snapshot to start from (default: the latest)")  # fmt: skip
    recover.add_argument("--into", metavar="NAMESPACE",
                         help="replay under the current code into <app>/into/NAMESPACE, leaving "
                              "the app's tables alone")  # fmt: skip
    recover.add_argument("--master", default="local[2]", help="Spark master")
    recover.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                         help="a Spark setting")  # fmt: skip
    recover.set_defaults(handler=_recover)

    listing = commands.add_parser("snapshots", help="list an app's complete snapshots")
    listing.add_argument("app", help="module:attribute of the App, e.g. examples.bank.app:app")
    listing.add_argument("--name", help="app name (default: the App's)")
    listing.add_argument("--warehouse", default="warehouse", help="where the snapshots are")
    listing.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                         help="delta-rs storage option")  # fmt: skip
    listing.add_argument(
        "--format",
        choices=("table", "json", "csv"),
        default="table",
        help="a table, JSON lines or CSV",
    )
    listing.set_defaults(handler=_snapshots)

    status = commands.add_parser(
        "status", help="where a running app stands: processes, epochs, lag, snapshots"
    )
    status.add_argument("app", help="module:attribute of the App, or the app's name")
    status.add_argument("--name", help="app name (default: the App's)")
    status.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap")
    status.add_argument("-X", dest="kafka_setting", action="append", default=[],
                        metavar="KEY=VALUE", help="librdkafka setting")  # fmt: skip
    status.add_argument("--warehouse", default="warehouse", help="where the snapshots are")
    status.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="delta-rs storage option")  # fmt: skip
    status.add_argument("--json", action="store_true", help="one JSON document on stdout")
    status.add_argument("--serve", type=int, default=0, metavar="PORT",
                        help="serve it as a self-refreshing page (0: print once)")  # fmt: skip
    status.add_argument("--token", default=os.environ.get("EPOCHAL_STATUS_TOKEN", ""),
                        help="the page listens beyond 127.0.0.1, for requests with this "
                             "token (default $EPOCHAL_STATUS_TOKEN)")  # fmt: skip
    status.set_defaults(handler=_status)

    stop = commands.add_parser("stop", help="stop a running app at a savepoint (a final snapshot)")
    stop.add_argument("app", help="module:attribute of the App, or the app's name")
    stop.add_argument("--name", help="app name (default: the App's)")
    stop.add_argument("--run-dir", default=".epochal/run", help="the --run-dir of its run")
    stop.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for it")
    stop.set_defaults(handler=_stop)

    skip = commands.add_parser(
        "skip", help="send one poison transaction to the dead-letter topic instead of running it"
    )
    skip.add_argument("app", help="module:attribute of the App, e.g. examples.bank.app:app")
    skip.add_argument("--epoch", type=int, help="the transaction's epoch (strong mode)")
    skip.add_argument("--seq", type=int, help="its seq in the epoch (strong mode)")
    skip.add_argument("--input", metavar="TOPIC/PARTITION@OFFSET",
                      help="weak mode: the input to skip, as the poison line names it")  # fmt: skip
    skip.add_argument("--name", help="app name (default: the App's)")
    skip.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap")
    skip.add_argument("-X", dest="kafka_setting", action="append", default=[],
                      metavar="KEY=VALUE", help="librdkafka setting")  # fmt: skip
    skip.add_argument("--warehouse", default="warehouse", help="where the snapshots are")
    skip.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                      help="delta-rs storage option")  # fmt: skip
    skip.set_defaults(handler=_skip)


class _ShowDefaults(argparse.HelpFormatter):
    """``--help`` gives every option's default, unless its help already says it (a default
    worked out at run time: cores, $EPOCHAL_QUERY_TOKEN) or there is none to give."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default is argparse.SUPPRESS or default == []
        if not action.option_strings or unset or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


_DESCRIPTION = (
    "Transactional stream processing with queryable state: run an app on Kafka (run, stop, "
    "skip), see where it stands (status), look at its snapshots and history (snapshots, "
    "replay, sql), recover it with Spark (recover), and a local broker and jars for "
    "development (kafka, jars, demo); benchmarks from a checkout (bench)."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="epochal", description=_DESCRIPTION, formatter_class=_ShowDefaults
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument(
        "--cache", help="jar and broker cache (default $EPOCHAL_CACHE or ~/.cache/epochal)"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    jars = commands.add_parser("jars", help="JVM artifacts from Maven Central")
    jars.add_argument("action", choices=["fetch"])
    jars.set_defaults(handler=_jars_fetch)

    def broker_flags(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--port", type=int, default=9092, help="broker port (controller: port+1)"
        )
        command.add_argument("--data-dir", help="broker data dir (default <cache>/brokers/<port>)")
        command.add_argument("--timeout", type=float, default=30.0, help="start-up wait in seconds")

    kafka = commands.add_parser("kafka", help="the local single-node KRaft broker")
    kafka.add_argument("action", choices=["start", "stop", "status"])
    broker_flags(kafka)
    kafka.set_defaults(handler=_kafka_dispatch)

    def app_flags(command: argparse.ArgumentParser) -> None:
        command.add_argument("app", help="module:attribute of the App, e.g. examples.bank.app:app")
        command.add_argument("--name", help="app name for topics and ids (default: the App's)")
        command.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap")
        command.add_argument("-X", dest="kafka_setting", action="append", default=[],
                             metavar="KEY=VALUE", help="librdkafka setting")  # fmt: skip
        command.add_argument("--allow-code-change", action="store_true",
                             help="replay a command log written by other code")  # fmt: skip

    run = commands.add_parser("run", help="run an app: sequencer and workers on Kafka")
    app_flags(run)
    _run_flags(run)
    run.set_defaults(handler=_run)

    replay = commands.add_parser("replay", help="rebuild an app's state from its command log")
    app_flags(replay)
    replay.add_argument("--show", action="append", default=[], metavar="ACTOR_TYPE",
                        help="print actors of this type and totals of numeric fields")  # fmt: skip
    replay.add_argument("--limit", type=int, default=10, help="actors printed per type")
    replay.add_argument("--warehouse", default="warehouse", help="where the snapshots are")
    replay.add_argument("--from-start", action="store_true",
                        help="ignore snapshots: replay the whole command log")  # fmt: skip
    replay.add_argument("--save-log", metavar="FILE",
                        help="also write what is replayed to FILE (the snapshot it starts from, "
                        "then the epochs) for epochal.testing.AppTest.from_command_log "
                        "(docs/testing.md)")  # fmt: skip
    replay.set_defaults(handler=_replay)

    _recovery_commands(commands, app_flags)
    _sql_command(commands)

    demo = commands.add_parser("demo", help="run the demo on a local broker, Spark and warehouse")
    demo.add_argument("--warehouse", default="warehouse", help="Delta warehouse root")
    broker_flags(demo)
    demo.set_defaults(handler=_demo)

    bench = commands.add_parser(
        "bench",
        help="benchmarks (from a checkout of epochal): epochal bench --help lists them",
        add_help=False,
    )
    bench.add_argument("arguments", nargs=argparse.REMAINDER, help="a benchmark and its flags")
    bench.set_defaults(handler=_bench)
    for command in commands.choices.values():
        command.formatter_class = _ShowDefaults
    return parser


_KAFKA_ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "start": _kafka_start,
    "stop": _kafka_stop,
    "status": _kafka_status,
}


def _kafka_dispatch(args: argparse.Namespace) -> int:
    return _KAFKA_ACTIONS[args.action](args)


def _with_fixed_hash_seed(argv: Sequence[str] | None) -> None:
    """Re-run this command under PYTHONHASHSEED=0: executors must iterate sets the same way."""
    if os.environ.get("PYTHONHASHSEED") != "0":
        arguments = list(sys.argv[1:] if argv is None else argv)
        environment = {**os.environ, "PYTHONHASHSEED": "0"}
        os.execve(sys.executable, [sys.executable, "-m", "epochal.cli", *arguments], environment)


def main(argv: Sequence[str] | None = None, *, exit_at_once: bool = False) -> int:
    """Run one command; its exit code. ``exit_at_once`` (the console script) ends a command
    that used Arrow without the interpreter's teardown (:func:`_exit_now`)."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["bench"]:  # its flags are the benchmark's (argparse would take --help)
        args = argparse.Namespace(command="bench", verbose=0, arguments=words[1:], handler=_bench)
    else:
        args = _parser().parse_args(argv)
    if args.command in ("replay", "recover", "demo", "bench"):
        _with_fixed_hash_seed(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    if args.command == "run":  # the supervisor logs as its children do (and tells them how)
        os.environ[LOG_FORMAT_ENV] = args.log_format
        level = min(level, logging.INFO)
        child_logging(level)
    else:
        handlers = [RichHandler(console=console)]
        logging.basicConfig(level=level, format="%(message)s", handlers=handlers)
    logging.getLogger("epochal.librdkafka").setLevel(max(level, logging.ERROR))
    if args.command in ("demo", "bench") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        code: int = _sigterm_as_exit(args.handler, args)
    except EpochalError as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        code = 2 if isinstance(exc, _UsageError) else 1
    if exit_at_once and args.command in _ARROW_COMMANDS:
        _exit_now(code)
    return code


def _sigterm_as_exit(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``handler(args)``; a SIGTERM's exit that reached it as a SystemError still exits.

    A signal lands between Python instructions, but an exception it raised inside a Kafka
    client's C call (a log callback, say) can be left set there; the next C function to return
    then fails with "returned a result with an exception set", caused by the SystemExit. The
    ``finally`` blocks on the way (a broker to stop) have run either way."""
    try:
        return handler(args)
    except SystemError as exc:
        if isinstance(exc.__cause__, SystemExit):
            raise exc.__cause__ from None
        raise


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM ends a demo or a benchmark as Ctrl-C does: what it started (a local broker, a
    cluster) is stopped on the way out, not left running without it."""
    raise SystemExit(128 + signum)


def entry() -> None:
    """The ``epochal`` console script."""
    sys.exit(main(exit_at_once=True))


# Commands that read Delta tables through pyarrow and delta-rs in this process.
_ARROW_COMMANDS = frozenset(
    {"run", "snapshots", "replay", "recover", "sql", "skip", "stop", "status", "bench"}
)


def _exit_now(code: int) -> None:
    """End the process once its work is done and said, skipping the interpreter's teardown.

    Arrow's native thread pools can still be alive when Python tears down at exit, and a
    thread destroyed then aborts the process (``terminate called without an active
    exception``, exit code -6: Arrow issue #34314): a command that had printed its whole answer
    would report a crash to the shell. Nothing is left to clean up here, so the output is
    flushed and the process ends."""
    logging.shutdown()
    console.file.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
