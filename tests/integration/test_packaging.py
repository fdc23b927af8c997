"""The top-level folders install as the one package ``epochal``, in a wheel too."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_wheel_holds_every_layer_under_epochal_and_the_poms(
    tmp_path: Path, repo_root: Path
) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(repo_root)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("epochal-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = [
        "actors/__init__.py", "log/local_broker.py", "recovery/__init__.py", "analytics/spark.py",
        "schemas/codec.py", "cli.py", "errors.py", "jvm/kafka-broker.pom.xml", "jvm/spark.pom.xml",
        "jvm/maven-settings.xml",
    ]  # fmt: skip
    for module in expected:
        assert f"epochal/{module}" in names, module
    assert not any(name.startswith(("log/", "actors/", "tests/")) for name in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "epochal = epochal.cli:entry" in zipfile.ZipFile(wheel).read(entry_points).decode()
