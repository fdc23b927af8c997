"""One function builds every SparkSession epochal uses: Delta Lake plus the Kafka source.

The jars come from the cache that ``epochal jars fetch`` fills; Spark never resolves packages at
run time (no ``spark.jars.packages``). Jars whose artifact the pyspark wheel already ships (Jackson,
Hadoop, Parquet, ...) are left out, so the session sees one copy of each library.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql import SparkSession

from epochal.config import SparkConfig
from epochal.interrupts import interrupts_held
from epochal.jvm import JarSet, jar_paths, require_jars

__all__ = ["jvm_output_to", "spark_jars", "spark_session"]

logger = logging.getLogger(__name__)

_VERSION_SUFFIX = re.compile(r"-\d+(\.[^-]*)+(-[A-Za-z0-9.]+)?\.jar$")


def _artifact(jar: Path) -> str:
    """``jackson-core-2.13.5.jar`` -> ``jackson-core``."""
    return _VERSION_SUFFIX.sub("", jar.name)


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def spark_jars(jar_dir: Path) -> list[Path]:
    """Cached jars that the pyspark wheel does not already provide."""
    provided = {_artifact(jar) for jar in _pyspark_jars().glob("*.jar")}
    directory = require_jars(jar_dir, JarSet.SPARK)
    return [jar for jar in jar_paths(directory) if _artifact(jar) not in provided]


@contextlib.contextmanager
def jvm_output_to(path: Path) -> Iterator[None]:
    """Around the start of a session: the JVM it launches writes its start-up lines and log4j's
    warnings to ``path`` for its whole life, not to this terminal. pyspark gives the JVM this
    process's stdout and stderr, so they point at ``path`` while it starts (this process's own
    output goes there too meanwhile: say what is starting before)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _local_delta_settings(master: str) -> dict[str, str]:
    """On a local master, Delta rebuilds each table version it reads in as many tasks as there
    are cores, not its default 50: every snapshot read by version is one such rebuild, and 50
    tiny tasks on 2 cores took 7-10 s where 2 take 2 s."""
    match = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
    if match is None:
        return {}
    cores = match.group(1) or "1"
    count = (os.cpu_count() or 1) if cores == "*" else int(cores)
    return {"spark.databricks.delta.snapshotPartitions": str(count)}


def spark_session(config: SparkConfig) -> SparkSession:
    """A session (or the running one) with Delta's SQL extension and catalog and the Kafka source.

    >>> spark = spark_session(SparkConfig(jar_dir=cache.jar_dir("spark")))
    >>> spark.read.format("delta").load("warehouse/bank/state/Account")
    """
    if config.master.startswith("local"):
        # Spark picks the first non-loopback interface otherwise, and says so on every start.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python workers run this interpreter (with epochal), not any python3 on the PATH
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = config.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    jars = ",".join(str(jar) for jar in spark_jars(config.jar_dir))
    settings = {
        "spark.jars": jars,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.warehouse.dir": str(work / "spark-warehouse"),
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={work / 'derby'}",
        "spark.driver.memory": config.driver_memory,
        "spark.sql.shuffle.partitions": "4",
        **_local_delta_settings(config.master),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # handlers replay on executors: the same hash seed everywhere (docs/concepts.md)
        "spark.executorEnv.PYTHONHASHSEED": "0",
        **config.conf,
    }
    builder = SparkSession.builder.master(config.master).appName(config.app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    logger.info("starting spark master=%s jars=%d", config.master, len(jars.split(",")))
    # pyspark's JVM ends when this process's end closes its stdin, but only once it is up: a
    # start cut by Ctrl-C or SIGTERM left it running for good, so they act once it is up
    with interrupts_held():
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
