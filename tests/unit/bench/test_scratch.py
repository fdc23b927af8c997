"""A benchmark's scratch folders go when it ends well and stay, named, when it fails."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from bench import scratch
from bench.scratch import cleans_up, scratch_dir


@pytest.fixture(autouse=True)
def _temp_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Temporary folders in ``tmp_path``, and no folder left from another test's runs."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_SCRATCH", scratch._Scratch())


def test_a_main_that_ends_well_leaves_nothing_and_nested_mains_share_the_folder(
    tmp_path: Path,
) -> None:
    made: list[Path] = []

    @cleans_up
    def inner() -> int:
        made.append(scratch_dir("inner-"))
        return 0

    @cleans_up
    def outer() -> int:
        made.append(scratch_dir("outer-"))
        assert inner() == 0
        assert made[0].exists() and made[1].exists()  # the inner main did not remove them
        assert made[0].parent == made[1].parent
        return 0

    assert outer() == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fails", ["exit code", "exception"])
def test_a_main_that_fails_keeps_its_folder_and_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fails: str
) -> None:
    @cleans_up
    def main() -> int:
        (scratch_dir("run-") / "run.log").write_text("what happened")
        if fails == "exception":
            raise RuntimeError("the run broke")
        return 1

    if fails == "exception":
        with pytest.raises(RuntimeError):
            main()
    else:
        assert main() == 1
    [root] = tmp_path.iterdir()
    assert [log.read_text() for log in root.glob("*/run.log")] == ["what happened"]
    assert f"kept in {root}" in capsys.readouterr().err

    @cleans_up
    def next_one() -> int:
        assert scratch_dir("run-").parent != root  # a folder of its own
        return 0

    assert next_one() == 0
    assert list(tmp_path.iterdir()) == [root]
