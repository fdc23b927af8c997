"""The producers and the reference stay free of epochal: any client can drive an epochal app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAIN = [
    "examples.bank.producer",
    "examples.leaderboard.producer",
    "examples.ledger.producer",
    "examples.leaderboard.reference",
]


@pytest.mark.parametrize("module", PLAIN)
def test_module_imports_without_loading_epochal(module: str) -> None:
    check = (
        f"import sys, {module}; "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'epochal'); "
        "assert not loaded, loaded"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("app", ["bank", "leaderboard", "ledger"])
def test_producer_refuses_bad_arguments_before_touching_kafka(app: str) -> None:
    flag = {"bank": "--accounts=1", "leaderboard": "--count=x", "ledger": "--keys=1"}[app]
    done = subprocess.run(
        [sys.executable, "-m", f"examples.{app}.producer", flag],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and done.stderr
