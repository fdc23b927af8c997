"""docs/testing.md runs as written: its Python blocks, as one test module in a fresh directory,
under a plain pytest that finds the ``epochal_app`` fixture through epochal's plugin entry point."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_the_testing_guide_runs_as_written(tmp_path: Path) -> None:
    blocks = BLOCK.findall((ROOT / "docs" / "testing.md").read_text())
    assert len(blocks) >= 4
    source = "\n\n".join(blocks)
    tests = len(re.findall(r"^def test_", source, re.MULTILINE))
    (tmp_path / "test_guide.py").write_text(source)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
         "test_guide.py"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{tests} passed" in done.stdout, done.stdout
