"""``epochal run``: one sequencer and N worker processes, kept alive as one cluster.

A failed worker or sequencer triggers a cluster-wide rollback (docs/concepts.md): every worker is
killed, the generation goes up, and all workers start again; they load the latest snapshot,
replay the command log after it and produce egress only past what each partition already
committed. Frames and replies carry the generation, so a zombie of the old generation is
ignored, and the stable transactional ids fence its Kafka producers. A restarted sequencer
resumes from the command log's tail (or from the latest snapshot, when retention left no epoch).
In weak recovery the sequencer restarts with every rollback: it re-sequences the input from the
snapshot the workers resumed from. Every child runs with ``PYTHONHASHSEED=0``.

A failure is detected within ``failure_timeout_ms`` (plus a watch interval) in three ways:

- a child process exits;
- a process leaves the cluster's Kafka group (:mod:`epochal.log.membership`) - crashed, stopped,
  hung (its loop stopped polling) or cut off - or never joins it within the start-up bound.
  This does not depend on being the processes' parent, so it carries over to workers on
  several hosts. A child process describes the group (:mod:`epochal.watch`: librdkafka's admin
  client can abort its process), so the supervisor outlives it;
- a worker loses a peer (a closed connection, a frame it cannot handle, a peer silent for the
  bound: :class:`~epochal.actors.transport.Peers`) and exits.

While the Kafka broker is away nothing can start again, so failures are held (one line when it
goes, one when it is back, ``epochal_broker_available`` 0 meanwhile) and rolled back once it
answers; an absence longer than the failure bound rolls every process back.

Rollbacks that follow each other quickly back off (:class:`RollbackBackoff`), and children die
with the supervisor (:func:`~epochal.actors.lifecycle.die_with_parent`): no orphan keeps
committing beside the next run; and a new run kills what an earlier run of its app left running
(a hung supervisor and its children), found through the status file and checked by title.
Something must restart a supervisor that dies: docs/operations.md.

The supervisor also decides the cluster's layout (partition count and split points,
:mod:`epochal.recovery.layouts`) before each generation that may change it: at the start, and
when the latest snapshot shows the partitions holding skewed shares of the actors, in a planned
rollback to split points learned from the snapshot's keys (checked as often as
:class:`~epochal.recovery.layouts.RebalanceSchedule` says). Either way the old layout's egress
is finished first (:func:`~epochal.actors.egress.prepare_egress`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import NoReturn

from msgspec.structs import replace as replace_struct

from epochal.actors.api import App, load_app
from epochal.actors.egress import layout_in_force, prepare_egress
from epochal.actors.layout import worker_cpus
from epochal.actors.lifecycle import (
    child_logging,
    collect_less,
    die_with_parent,
    kill_earlier,
    set_title,
    steady_heap,
    system_heap_for_arrow,
)
from epochal.actors.partitioning import KeyRanges
from epochal.actors.transport import TransportError
from epochal.cluster_plan import ClusterPlan
from epochal.config import (
    WorkerConfig,
)
from epochal.deploy import check_deploy
from epochal.errors import BrokerUnavailableError, ConfigError, LogError, RecoveryError
from epochal.log.amendments import ensure_amendments_topic
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog
from epochal.log.egress import ensure_positions_topic, read_egress_state
from epochal.log.membership import (
    GroupMember,
    GroupView,
    LoopPulse,
    Lost,
    MemberName,
    MemberWatch,
    PollingThread,
    Role,
)
from epochal.log.sequencer_report import SequencerReport
from epochal.log.status import ProcessIdentity, StatusPublisher, ensure_status_topic
from epochal.log.topics import TopicNames
from epochal.metrics import Metrics, serve_metrics
from epochal.poison import Cause, CrashLoop, FailedAt, crash_loop_line, failed_worker_file
from epochal.recovery.layouts import (
    LayoutChoice,
    LayoutSource,
    RebalanceSchedule,
    choose_layout,
    log_layout,
    skew_of,
)
from epochal.recovery.schema_evolution import check_schemas
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.snapshots import Manifest
from epochal.schemas.status import ProcessState, SupervisorStatus
from epochal.stop import StopRecord, stop_file, write_stop
from epochal.watch import BrokerOutage, GroupWatch, OutageChange

__all__ = ["CHILD_PRELOAD", "RollbackBackoff", "Supervisor"]

logger = logging.getLogger(__name__)
_TICK_S = 0.1
EXIT_UNRECOVERABLE = 3  # a child's exit code: restarting cannot help (see _exit_if_unrecoverable)
EXIT_HUNG = 4  # a worker's exit code: one of its handlers hung (see _worker_main)


class RollbackBackoff:
    """How long to wait before a rollback: nothing after a quiet period, then doubling.

    A failure within ``reset_after_s`` of the previous rollback waits ``initial_s``, the next
    twice that, up to ``max_s``: a cluster that keeps failing (a poisoned input, a broker that
    refuses it) does not spin, and one that fails rarely recovers at once.

    >>> backoff = RollbackBackoff(initial_s=0.5, max_s=30.0, reset_after_s=60.0)
    >>> [backoff.delay(now) for now in (0.0, 1.0, 2.5, 100.0)]
    [0.0, 0.5, 1.0, 0.0]
    """

    def __init__(self, initial_s: float, max_s: float, reset_after_s: float) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.reset_after_s = reset_after_s
        self.streak = 0  # failures in a row, each within reset_after_s of the last rollback
        self._last_rollback: float | None = None

    def delay(self, now: float) -> float:
        """The wait before the rollback of a failure detected at ``now``."""
        quiet = self._last_rollback is None or now - self._last_rollback >= self.reset_after_s
        self.streak = 0 if quiet else self.streak + 1
        wait = 0.0 if self.streak == 0 else min(self.initial_s * 2 ** (self.streak - 1), self.max_s)
        self._last_rollback = now + wait
        return wait


class _Stop:
    """A flag set by SIGTERM (and SIGINT in the supervisor); children ignore SIGINT."""

    def __init__(self, handle_sigint: bool) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set if handle_sigint else signal.SIG_IGN)

    def _set(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def __call__(self) -> bool:
        return self.stopping


def _unrecoverable_file(config: ClusterPlan, app: str) -> Path:
    """Where a child that cannot go on writes why, for the supervisor's last line."""
    return config.run_dir / app / "unrecoverable.txt"


