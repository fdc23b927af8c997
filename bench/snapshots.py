"""Snapshot time and size with the real ``DeltaSnapshots``: 100k and 1M actors, 1 % and 100 %
of them changed since the previous snapshot.

No Kafka: the ``Change`` lists a worker would hand to its writer thread are built directly
(canonical bytes of the bank's ``Account``), into a local warehouse in a temporary directory.
Per configuration a base snapshot creates every actor, then each repeat takes one more snapshot
in which the given share of actors changed, and measures:

- ``write``: the worker side, :meth:`DeltaSnapshots.write` (digest deltas, Arrow, Parquet);
- ``commit``: the committer, :meth:`DeltaSnapshots.commit` (changes version, merge into state,
  manifest row), with its steps timed apart;
- the bytes of that snapshot's change files, and of the state table's current version;
- ``restore``: :meth:`DeltaSnapshots.restore` of the latest snapshot (what a restart loads).

The median of ``--repeats`` is reported; JSON and PNG go to ``--out``.

    python -m bench.snapshots                           # 100k and 1M, 1 % and 100 %
    python -m bench.snapshots --actors 100000 --changed 0.01 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from deltalake import DeltaTable
from rich.console import Console
from rich.table import Table

from bench.scratch import cleans_up, scratch_dir
from epochal.actors.store import Change
from epochal.config import SnapshotConfig
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.canonical import encode_canonical
from epochal.schemas.commands import KeyRef, PartitionId
from examples.bank.app import Account, app

console = Console(width=None if sys.stdout.isatty() else 140)
T = TypeVar("T")


def _key(i: int) -> str:
    return f"acct-{i:07d}"


def _value(balance: int) -> bytes:
    return encode_canonical(Account(balance))


class _Steps:
    """Seconds spent in the steps of one ``DeltaSnapshots`` commit, by step: each step is the
    first of its private methods the class has (wrapped on the instance, the class untouched;
    a step it has none of counts 0)."""

    def __init__(self, snapshots: DeltaSnapshots, steps: dict[str, tuple[str, ...]]) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(steps, 0.0)
        for step, names in steps.items():
            name = next((n for n in names if hasattr(snapshots, n)), None)
            if name is not None:
                setattr(snapshots, name, self._timed(step, getattr(snapshots, name)))

    def _timed(self, step: str, method: Callable[..., T]) -> Callable[..., T]:
        def timed(*args: Any, **kwargs: Any) -> T:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[step] += time.perf_counter() - started

        return timed

    @contextmanager
    def fresh(self) -> Iterator[dict[str, float]]:
        for step in self.seconds:
            self.seconds[step] = 0.0
        yield self.seconds


_STEPS = {
    "read_manifests": ("manifests",),
    "put_back": ("_put_back",),
    "changes_version": ("_append", "_commit_changes"),
    "merge_state": ("_merge_state",),
}


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _current_bytes(uri: str) -> int:
    """Bytes of the data files the table's current version reads."""
    actions = DeltaTable(uri).get_add_actions(flatten=True)
    return int(sum(actions.column("size_bytes").to_pylist()))


def _created(actors: int, partitions: int) -> list[Change]:
    """Every actor new, with the opening balance."""
    value = _value(1_000)
    return [
        Change(KeyRef("Account", _key(i)), PartitionId(i % partitions), None, value)
        for i in range(actors)
    ]


def _changed(
    balances: list[int], chosen: list[int], rng: random.Random, partitions: int
) -> list[Change]:
    """A change of each chosen actor (its balance moves), updating ``balances``."""
    changes = []
    for i in chosen:
        before = balances[i]
        balances[i] = after = before + rng.randrange(1, 500)
        ref = KeyRef("Account", _key(i))
        changes.append(Change(ref, PartitionId(i % partitions), _value(before), _value(after)))
    return changes


