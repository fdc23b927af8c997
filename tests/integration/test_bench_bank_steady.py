"""The bank benchmark's steady rate (``epochal bench bank --transfers 0 --rate N``) on a real
cluster and broker: every transfer fed comes out, with its latency, and the CPU each role spent
per transfer, read from the OS, beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from epochal.config import KafkaConfig
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