@contextlib.contextmanager
def _child_failures(role: str, record: Path, stop: _Stop) -> Iterator[None]:
    """How a child ends on a failure that is not a bug, in one log line, no traceback.

    A truncated log, a log of other code, a wrong configuration, a port taken: no restart can
    help, so the child writes why to ``record`` and exits with :data:`EXIT_UNRECOVERABLE`, and
    the supervisor stops instead of looping. The file, not only the exit code, tells the
    supervisor: the child leaves the cluster's group before it exits, and a supervisor that acts
    on the group first kills it, exit code and all. Kafka gone, or a peer lost: the supervisor
    rolls back (once the broker answers), so the child says what happened and exits 1; while
    stopping, that is just how the stop reached it."""
    try:
        yield
    except (RecoveryError, ConfigError) as exc:
        logger.error("%s cannot go on: %s", role, exc)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(f"{role} cannot go on: {exc}")
        sys.exit(EXIT_UNRECOVERABLE)
    except (LogError, TransportError) as exc:
        if stop():  # workers stop each at its own epoch: one may go while another still waits
            logger.info("%s stopped as the cluster did: %s", role, exc)
            return
        logger.error("%s stops: %s", role, exc)
        sys.exit(1)


def _snapshots(config: ClusterPlan, app: App) -> DeltaSnapshots | None:
    """Snapshots in Delta Lake under the configured warehouse, or none."""
    if config.snapshots is None:
        return None
    clients = KafkaClients(config.kafka)
    return DeltaSnapshots(app, config.snapshots, config.worker.partitions, clients)


def _sequencer_main(config: ClusterPlan, name: MemberName, parent: int) -> None:
    """The sequencer process: its loop beats a pulse, and while it does, it stays a member."""
    from epochal.log.sequencer import Sequencer

    die_with_parent(parent)
    stop = _Stop(handle_sigint=False)
    child_logging()
    app = load_app(config.app_spec, config.app_name)
    set_title(f"epochal: sequencer of {app.name}")
    clients = KafkaClients(config.kafka)
    inputs = app.input_topics()
    snapshots = _snapshots(config, app)
    latest = snapshots.latest if snapshots else lambda: None
    sequencer = Sequencer(
        config.sequencer, clients, app, inputs, app.code_hash(), latest_snapshot=latest,
        final_epoch=True, egress_format=app.egress_codec.format,
    )  # fmt: skip
    bound_ms = config.failure.failure_timeout_ms
    pulse = LoopPulse(bound_ms / 1000, config.failure.startup_timeout_ms / 1000, time.monotonic())
    member = GroupMember(clients, app.name, name, bound_ms, app.topics.command_log)
    membership = PollingThread(member, lambda: pulse.alive(time.monotonic()))
    membership.start()

    def should_stop() -> bool:
        pulse.beat(time.monotonic())
        return stop()

    report = SequencerReport(sequencer, name.run)
    status = StatusPublisher(clients, app.name, report)
    status.start()
    collect_less()
    stopped = False
    try:
        with _child_failures("sequencer", _unrecoverable_file(config, app.name), stop):
            sequencer.run(should_stop)
            stopped = True
    finally:
        membership.stop()
        status.stop(report(ProcessState.STOPPED) if stopped else None)


