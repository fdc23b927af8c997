"""Fixtures shared by every test: one Kafka broker and one Spark session per test run.

Kafka comes from ``EPOCHAL_KAFKA_BOOTSTRAP`` when set, else from a testcontainers Kafka when a
Docker engine answers, else from the local broker (``log/local_broker.py``) started once on free
ports in a temporary data directory and stopped at the end of the run.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from pyspark.sql import SparkSession

from epochal.config import (
    CacheConfig,
    KafkaConfig,
    LocalBrokerConfig,
    SparkConfig,
    cache_dir_from_env,
)
from epochal.jvm import JarSet, fetch_jars
from epochal.log.client import KafkaClients
from epochal.log.local_broker import LocalBroker

# Property tests share 2 cores with a broker, clusters and Spark: a per-example deadline would
# time the machine, not the code. Tests set their own example counts.
settings.register_profile("epochal", deadline=None)
settings.load_profile("epochal")


def free_ports(count: int) -> int:
    """A port p such that p .. p+count-1 are free on 127.0.0.1, below the kernel's ephemeral
    range: a port from that range can be taken meanwhile by any outgoing connection (a Kafka
    client's, say) before the worker that was given it binds it. Under xdist, each worker
    picks from a share of its own, so that two tests never pick the same port at once."""
    high = _ephemeral_low()
    low = max(1024, high - 12000)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    share = (high - low) // workers  # each xdist worker picks from its own share: no race
    low, high = low + worker * share, low + (worker + 1) * share
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(low, high - count)
        if all(port_is_free(port + offset) for offset in range(count)):
            return port
    raise RuntimeError(f"no {count} adjacent free ports on 127.0.0.1")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; macOS starts at 49152


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pair() -> int:
    """A port p such that p and p+1 are free (a broker and its controller, two workers)."""
    return free_ports(2)


def gone(pid: int) -> bool:
    """True once process ``pid`` has ended: no such process, or a zombie not reaped yet."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()  # "pid (title, spaces and all) state ..."
        return stat.rsplit(")", 1)[1].split()[0] == "Z"  # killed, not reaped yet
    except FileNotFoundError:
        return True  # reaped meanwhile


def _docker_answers() -> bool:
    """True if a Docker engine answers a ping.

    A plain connect comes first: docker-py leaks a socket (a ResourceWarning, an error here) when
    nothing listens on the engine's unix socket.
    """
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://"):
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(host.removeprefix("unix://"))
            except OSError:
                return False
    import docker

    try:
        client = docker.from_env()
    except Exception:  # no usable engine configuration
        return False
    try:
        return bool(client.ping())
    except Exception:  # something listens, but it is not an engine that answers
        return False
    finally:
        client.close()


@pytest.fixture(scope="session")
def cache() -> CacheConfig:
    """The jar cache, filled if needed (idempotent, offline once filled)."""
    config = CacheConfig(cache_dir_from_env())
    for jar_set in JarSet:
        fetch_jars(config, jar_set)
    return config


@pytest.fixture
def own_cache(tmp_path: Path, cache: CacheConfig) -> Iterator[CacheConfig]:
    """A cache of this test's own with the session's jars linked in: a SQL server that
    ``epochal sql`` starts in it is no other test's, and it is stopped at the end."""
    own = CacheConfig(tmp_path / "own-cache")
    own.root.mkdir()
    (own.root / "jars").symlink_to(cache.root / "jars")
    yield own
    epochal = str(Path(sys.executable).parent / "epochal")
    environment = {**os.environ, "EPOCHAL_CACHE": str(own.root)}
    stop = [epochal, "sql", "--stop-server"]
    subprocess.run(stop, env=environment, capture_output=True, timeout=60, check=False)


@pytest.fixture(scope="session")
def kafka_config(
    cache: CacheConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaConfig]:
    configured = os.environ.get("EPOCHAL_KAFKA_BOOTSTRAP")  # or the controller's, under xdist
    if configured:
        yield KafkaConfig(configured)
    else:
        with _broker(cache, tmp_path_factory.mktemp("kafka")) as config:
            yield config


@contextlib.contextmanager
def _broker(cache: CacheConfig, data_dir: Path) -> Iterator[KafkaConfig]:
    """A testcontainers Kafka when a Docker engine answers, else the local broker."""
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        container = (
            KafkaContainer("confluentinc/cp-kafka:7.9.0")
            .with_kraft()
            .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
            .with_env("KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS", "500")
        )
        with container:
            yield KafkaConfig(container.get_bootstrap_server())
        return
    broker = LocalBroker(
        LocalBrokerConfig(
            port=free_port_pair(),
            data_dir=data_dir,
            jar_dir=fetch_jars(cache, JarSet.KAFKA_BROKER),
            heap_mb=768,
        )
    )
    broker.start()
    try:
        yield KafkaConfig(broker.config.bootstrap)
    finally:
        broker.stop()


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist (``./dev test`` runs two workers), the controller starts the run's one broker
    before the workers start, and hands it to them as ``EPOCHAL_KAFKA_BOOTSTRAP``."""
    controller = not hasattr(config, "workerinput")
    if not controller or not config.getoption("numprocesses", None):
        return
    if os.environ.get("EPOCHAL_KAFKA_BOOTSTRAP"):
        return
    stack = contextlib.ExitStack()
    data_dir = Path(tempfile.mkdtemp(prefix="epochal-test-kafka-"))
    stack.callback(shutil.rmtree, data_dir, ignore_errors=True)
    broker = stack.enter_context(_broker(CacheConfig(cache_dir_from_env()), data_dir))
    os.environ["EPOCHAL_KAFKA_BOOTSTRAP"] = broker.bootstrap_servers
    config.stash[_BROKER] = stack


def pytest_unconfigure(config: pytest.Config) -> None:
    stack = config.stash.get(_BROKER, None)
    if stack is not None:
        os.environ.pop("EPOCHAL_KAFKA_BOOTSTRAP", None)
        stack.close()


_BROKER = pytest.StashKey[contextlib.ExitStack]()
SERIAL_GROUPS = {
    # their commands run as documented, on the default ports (7700, 9400, 19792, ...)
    "test_documented_commands.py": "default-ports",
    "test_schema_evolution.py": "default-ports",
    "test_deploys.py": "default-ports",
    "test_start_failures.py": "default-ports",
}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, tests that must not overlap each other run on one worker, in turn: those on
    the default ports, and those on the run's one Spark session (``spark``)."""
    for item in items:
        group = SERIAL_GROUPS.get(item.path.name)
        if group is None and "spark" in getattr(item, "fixturenames", ()):
            group = "spark"
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def kafka(kafka_config: KafkaConfig) -> KafkaClients:
    return KafkaClients(kafka_config)


@pytest.fixture
def topic_factory(kafka: KafkaClients, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Creates a topic whose name is unique to this test: ``topic_factory(partitions=3)``."""
    base = request.node.name.replace("[", "-").replace("]", "")[:80]

    def make(partitions: int = 1) -> str:
        name = f"t.{base}.{uuid.uuid4().hex[:8]}"
        kafka.create_topics([name], partitions=partitions)
        return name

    return make


@pytest.fixture(scope="session")
def spark(cache: CacheConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One ``local[2]`` Spark session with Delta and the Kafka source for the whole run."""
    from epochal.analytics.spark import spark_session

    session = spark_session(
        SparkConfig(
            jar_dir=cache.jar_dir(JarSet.SPARK.value),
            app_name="epochal-tests",
            work_dir=tmp_path_factory.mktemp("spark"),
        )
    )
    yield session
    session.stop()


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
