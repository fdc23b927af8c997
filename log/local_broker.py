"""A single-node Apache Kafka broker (KRaft: broker and controller in one JVM) for development.

Runs the jars fetched from Maven Central, never a download at run time. The broker is detached
from the process that starts it (it outlives the CLI); its pid, config and log live in its data
directory, so ``status`` and ``stop`` work from any later process. One node means replication
factor and min ISR 1 for the offsets, transaction and share-state topics, or transactions fail.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from epochal.config import KafkaConfig, LocalBrokerConfig
from epochal.errors import BrokerUnavailableError, ConfigError, LocalBrokerError
from epochal.interrupts import interrupts_held
from epochal.jvm import JarSet, require_jars
from epochal.log.client import KafkaClients

__all__ = ["BrokerStatus", "LocalBroker", "PortHolder"]

logger = logging.getLogger(__name__)

_MAIN_CLASS = "kafka.Kafka"
_FORMAT_CLASS = "kafka.tools.StorageTool"
_JIT_FLAGS = ("-XX:TieredStopAtLevel=1",)
"""The JVM's quick compiler (C1) only. The optimising one (C2) spends seconds of CPU in the
broker's first minutes; on a small machine whose cores the broker shares with the app, that
warm-up doubled the app's p99 latency (bank, 1 worker, 17,000 transfers/s, the first two runs
on a fresh broker: 107-304 ms, against 68-159 with C1 only), and the code it makes did not pay
it back: drains of 400,000 transfers ran as fast either way."""
_GC_FLAGS = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:G1HeapRegionSize=4m")
"""G1 with regions of 4 MB, and the whole heap from the start (``-Xms`` = ``-Xmx``): Kafka's
operations guide gives both in its typical arguments (16 MB regions for a 6 GB heap). In the
1 MB regions G1 picks for a 1 GB heap, an object of 512 KB or more is humongous, and a produce
request of a command-log chunk (512 KB) or a full batch is one: each started a concurrent
marking cycle once the heap (grown from 256 MB) was 45 % full, so a drain of 1,000,000
transfers started one at nearly every young collection, and in some runs marking took most of
a core (the broker 4.6-8.5 us of CPU a transfer instead of 2.5; 60-73k tx/s instead of 77-80k).
With these flags: no marking cycle during that drain, half the young collections."""

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = warn
logger.apache.name = org.apache.kafka
logger.apache.level = warn
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""


@dataclass(frozen=True)
class PortHolder:
    """What listens on a broker's port while that broker (of its data dir) does not run: another
    Kafka broker (``pid``; ``data_dir`` when it is a local broker like this one), or a process
    that cannot be named (both None)."""

    pid: int | None = None
    data_dir: Path | None = None


@dataclass(frozen=True)
class BrokerStatus:
    """What ``epochal kafka status`` reports; ``holder`` when not running but the port is taken."""

    running: bool
    bootstrap: str
    data_dir: Path
    pid: int | None = None
    holder: PortHolder | None = None

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _broker_on(port: int) -> PortHolder | None:
    """The Kafka broker whose config (the argument after its main class) listens on ``port``.

    A local broker keeps its config in its data dir beside its pid file: that dir is named."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            config = Path(argv[argv.index(_MAIN_CLASS) + 1])
            text = config.read_text()
        except (OSError, ValueError, IndexError):
            continue  # not a broker, gone meanwhile, or its config unreadable
        listeners = [line for line in text.splitlines() if line.startswith("listeners=")]
        ports = {
            entry.rsplit(":", 1)[-1].strip() for line in listeners for entry in line.split(",")
        }
        if str(port) in ports:
            local = (config.parent / "broker.pid").is_file()
            return PortHolder(int(proc.name), config.parent if local else None)
    return None


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ConfigError(
            "Java was not found (no JAVA_HOME, no `java` on PATH); install a JDK 17 or newer "
            "(e.g. `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME"
        )
    return found


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class LocalBroker:
    """Start, stop and inspect one local broker.

    >>> broker = LocalBroker(LocalBrokerConfig(port=19092, data_dir=Path("/tmp/kafka-19092")))
    >>> broker.start(); print(broker.status().bootstrap); broker.stop()
    """

    def __init__(self, config: LocalBrokerConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self._process: subprocess.Popen[bytes] | None = None  # set when this object started it

    @property
    def _pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def _properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    def status(self) -> BrokerStatus:
        pid = self._running_pid()
        holder = None
        if pid is None and not _port_is_free(self.config.port):
            holder = _broker_on(self.config.port) or PortHolder()
        return BrokerStatus(pid is not None, self.config.bootstrap, self.data_dir, pid, holder)

    def start(self) -> bool:
        """Start the broker and wait until it answers; False if it was already running."""
        if self._running_pid() is not None:
            return False
        jars = require_jars(self.config.jar_dir, JarSet.KAFKA_BROKER)
        java = _java()
        for port in (self.config.port, self.config.effective_controller_port):
            if not _port_is_free(port):
                raise LocalBrokerError(
                    f"port {port} on 127.0.0.1 is already in use by another process; stop it, "
                    "or choose other ports (--port; the controller uses port+1)",
                    port=port,
                )
        self._prepare(java, jars)
        try:  # interrupted (SIGTERM, Ctrl-C) while it starts: none left behind
            with interrupts_held():  # one inside Popen would leave a JVM nothing has the pid of
                process = self._process = self._launch(java, jars)
            self._wait_until_ready(process)
        except BaseException:
            if self._process is not None and self._process.poll() is None:
                self.stop()
            raise
        logger.info("broker started bootstrap=%s pid=%s", self.config.bootstrap, process.pid)
        return True

    def stop_if_launched(self) -> bool:
        """Stop the broker if this object started it: a run that found one running (or whose
        start failed) leaves that one be. For a ``finally`` around :meth:`start`: the process
        is known here from the moment it exists, whenever a SIGTERM lands."""
        return self._process is not None and self.stop()

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL) and wait for its ports; False if not running."""
        pid = self._running_pid() or self._launched_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        if not self._wait_for_exit(pid, timeout_s):
            logger.warning("broker ignored SIGTERM, killing pid=%s", pid)
            os.kill(pid, signal.SIGKILL)
            self._wait_for_exit(pid, 10.0)
        if self._process is not None and self._process.pid == pid:
            self._process.wait()  # reap our own child, so Popen knows it has ended
        self._process = None
        self._pid_file.unlink(missing_ok=True)
        deadline = time.monotonic() + timeout_s
        while not _port_is_free(self.config.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        logger.info("broker stopped bootstrap=%s", self.config.bootstrap)
        return True

    def kill(self) -> bool:
        """SIGKILL the broker, as a crash would (chaos trials, tests): no clean shutdown, the data
        directory as it was, for :meth:`start` to recover from. False if it was not running."""
        pid = self._running_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGKILL)
        self._wait_for_exit(pid, 10.0)
        if self._process is not None and self._process.pid == pid:
            self._process.wait()
        self._process = None
        self._pid_file.unlink(missing_ok=True)
        logger.info("broker killed bootstrap=%s pid=%s", self.config.bootstrap, pid)
        return True

    def _launched_pid(self) -> int | None:
        """The pid of the JVM this object launched while it still runs. ``Popen`` can return
        while the child is still inside ``exec`` (an empty ``/proc/<pid>/cmdline``, so
        :meth:`_running_pid` does not know it yet): a start interrupted then stops it by this."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    def _running_pid(self) -> int | None:
        """The pid in the pid file if that process is alive and is our broker."""
        try:
            pid = int(self._pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        mine = _MAIN_CLASS.encode() in cmdline and str(self._properties_file).encode() in cmdline
        return pid if mine else None

    def _prepare(self, java: str, jars: Path) -> None:
        """Write the config and, on first start only, format the storage."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)
        self._properties_file.write_text(self._server_properties())
        if (self.data_dir / "data" / "meta.properties").exists():
            return
        formatted = subprocess.run(
            [java, *_JIT_FLAGS, "-cp", f"{jars}/*", *self._log4j_flags(), _FORMAT_CLASS, "format",
             f"--cluster-id={_cluster_id()}", "-c", str(self._properties_file)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if formatted.returncode != 0:
            raise LocalBrokerError(
                f"formatting the broker's storage failed:\n{formatted.stdout}{formatted.stderr}",
                data_dir=str(self.data_dir),
            )

    def _server_properties(self) -> str:
        port, controller = self.config.port, self.config.effective_controller_port
        data = self.data_dir / "data"
        return "\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={data}",
            f"metadata.log.dir={data}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=4",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "group.min.session.timeout.ms=500",
            "",
        ])  # fmt: skip

    def _log4j_flags(self) -> list[str]:
        return [f"-Dlog4j2.configurationFile=file:{self.data_dir / 'log4j2.properties'}"]

    def _launch(self, java: str, jars: Path) -> subprocess.Popen[bytes]:
        heap = f"{self.config.heap_mb}m"
        command = [
            java, f"-Xms{heap}", f"-Xmx{heap}", *_GC_FLAGS, *_JIT_FLAGS,
            "-Djava.awt.headless=true", *self._log4j_flags(), "-cp", f"{jars}/*",
            _MAIN_CLASS, str(self._properties_file),
        ]  # fmt: skip
        with open(self.data_dir / "broker.log", "ab") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.data_dir,
            )  # fmt: skip
        self._pid_file.write_text(str(process.pid))
        return process

    def _wait_until_ready(self, process: subprocess.Popen[bytes]) -> None:
        clients = KafkaClients(KafkaConfig(self.config.bootstrap))
        deadline = time.monotonic() + self.config.startup_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self._pid_file.unlink(missing_ok=True)
                raise LocalBrokerError(
                    f"the broker exited with code {process.returncode} while starting; "
                    f"last lines of its log:\n{self._log_tail()}",
                    log=str(self.data_dir / "broker.log"),
                )
            try:
                clients.wait_until_ready(timeout_s=1.0)
                return
            except BrokerUnavailableError:
                time.sleep(0.2)
        process.kill()
        process.wait()
        self._pid_file.unlink(missing_ok=True)
        raise LocalBrokerError(
            f"the broker did not answer within {self.config.startup_timeout_s:.0f} s; "
            f"last lines of its log:\n{self._log_tail()}",
            log=str(self.data_dir / "broker.log"),
        )

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.data_dir / "broker.log").read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @staticmethod
    def _wait_for_exit(pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
            except OSError:
                return True  # gone
            if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                return True  # exited, waiting to be reaped by its parent
            time.sleep(0.1)
        return False