def _worker_main(config: ClusterPlan, worker: WorkerConfig, parent: int) -> None:
    from epochal.actors.worker import Worker

    die_with_parent(parent)
    set_title(f"epochal: worker {worker.worker} of {worker.app} (generation {worker.generation})")
    stop = _Stop(handle_sigint=False)
    child_logging()
    app = load_app(config.app_spec, config.app_name)
    from epochal.actors.context import CRASHED_AT
    from epochal.actors.snapshot_process import ForkedSnapshots, snapshots_beside
    from epochal.actors.snapshots import Snapshots
    from epochal.actors.watchdog import Hang, HangWatch

    record = failed_worker_file(config.run_dir, app.name, worker.worker)

    def hung(hang: Hang) -> NoReturn:
        """The watchdog's line is logged: say where, for the next generation, and go."""
        try:
            failed = FailedAt.of(hang.invocation, worker.generation, worker.worker, Cause.HANG)
            failed.write(record)
        except OSError as exc:  # the line above still names it
            logger.error("cannot record the hung transaction in %s: %s", record, exc)
        finally:
            logging.shutdown()  # flushes every handler
            sys.stderr.flush()
            os._exit(EXIT_HUNG)

    snapshots: Snapshots | None = _snapshots(config, app)
    if snapshots is not None:  # before Kafka clients start threads
        system_heap_for_arrow()
        title = f"epochal: snapshots of worker {worker.worker} of {app.name}"
        snapshots = snapshots_beside(snapshots, f"{title} (generation {worker.generation})", app)
    steady_heap()  # after the fork: the snapshot process keeps glibc's own threshold
    watch = HangWatch(config.failure.hang_bound_ms, hung)
    watch.start()
    try:
        with _child_failures(
            f"worker {worker.worker}", _unrecoverable_file(config, app.name), stop
        ):
            Worker(app, worker, config.kafka, snapshots).run(stop)
    finally:
        watch.stop()
        if CRASHED_AT:  # a handler stopped this worker: where, for the next generation
            failed = FailedAt.of(CRASHED_AT[0], worker.generation, worker.worker, Cause.CRASH)
            failed.write(record)
        if isinstance(snapshots, ForkedSnapshots):
            snapshots.close()


