"""What a new worker imports on its way to its first output, the fork server has imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from epochal.supervisor import CHILD_PRELOAD

_FIRST_READ = textwrap.dedent(
    """
    import importlib, os, sys
    for name in sys.argv[2:]:
        importlib.import_module(name)
    from deltalake import DeltaTable
    before = set(sys.modules)
    DeltaTable(sys.argv[1]).to_pyarrow_table(columns=["key", "_state"])  # as a restore reads
    print(" ".join(sorted(set(sys.modules) - before)), flush=True)
    os._exit(0)  # delta-rs's runtime can abort an interpreter's shutdown
    """
)


def test_a_workers_first_snapshot_read_imports_nothing_the_fork_server_has_not(
    tmp_path: Path,
) -> None:
    """Reading a Delta table through pyarrow imports pyarrow.dataset and pandas the first time
    (0.15 s): in every new worker of a rollback, unless the fork server has them already."""
    table = str(tmp_path / "state")
    write_deltalake(table, pa.table({"key": [1, 2], "_state": [b"a", b"b"]}))
    read = [sys.executable, "-c", _FIRST_READ, table, *CHILD_PRELOAD]
    imported = subprocess.run(read, capture_output=True, text=True, check=True).stdout.split()
    assert imported == []