def run_configuration(actors: int, changed: float, repeats: int, root: Path) -> dict[str, Any]:
    """One warehouse: a base snapshot of ``actors`` new actors, then ``repeats`` snapshots in
    which ``changed`` of them changed; the measures of each of these."""
    warehouse = root / f"w{actors}-{changed}"
    snapshots = DeltaSnapshots(app, SnapshotConfig(str(warehouse), keep=0), partitions=2)
    snapshots.ensure_tables(app.code_hash())
    steps = _Steps(snapshots, _STEPS)
    rng = random.Random(actors)
    balances = [1_000] * actors
    runs: list[dict[str, Any]] = []
    state_uri = snapshots.warehouse.state("Account")
    for ssid in range(repeats + 1):
        if ssid == 0:
            changes = _created(actors, 2)
        else:
            chosen = sorted(rng.sample(range(actors), max(1, round(actors * changed))))
            changes = _changed(balances, chosen, rng, 2)
        started = time.perf_counter()
        part = snapshots.write(ssid, 0, changes)
        write_s = time.perf_counter() - started
        with steps.fresh() as seconds:
            started = time.perf_counter()
            manifest = snapshots.commit([part], ssid)
            commit_s = time.perf_counter() - started
            commit_steps = dict(seconds)
        started = time.perf_counter()
        restored = snapshots.restore()
        restore_s = time.perf_counter() - started
        assert restored is not None and restored.manifest.ssid == ssid
        assert len(restored.actors["Account"]) == manifest.actors["Account"] == actors
        run = {
            "ssid": ssid,
            "changed_actors": len(changes),
            "write_s": write_s,
            "commit_s": commit_s,
            "commit_steps_s": {
                **commit_steps,
                "manifest_row": commit_s - sum(commit_steps.values()),
            },
            "change_bytes": sum(f.size for f in part.files),
            "state_bytes": _current_bytes(state_uri),
            "state_dir_bytes": _dir_bytes(Path(state_uri)),
            "restore_s": restore_s,
        }
        runs.append(run)
        console.print(
            f"  {actors:,} actors, {changed:.0%} changed, ssid {ssid}: write {write_s:.2f} s, "
            f"commit {commit_s:.2f} s, restore {restore_s:.2f} s"
        )
    shutil.rmtree(warehouse, ignore_errors=True)
    base, measured = runs[0], runs[1:]
    return {
        "actors": actors,
        "changed": changed,
        "changed_actors": measured[0]["changed_actors"],
        **{k: statistics.median(r[k] for r in measured) for k in _MEDIANS},
        "commit_steps_s": {
            step: statistics.median(r["commit_steps_s"][step] for r in measured)
            for step in measured[0]["commit_steps_s"]
        },
        "base": base,
        "runs": measured,
    }


_MEDIANS = ("write_s", "commit_s", "change_bytes", "state_bytes", "state_dir_bytes", "restore_s")


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def _print(results: list[dict[str, Any]]) -> None:
    table = Table(title="snapshots with DeltaSnapshots (median; local warehouse)")
    columns = ("actors", "changed", "write s", "commit s", "  merge s", "change MB",
               "state MB", "restore s", "base write s", "base commit s")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            f"{r['actors']:,}", f"{r['changed_actors']:,}", f"{r['write_s']:.3f}",
            f"{r['commit_s']:.3f}", f"{r['commit_steps_s']['merge_state']:.3f}",
            _mb(r["change_bytes"]), _mb(r["state_bytes"]), f"{r['restore_s']:.3f}",
            f"{r['base']['write_s']:.2f}", f"{r['base']['commit_s']:.2f}",
        )  # fmt: skip
    console.print(table)


def _plot(results: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("no matplotlib: no PNG (pip install matplotlib)")
        return False
    labels = [f"{r['actors'] // 1000:,}k\n{r['changed']:.0%}" for r in results]
    x = range(len(results))
    fig, (times, sizes) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.2
    for offset, (key, name) in enumerate(
        [("write_s", "write"), ("commit_s", "commit"), ("restore_s", "restore")]
    ):
        times.bar([i + (offset - 1) * width for i in x], [r[key] for r in results], width,
                  label=name)  # fmt: skip
    times.set_xticks(list(x), labels)
    times.set_ylabel("seconds (median)")
    times.set_yscale("log")
    times.set_title("snapshot time by actors and share changed")
    times.legend()
    for offset, (key, name) in enumerate(
        [("change_bytes", "change files"), ("state_bytes", "state table")]
    ):
        sizes.bar([i + (offset - 0.5) * width for i in x],
                  [r[key] / 1e6 for r in results], width, label=name)  # fmt: skip
    sizes.set_xticks(list(x), labels)
    sizes.set_ylabel("MB")
    sizes.set_yscale("log")
    sizes.set_title("snapshot size")
    sizes.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


@cleans_up
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--changed", type=float, nargs="+", default=[0.01, 1.0],
                        help="share of the actors changed since the previous snapshot")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="snapshots measured (median)")
    parser.add_argument("--out", default="bench/results", help="where the JSON and PNG go")
    args = parser.parse_args(argv)
    root = scratch_dir("snapshots-")
    results = []
    for actors in args.actors:
        for changed in args.changed:
            results.append(run_configuration(actors, changed, args.repeats, root))
    _print(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"snapshots-{time.strftime('%Y%m%d-%H%M%S')}"
    report = {"bench": "snapshots", "machine": platform.node(), "repeats": args.repeats,
              "results": results}  # fmt: skip
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    plotted = _plot(results, stem.with_suffix(".png"))
    console.print(f"results in {stem}.json" + (f" and {stem}.png" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