def _frozen(processes: list[BaseProcess], indexes: list[int]) -> str:
    """Which of these workers the system holds stopped (SIGSTOP, a debugger): the one that kept
    the others waiting, said as `` (worker 1 is stopped by a signal)``, or nothing."""
    stopped = []
    for index, process in zip(indexes, processes, strict=True):
        try:
            stat = Path(f"/proc/{process.pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] in ("T", "t"):
            stopped.append(index)
    if not stopped:
        return ""
    if len(stopped) == 1:
        return f" (worker {stopped[0]} is stopped by a signal)"
    return f" (workers {', '.join(str(w) for w in stopped)} are stopped by a signal)"


CHILD_PRELOAD = ("epochal.supervisor", "epochal.actors.worker", "pyarrow.dataset")
"""What the fork server imports once for every child: the engine, and what a worker's first
snapshot read imports (delta-rs reads through ``pyarrow.dataset``, which brings pandas: 0.15 s
of every rollback, imported by each new worker)."""


def _children_context() -> multiprocessing.context.ForkServerContext:
    """Workers and the sequencer fork from a server that imported the engine once, so each
    starts in milliseconds: a fresh interpreter and its imports took most of a second of every
    rollback and start. The server exits with the supervisor, and its children with it."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(CHILD_PRELOAD))
    return context


class Supervisor:
    """Runs and watches the cluster until SIGTERM or SIGINT."""

    def __init__(self, config: ClusterPlan) -> None:
        self.config = config
        self.context = _children_context()
        self.app_name = config.app_name or load_app(config.app_spec).name
        self.run_id = secrets.token_hex(3)  # tells this run's group members from an earlier run's
        self.generation = 0
        self.sequencer: BaseProcess | None = None
        self.sequencer_name = MemberName(self.run_id, Role.SEQUENCER, 0, 0)
        self.workers: list[BaseProcess] = []
        failure = config.failure
        self.watch = MemberWatch(failure.startup_timeout_ms / 1000)
        self.backoff = RollbackBackoff(failure.backoff_initial_ms / 1000,
                                       failure.backoff_max_ms / 1000,
                                       failure.backoff_reset_ms / 1000)  # fmt: skip
        self.status_file = config.run_dir / self.app_name / "processes.json"
        self.rebalancer = RebalanceSchedule(config.rebalance, time.monotonic())
        self.layout: KeyRanges | None = None  # set before the first generation starts
        self.snapshot_before = -1  # the epoch a handler stopped the last generation at
        self.crash_loop = CrashLoop()
        interval_s = failure.watch_interval_ms / 1000
        self.group = GroupWatch(
            multiprocessing.get_context("spawn"), config.kafka, self.app_name, interval_s
        )
        self.outage = BrokerOutage()
        self._held: dict[MemberName, Lost] = {}  # failures seen while the broker is away
        self.metrics = Metrics(app=self.app_name, role="supervisor")
        available = "1 while the Kafka broker answers, 0 while it is away"
        self.metrics.describe("epochal_broker_available", "gauge", available)
        self.metrics.describe("epochal_generation", "gauge", "the cluster's generation")
        self.metrics.set("epochal_broker_available", 1.0)
        self.rollbacks = 0  # failures rolled back in this run (a rebalance is not one)
        self._ready = 0  # the last generation said to be ready
        self.identity = ProcessIdentity()  # its host and start, for its status records
        self.status: StatusPublisher | None = None  # once the topics exist

    def run(self) -> int:
        """Run the cluster until SIGTERM or SIGINT (from the main thread: it takes both
        signals); the exit code, 0 for a stop at a savepoint."""
        worker = self.config.worker
        logger.info(
            "running %s as %r: %d worker%s, %d partitions, Kafka at %s (Ctrl-C or SIGTERM stops)",
            self.config.app_spec, self.app_name, worker.workers, "s" * (worker.workers != 1),
            worker.partitions, self.config.kafka.bootstrap_servers,
        )  # fmt: skip
        set_title(f"epochal: supervisor of {self.app_name}")
        os.environ["PYTHONHASHSEED"] = "0"  # inherited by every child and the fork server
        stop = _Stop(handle_sigint=True)
        self._replace_earlier_run()
        _unrecoverable_file(self.config, self.app_name).unlink(missing_ok=True)  # an old run's
        stop_file(self.config.run_dir, self.app_name).unlink(missing_ok=True)
        self._ensure_topics()
        if self.config.metrics_port:
            serve_metrics(self.metrics, self.config.metrics_port, "the supervisor")
        self.status = StatusPublisher(KafkaClients(self.config.kafka), self.app_name, self._report)
        self.status.start()
        self.group.start()
        self.generation = 1
        self._start_sequencer()
        self._start_workers()
        try:
            while not stop():
                time.sleep(_TICK_S)
                lost = self._lost()
                if not lost and self._ready < self.generation and self.watch.all_seen():
                    self._say_ready()
                if lost and not stop():
                    self._roll_back(lost, stop)
                elif not stop() and not self.outage.away and self.rebalancer.due(time.monotonic()):
                    choice = self._rebalance_choice()
                    if choice is not None:
                        self._rebalance(choice, stop)
            deadline = time.monotonic() + self.config.failure.stop_timeout_ms / 1000
            self._stop_at_savepoint(deadline)
            # what is left gets what remains of the bound, then is killed: a frozen worker
            # ignores SIGTERM, and waiting longer for it would stretch the bound
            left_s = max(0.0, deadline - time.monotonic())
            self._stop([*self.workers, *([self.sequencer] if self.sequencer else [])], left_s)
        finally:
            self._stop([*self.workers, *([self.sequencer] if self.sequencer else [])])
            self.group.stop()
            if self.status is not None:
                self.status.stop(self._report(ProcessState.STOPPED))
        return 0

    def _say_ready(self) -> None:
        """One line once every process of a generation has joined: where to query, scrape
        and look."""
        self._ready = self.generation
        worker = self.config.worker
        ports = (
            [worker.metrics_port + w for w in range(worker.workers)] if worker.metrics_port else []
        )
        ports += [p for p in (self.config.sequencer.metrics_port, self.config.metrics_port) if p]
        metrics = ",".join(f"127.0.0.1:{port}" for port in ports) or "off"
        queries = ",".join(worker.query) or "off"
        logger.info(
            "ready app=%s generation=%d workers=%d queries=%s metrics=%s (epochal status %s)",
            self.app_name,
            self.generation,
            worker.workers,
            queries,
            metrics,
            self.app_name,
        )

    def _stop_at_savepoint(self, deadline: float) -> None:
        """A clean stop: the sequencer logs a final epoch and exits; the workers run it, commit
        its snapshot and egress, and exit, so a start after it (of any code) replays nothing.
        Bounded by ``stop_timeout_ms`` (``deadline``); what is left then is killed, and the stop
        says so."""
        timeout_s = self.config.failure.stop_timeout_ms / 1000
        sequencer = self.sequencer
        if sequencer is None or not sequencer.is_alive():
            self._not_a_savepoint("the sequencer was not running")
            return
        log_end = self._log_end()
        sequencer.terminate()  # it logs the final epoch, then exits
        sequencer.join(max(0.0, deadline - time.monotonic()))
        if sequencer.exitcode != 0 and not self._final_epoch_after(log_end):
            if sequencer.exitcode is None:
                self._not_a_savepoint(
                    f"the sequencer did not log a final epoch within {timeout_s:g} s"
                )
            else:  # killed by the stop itself, say, before it could take the signal
                self._not_a_savepoint(
                    f"the sequencer ended (exit code {sequencer.exitcode}) before it logged a "
                    "final epoch"
                )
            return
        for worker in self.workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        late = [w for w, process in enumerate(self.workers) if process.exitcode is None]
        failed = [w for w, process in enumerate(self.workers) if process.exitcode not in (0, None)]
        if late or failed:
            why = f"workers {failed} failed before the final epoch's snapshot" if failed else ""
            if late:
                why = f"workers {late} did not end on the final epoch within {timeout_s:g} s"
                why += _frozen([self.workers[w] for w in late], late)
            self._not_a_savepoint(why)
            return
        if self.config.snapshots is None:
            logger.warning("stopped cleanly; no snapshots: a start replays the command log")
            self._record_stop(StopRecord(False, None, "the app takes no snapshots"))
            return
        manifest = self._latest_snapshot()
        if manifest is not None:
            logger.warning(
                "stopped at a savepoint ssid=%d: a start after it replays nothing", manifest.ssid
            )
            self._record_stop(StopRecord(True, manifest.ssid))

    def _log_end(self) -> int | None:
        """The command log's end before a stop (None in weak mode, which has no log)."""
        if self.config.sequencer.recovery == "weak":
            return None
        with contextlib.suppress(LogError, BrokerUnavailableError):
            return KafkaClients(self.config.kafka).end_offset(TopicNames(self.app_name).command_log)
        return None

    def _final_epoch_after(self, log_end: int | None) -> bool:
        """Whether the command log holds a final epoch logged after ``log_end``: a sequencer
        that logged it may still be leaving the Kafka group when the stop's bound ends (a
        frozen member slows that), and the workers can end on it all the same."""
        if log_end is None:
            return False
        command_log = KafkaCommandLog(
            KafkaClients(self.config.kafka), TopicNames(self.app_name).command_log
        )
        with contextlib.suppress(LogError, BrokerUnavailableError):
            last = command_log.last_epoch(timeout_s=5.0)
            return last is not None and last.record.final and last.position >= log_end
        return False

    def _not_a_savepoint(self, why: str) -> None:
        manifest = self._latest_snapshot()
        resumes = f"ssid={manifest.ssid}" if manifest else "the command log's start"
        logger.warning(
            "the stop is not a savepoint: %s; the next start resumes from %s and replays the "
            "epochs after it", why, resumes,
        )  # fmt: skip
        self._record_stop(StopRecord(False, manifest.ssid if manifest else None, why))

    def _latest_snapshot(self) -> Manifest | None:
        snapshots = _snapshots(self.config, load_app(self.config.app_spec, self.app_name))
        return snapshots.latest() if snapshots is not None else None

    def _record_stop(self, record: StopRecord) -> None:
        """For ``epochal stop``, which reports how the stop ended."""
        write_stop(self.config.run_dir, self.app_name, record)

    def _lost(self) -> list[Lost]:
        """Members that failed: exited processes, then what the group says, and every member
        after the broker was away for longer than the failure bound. While the broker is away
        failures are held, not rolled back: a new generation could not start without it."""
        away = self.outage.away
        lost = self._exited(restartable_only=not away)
        now = time.monotonic()
        for view in self._views():
            change = self.outage.observe(view.state, now)
            if change is not None:
                lost += self._broker_changed(change)
            elif not self.outage.away:
                lost += self.watch.judge(view, now)
        for failure in lost:
            self._held.setdefault(failure.name, failure)  # each member once, its first reason
        if self.outage.away:
            return []
        lost, self._held = list(self._held.values()), {}
        return lost

    def _members(self) -> list[tuple[MemberName, BaseProcess]]:
        workers = [
            (MemberName(self.run_id, Role.WORKER, w, self.generation), process)
            for w, process in enumerate(self.workers)
        ]
        return [*([(self.sequencer_name, self.sequencer)] if self.sequencer else []), *workers]

    def _exited(self, restartable_only: bool) -> list[Lost]:
        """Children that exited; with ``restartable_only``, one that says no restart can help
        stops the cluster (while the broker is away, that may be the outage speaking)."""
        self._stop_if_unrecoverable(restartable_only)
        lost = []
        for name, process in self._members():
            if process.exitcode is None:
                continue
            if process.exitcode == EXIT_UNRECOVERABLE and restartable_only:
                raise RecoveryError(
                    f"the {name.role} {name.index} cannot go on and restarting would not help "
                    "(its log above says why); the cluster stops", app=self.app_name,
                )  # fmt: skip
            hung = " (a handler hung)" if process.exitcode == EXIT_HUNG else ""
            lost.append(Lost(name, f"exited code={process.exitcode}{hung}"))
        return lost

    def _stop_if_unrecoverable(self, restartable_only: bool) -> None:
        """A child that wrote why it cannot go on ends the run, its reason the last line; one
        that wrote it while the broker was away is restarted instead (the next generation says
        it again if the outage was not the cause)."""
        record = _unrecoverable_file(self.config, self.app_name)
        if not record.exists():
            return
        if not restartable_only:
            record.unlink(missing_ok=True)
            return
        raise RecoveryError(f"{record.read_text()} (restarting would not help; the cluster stops)")

    def _views(self) -> list[GroupView]:
        watch_pid = self.group.pid
        views = self.group.views()
        if self.group.pid != watch_pid:
            self._write_status()  # a new watch process
        return views

    def _broker_changed(self, change: OutageChange) -> list[Lost]:
        """One line when the broker goes, one when it is back; after an absence longer than the
        failure bound every member is failed (their group sessions, transactions and peer links
        have timed out meanwhile): the rollback resumes from the last snapshot and the logs."""
        self.metrics.set("epochal_broker_available", 1.0 if change.reachable else 0.0)
        bootstrap = self.config.kafka.bootstrap_servers
        if not change.reachable:
            since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            waiting = "waiting (no rollback until it is back)"
            logger.warning(
                "Kafka broker unreachable bootstrap=%s since %s; %s", bootstrap, since, waiting
            )
            return []
        logger.warning(
            "Kafka broker reachable again after %.1f s bootstrap=%s", change.away_s, bootstrap
        )
        if change.away_s * 1000 < self.config.failure.failure_timeout_ms:
            return []
        reason = f"the Kafka broker was away {change.away_s:.1f} s, longer than the failure bound"
        return [Lost(name, reason) for name, _ in self._members()]

    def _roll_back(self, lost: list[Lost], stop: _Stop) -> None:
        """Every worker stops and starts again in a new generation (and the sequencer, if it
        failed); state is rebuilt by replay, and the stable transactional ids fence whatever
        the old generation still had open. A failed process may be stopped or hung, not dead:
        it is killed before anything starts again."""
        for failure in lost:
            logger.warning(
                "failure detected role=%s index=%d generation=%d reason=%s",
                failure.name.role,
                failure.name.index,
                failure.name.generation,
                failure.reason,
            )
        weak = self.config.sequencer.recovery == "weak"  # the input is re-sequenced: always
        restart_sequencer = weak or any(failure.name.role is Role.SEQUENCER for failure in lost)
        self._kill(
            [*self.workers, *([self.sequencer] if restart_sequencer and self.sequencer else [])]
        )
        # one the group reported gone may have said it cannot go on meanwhile
        self._stop_if_unrecoverable(restartable_only=not self.outage.away)
        delay = self.backoff.delay(time.monotonic())
        if delay:
            logger.warning(
                "rollback backs off delay_s=%.1f failures_in_a_row=%d",
                delay,
                self.backoff.streak + 1,
            )
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline and not stop():
                time.sleep(_TICK_S)
        if stop():
            return
        self._note_failed_epoch()
        self.generation += 1
        self.rollbacks += 1
        logger.warning(
            "rolling back generation=%d restart_sequencer=%s", self.generation, restart_sequencer
        )
        if restart_sequencer:
            self._start_sequencer()
        self._start_workers()

    def _note_failed_epoch(self) -> None:
        """If a handler stopped a worker of the generation rolled back, the next one snapshots
        the epoch before the failed one while replaying, and runs the failed one only after
        that snapshot committed: the last good state survives a crash loop, and a fixed version
        deployed later re-runs only what never released egress."""
        failed = []
        for worker in range(self.config.worker.workers):
            path = failed_worker_file(self.config.run_dir, self.app_name, worker)
            record = FailedAt.read(path)
            if record is not None and record.generation == self.generation:
                failed.append(replace_struct(record, worker=worker))
        for record, times in self.crash_loop.observe(failed):
            if times > 1:
                logger.warning("%s", crash_loop_line(record, times))
        if failed:
            self.snapshot_before = min(record.epoch for record in failed)
            logger.warning(
                "a handler stopped a worker at epoch=%d: the next generation keeps the state "
                "before it (a snapshot at epoch %d)",
                self.snapshot_before,
                self.snapshot_before - 1,
            )

    def _ensure_topics(self) -> None:
        from epochal.log.sequencer import Sequencer

        app = load_app(self.config.app_spec, self.config.app_name)
        inputs = app.input_topics()
        egress = sorted({h.aborts_to for h in app.handlers.values() if h.aborts_to})
        clients = KafkaClients(self.config.kafka)
        Sequencer(self.config.sequencer, clients, app, inputs, "").ensure_topics(
            self.config.input_partitions
        )
        clients.create_topics([app.topics.egress(name) for name in egress])
        clients.create_topics([app.topics.replies], partitions=1)  # client transactions' outcomes
        ensure_positions_topic(clients, app.name)
        ensure_amendments_topic(clients, app.name)
        ensure_status_topic(clients, app.name)
        snapshots = _snapshots(self.config, app)
        if snapshots is not None:
            check_schemas(app, snapshots.latest(), snapshots.states)
        if self.config.sequencer.recovery == "strong":  # weak mode logs no epochs to re-run
            check_deploy(app, clients, snapshots, self.config.worker.allow_code_change)
        current = layout_in_force(app, read_egress_state(clients, app.name, committed=False))
        choice = choose_layout(
            app, self.config.worker.partitions, current, snapshots, self.config.rebalance.skew
        )
        log_layout(choice, "start")
        self._apply_layout(app, clients, choice.ranges, snapshots)

    def _apply_layout(
        self, app: App, clients: KafkaClients, ranges: KeyRanges, snapshots: DeltaSnapshots | None
    ) -> None:
        """Make ``ranges`` the layout the next generation runs, the old one's egress finished
        first (no worker runs meanwhile)."""
        from rich.progress import Progress

        end = clients.end_offset(app.topics.command_log)
        with Progress(transient=True) as progress:  # shown only while a layout change replays
            task = progress.add_task("finishing the old egress layout: command log", total=end,
                                     visible=False)  # fmt: skip

            def on_epoch(position: int) -> None:
                progress.update(task, completed=position + 1, visible=True)

            prepare_egress(app, clients, ranges, snapshots, on_epoch=on_epoch)
        self.layout = ranges

    def _rebalance_choice(self) -> LayoutChoice | None:
        """A learned layout worth a planned rollback, judged from the latest snapshot; None
        if its partitions' shares are even enough (the keys are read only when they are not)."""
        if self.config.snapshots is None or self.layout is None:
            return None
        app = load_app(self.config.app_spec, self.config.app_name)
        snapshots = _snapshots(self.config, app)
        assert snapshots is not None
        manifests = snapshots.manifests()
        if not manifests or not self.rebalancer.fresh(manifests[-1].ssid):
            return None
        if skew_of(app, self.layout, manifests[-1], self.config.rebalance.skew) is None:
            return None
        choice = choose_layout(
            app, self.layout.partitions, self.layout, snapshots, self.config.rebalance.skew
        )
        self.rebalancer.slow_down(time.monotonic())
        if choice.source is not LayoutSource.LEARNED:
            logger.info(
                "partitions stay skewed, no layout materially better ssid=%d partition_actors=%s",
                choice.ssid,
                choice.before,
            )
            return None
        return choice

    def _rebalance(self, choice: LayoutChoice, stop: _Stop) -> None:
        """A planned rollback to a learned layout: the workers stop (and the sequencer, in weak
        mode, where it re-sequences from the snapshot), the old layout's egress is finished,
        and a new generation starts under the new one."""
        log_layout(choice, "rebalance")
        weak = self.config.sequencer.recovery == "weak"
        self._stop([*self.workers, *([self.sequencer] if weak and self.sequencer else [])])
        app = load_app(self.config.app_spec, self.config.app_name)
        clients = KafkaClients(self.config.kafka)
        snapshots = _snapshots(self.config, app)
        if not self._waiting_out_the_broker(
            lambda: self._apply_layout(app, clients, choice.ranges, snapshots), stop
        ):
            return  # stopped meanwhile: the next run finishes the layout change
        self.generation += 1
        logger.warning(
            "rolling back generation=%d restart_sequencer=%s reason=rebalance",
            self.generation,
            weak,
        )
        if weak:
            self._start_sequencer()
        self._start_workers()

    def _waiting_out_the_broker(self, work: Callable[[], None], stop: _Stop) -> bool:
        """Run ``work`` (the supervisor's own Kafka calls, with no process running), again
        until the broker answers: one line when it does not, one when it does; False if told to
        stop first. ``work`` must be safe to repeat (finishing a layout is)."""
        away_since: float | None = None
        while not stop():
            try:
                work()
            except BrokerUnavailableError as exc:
                if away_since is None:
                    away_since = time.monotonic()
                    self.metrics.set("epochal_broker_available", 0.0)
                    logger.warning("Kafka broker unreachable; waiting: %s", exc)
                time.sleep(1.0)
                continue
            if away_since is not None:
                self.metrics.set("epochal_broker_available", 1.0)
                away_s = time.monotonic() - away_since
                logger.warning("Kafka broker reachable again after %.1f s", away_s)
            return True
        return False

    def _start_sequencer(self) -> None:
        self.sequencer_name = MemberName(self.run_id, Role.SEQUENCER, 0, self.generation)
        config = replace(self.config, sequencer=replace(self.config.sequencer,
                                                        generation=self.generation))  # fmt: skip
        self.sequencer = self.context.Process(
            target=_sequencer_main,
            args=(config, self.sequencer_name, os.getpid()),
            name="epochal-sequencer",
        )
        self.sequencer.start()
        self.watch.expect(self.sequencer_name, time.monotonic())
        self._write_status()

    def _start_workers(self) -> None:
        template = replace(
            self.config.worker,
            run_id=self.run_id,
            failure_timeout_ms=self.config.failure.failure_timeout_ms,
            allow_code_change=False,  # the start's check recorded what runs under this code
            snapshot_before=self.snapshot_before,
        )
        cpus = worker_cpus(template.workers) if self.config.pin_cpus else [None] * template.workers
        self.workers = []
        for w in range(template.workers):
            config = replace(template, worker=w, generation=self.generation, cpu=cpus[w])
            process = self.context.Process(
                target=_worker_main,
                args=(self.config, config, os.getpid()),
                name=f"epochal-worker-{w}",
            )
            process.start()
            self.workers.append(process)
            self.watch.expect(
                MemberName(self.run_id, Role.WORKER, w, self.generation), time.monotonic()
            )
        self.watch.retain(Role.WORKER, template.workers)
        logger.info("workers started generation=%d count=%d", self.generation, len(self.workers))
        self._write_status()

    def _replace_earlier_run(self) -> None:
        """Kill what an earlier run of this app left running (its status file names them; a
        hung supervisor keeps its children alive), supervisor first: two runs of one app would
        roll each other back for ever."""
        try:
            earlier = json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return
        pids = [earlier.get(role) for role in ("supervisor", "sequencer", "watch")]
        pids += earlier.get("workers") or []
        killed = kill_earlier([pid for pid in pids if isinstance(pid, int)], self.app_name)
        if killed:
            what = f"app={self.app_name}: killed its processes pids={killed}"
            logger.warning("replaced an earlier run of %s (run_id=%s)", what, earlier.get("run_id"))

    def _write_status(self) -> None:
        """Pids and generation, for operators (and tests that kill processes on purpose)."""
        self.metrics.set("epochal_generation", self.generation)
        self.status_file.parent.mkdir(parents=True, exist_ok=True)
        status = {
            "supervisor": os.getpid(),
            "run_id": self.run_id,
            "generation": self.generation,
            "sequencer": self.sequencer.pid if self.sequencer else None,
            "workers": [w.pid for w in self.workers],
            "watch": self.group.pid,
        }
        temporary = self.status_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(status))
        temporary.replace(self.status_file)

    def _report(self, state: ProcessState = ProcessState.RUNNING) -> SupervisorStatus:
        """The supervisor's status record (written every second from a thread, ``log/status.py``):
        the cluster's shape, rollbacks so far and the children's pids."""
        config = self.config
        port = config.metrics_port
        sequencer = self.sequencer
        return SupervisorStatus(
            **self.identity.fields(self.run_id, self.generation, state),
            workers=config.worker.workers,
            partitions=self.layout.partitions if self.layout else config.worker.partitions,
            recovery=config.sequencer.recovery,
            rollbacks=self.rollbacks,
            sequencer_pid=sequencer.pid if sequencer is not None else None,
            worker_pids=tuple(w.pid or 0 for w in list(self.workers)),
            metrics=f"127.0.0.1:{port}" if port else "",
        )

    @staticmethod
    def _kill(processes: list[BaseProcess]) -> None:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join()

    @staticmethod
    def _stop(processes: list[BaseProcess], timeout_s: float = 15.0) -> None:
        for process in processes:
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + timeout_s
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
