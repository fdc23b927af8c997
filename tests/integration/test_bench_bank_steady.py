"""The bank benchmark's steady rate (``epochal bench bank --transfers 0 --rate N``) on a real
cluster and broker: every transfer fed comes out, with its latency, and the CPU each role spent
per transfer, read from the OS, beside it."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from bench import open_loop
from epochal.config import KafkaConfig
from epochal.log.client import KafkaClients
from tests.conftest import free_ports

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EPOCHAL = str(Path(sys.executable).parent / "epochal")


def test_a_steady_rate_reports_latency_and_cpu_per_transfer_by_role(
    tmp_path: Path, kafka_config: KafkaConfig
) -> None:
    ports = free_ports(10)
    argv = [
        EPOCHAL, "bench", "bank", "--transfers", "0", "--rate", "400", "--seconds", "4",
        "--warmup", "1", "--workers", "1", "--repeats", "1", "--no-baselines",
        "--bootstrap", kafka_config.bootstrap_servers, "--port-base", str(ports - 1_000),
        "--out", str(tmp_path / "results"),
    ]  # fmt: skip
    done = subprocess.run(
        argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
        capture_output=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = (tmp_path / "results").glob("bank-*.json")
    (run,) = json.loads(path.read_text())["steady"]
    assert run["sent"] == 1_600 and run["missing"] == 0, run
    assert run["counted"] >= 1_000, run  # the warm-up's second left out
    assert 0 < run["latency_ms"]["p50"] <= run["latency_ms"]["p99"], run
    cpu = run["cpu_us_per_tx"]
    busy = ("worker0", "sequencer", "bench")  # an idle role (the supervisor) may read 0
    assert all(cpu[role] > 0 for role in busy) and min(cpu.values()) >= 0, cpu
    assert "CPU us per transfer at 400/s" in done.stdout, done.stdout


class _Starved:
    """The clock of a feed that gets the CPU late: each sleep ends 25 ms past its time (a
    clock of its own, so the passes come at the same times on any machine)."""

    now = 1_000.0

    @classmethod
    def monotonic(cls) -> float:
        return cls.now

    @classmethod
    def sleep(cls, seconds: float) -> None:
        cls.now += seconds + 0.025


def test_a_feed_woken_late_still_sends_every_record_due(
    kafka_config: KafkaConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open-loop feed sends ``rate`` x ``seconds`` records, the last burst too, however late
    its passes come (a starved one ended a pass short of its deadline, and sent less)."""
    topic = f"feed{uuid.uuid4().hex[:8]}"
    KafkaClients(kafka_config).create_topics([topic], partitions=1)
    monkeypatch.setattr(open_loop, "time", _Starved)
    stamps: dict[int, int] = {}
    source = itertools.repeat(b"x")
    sent = open_loop.feed_at_rate(
        kafka_config.bootstrap_servers, topic, source, 300, 0.5, stamps=stamps
    )
    assert (sent, len(stamps)) == (150, 150)
