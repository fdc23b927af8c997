"""JVM artifacts from Maven Central: the local broker's classpath and Spark's extra jars.

Each set is declared by a POM beside this module and copied, with its runtime dependencies, into
a cache outside git by ``mvn dependency:copy-dependencies``. The two sets stay separate because
they need different ``kafka-clients`` versions. A fetch is idempotent: a stamp holding the hash of
the POM says the directory is complete, so a second fetch (and everything after it) is offline.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import tempfile
from enum import StrEnum
from importlib import resources
from pathlib import Path

from epochal.config import CacheConfig
from epochal.errors import ConfigError

__all__ = ["JarSet", "fetch_jars", "jar_paths", "require_jars"]

logger = logging.getLogger(__name__)

_STAMP = ".complete"


class JarSet(StrEnum):
    """The artifact sets; the value names both the POM and the cache directory."""

    KAFKA_BROKER = "kafka-broker"
    SPARK = "spark"

    @property
    def pom(self) -> Path:
        return Path(str(resources.files(__package__).joinpath(f"{self.value}.pom.xml")))


def _settings() -> Path:
    return Path(str(resources.files(__package__).joinpath("maven-settings.xml")))


def _fingerprint(jar_set: JarSet) -> str:
    digest = hashlib.sha256(jar_set.pom.read_bytes())
    digest.update(_settings().read_bytes())
    return digest.hexdigest()


def _is_complete(directory: Path, jar_set: JarSet) -> bool:
    stamp = directory / _STAMP
    return stamp.is_file() and stamp.read_text().strip() == _fingerprint(jar_set)


def fetch_jars(cache: CacheConfig, jar_set: JarSet) -> Path:
    """Fetch one set into the cache unless it is already there; returns its directory.

    Maven writes into a temporary sibling directory that is renamed into place only when it
    succeeded, so an interrupted fetch never leaves a half-filled set that looks complete.
    """
    target = cache.jar_dir(jar_set.value)
    if _is_complete(target, jar_set):
        logger.debug("jars already cached set=%s dir=%s", jar_set.value, target)
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError(
            "Maven (mvn) is not on PATH; install it (e.g. `apt-get install maven`) to fetch jars",
            jar_set=jar_set.value,
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{jar_set.value}-", dir=target.parent))
    command = [
        mvn, "-B", "-q", "-s", str(_settings()), "-f", str(jar_set.pom),
        "dependency:copy-dependencies", "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]  # fmt: skip
    logger.info("fetching jars set=%s dir=%s", jar_set.value, target)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise ConfigError(
            f"Maven could not fetch the {jar_set.value} jars:\n{tail}", pom=str(jar_set.pom)
        )
    (staging / _STAMP).write_text(_fingerprint(jar_set))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def require_jars(directory: Path, jar_set: JarSet) -> Path:
    """The set's directory, or a ConfigError that says how to fetch it."""
    if not _is_complete(directory, jar_set):
        raise ConfigError(
            f"the {jar_set.value} jars are missing or outdated in {directory}; "
            "run `epochal jars fetch` (or the README's set-up command) first",
            jar_set=jar_set.value,
        )
    return directory


def jar_paths(directory: Path) -> list[Path]:
    """The jars of a fetched set, sorted so that classpaths are stable."""
    return sorted(directory.glob("*.jar"))
