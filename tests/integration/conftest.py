"""A fresh cluster per test (``tests/integration/cluster.py``), killed at the end whatever
happened."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients
from tests.integration.cluster import Cluster


@pytest.fixture
def cluster(kafka_config: KafkaConfig, tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(f"c{uuid.uuid4().hex[:8]}", tmp_path, KafkaClients(kafka_config))
    try:
        yield running
    finally:
        running.close()
