"""``epochal run``: one sequencer and N worker processes, kept alive as one cluster.

A dead worker or sequencer triggers a cluster-wide rollback (DESIGN §2.9): every worker is
killed, the generation goes up, and all workers start again; they rebuild state by replaying the
command log and produce egress only past what each partition already committed. Frames and
replies carry the generation, so a zombie of the old generation is ignored, and the stable
transactional ids fence its Kafka producers. A restarted sequencer resumes from its committed
input offsets and the command log's tail. (In strong mode the workers could keep going through a
sequencer restart; weak recovery re-sequences the input, which is why the rule is uniform.)
Every child runs with ``PYTHONHASHSEED=0``.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from epochal.actors.api import load_app
from epochal.actors.layout import worker_cpus
from epochal.config import KafkaConfig, SequencerConfig, WorkerConfig

__all__ = ["ClusterConfig", "Supervisor"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterConfig:
    """Everything ``epochal run`` needs; ``app_name`` renames the app (its topics and ids)."""

    app_spec: str
    kafka: KafkaConfig
    sequencer: SequencerConfig
    worker: WorkerConfig
    app_name: str | None = None
    input_partitions: int = 1
    run_dir: Path = Path(".epochal/run")
    pin_cpus: bool = True


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


def _sequencer_main(config: ClusterConfig) -> None:
    from epochal.log.client import KafkaClients
    from epochal.log.sequencer import Sequencer

    stop = _Stop(handle_sigint=False)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = load_app(config.app_spec, config.app_name)
    inputs = sorted({h.topic for h in app.handlers.values() if h.topic})
    sequencer = Sequencer(
        config.sequencer, KafkaClients(config.kafka), app, inputs, app.code_hash()
    )
    sequencer.run(stop)


def _worker_main(config: ClusterConfig, worker: WorkerConfig) -> None:
    from epochal.actors.worker import Worker

    stop = _Stop(handle_sigint=False)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = load_app(config.app_spec, config.app_name)
    Worker(app, worker, config.kafka).run(stop)


class Supervisor:
    """Runs and watches the cluster until SIGTERM or SIGINT."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.context = multiprocessing.get_context("spawn")
        self.generation = 0
        self.sequencer: BaseProcess | None = None
        self.workers: list[BaseProcess] = []
        app_name = config.app_name or load_app(config.app_spec).name
        self.status_file = config.run_dir / app_name / "processes.json"

    def run(self) -> int:
        os.environ["PYTHONHASHSEED"] = "0"  # inherited by every spawned child
        stop = _Stop(handle_sigint=True)
        self._ensure_topics()
        self._start_sequencer()
        self._start_workers()
        try:
            while not stop():
                time.sleep(0.1)
                sequencer_died = self.sequencer is not None and not self.sequencer.is_alive()
                dead = [w for w in self.workers if not w.is_alive()]
                if (sequencer_died or dead) and not stop():
                    role = (
                        "sequencer" if sequencer_died else f"worker {self.workers.index(dead[0])}"
                    )
                    logger.warning("%s exited; rolling the cluster back", role)
                    self._rollback(restart_sequencer=sequencer_died)
        finally:
            self._stop([*self.workers, *([self.sequencer] if self.sequencer else [])])
        return 0

    def _rollback(self, restart_sequencer: bool) -> None:
        """Every worker stops and starts again in a new generation; state is rebuilt by replay,
        and the stable transactional ids fence whatever the old generation still had open."""
        self._kill(self.workers)
        if restart_sequencer:
            self._start_sequencer()
        self._start_workers()

    def _ensure_topics(self) -> None:
        from epochal.log.client import KafkaClients
        from epochal.log.sequencer import Sequencer

        app = load_app(self.config.app_spec, self.config.app_name)
        inputs = sorted({h.topic for h in app.handlers.values() if h.topic})
        egress = sorted({h.aborts_to for h in app.handlers.values() if h.aborts_to})
        clients = KafkaClients(self.config.kafka)
        Sequencer(self.config.sequencer, clients, app, inputs, "").ensure_topics(
            self.config.input_partitions
        )
        clients.create_topics([app.topics.egress(name) for name in egress])

    def _start_sequencer(self) -> None:
        self.sequencer = self.context.Process(
            target=_sequencer_main, args=(self.config,), name="epochal-sequencer"
        )
        self.sequencer.start()
        self._write_status()

    def _start_workers(self) -> None:
        self.generation += 1
        template = self.config.worker
        cpus = worker_cpus(template.workers) if self.config.pin_cpus else [None] * template.workers
        self.workers = []
        for w in range(template.workers):
            config = replace(template, worker=w, generation=self.generation, cpu=cpus[w])
            process = self.context.Process(
                target=_worker_main, args=(self.config, config), name=f"epochal-worker-{w}"
            )
            process.start()
            self.workers.append(process)
        logger.info("workers started generation=%d count=%d", self.generation, len(self.workers))
        self._write_status()

    def _write_status(self) -> None:
        """Pids and generation, for operators (and tests that kill processes on purpose)."""
        self.status_file.parent.mkdir(parents=True, exist_ok=True)
        status = {
            "supervisor": os.getpid(),
            "generation": self.generation,
            "sequencer": self.sequencer.pid if self.sequencer else None,
            "workers": [w.pid for w in self.workers],
        }
        temporary = self.status_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(status))
        temporary.replace(self.status_file)

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
