"""What every benchmark result carries and how it is drawn: the machine it ran on (cores, memory,
CPU model), the versions and the commit measured, the date; and bar charts as PNG."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "cell",
    "machine",
    "measured",
    "plot_bars",
    "pyplot",
    "rate",
    "save_figure",
    "slug",
    "timed",
    "write_result",
]

_VERSIONED = ("epochal", "confluent-kafka", "msgspec", "deltalake", "pyarrow", "pyspark")


def machine(checkout: Path) -> dict[str, Any]:
    """The facts a figure needs beside it to mean anything: where, what, which code, when."""
    cpuinfo = _read("/proc/cpuinfo")
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if "model name" in line),
        platform.processor(),
    )
    meminfo = _read("/proc/meminfo").split()
    memory_kb = int(meminfo[meminfo.index("MemTotal:") + 1]) if "MemTotal:" in meminfo else 0
    versions = {"python": platform.python_version()}
    for package in _VERSIONED:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    try:
        import confluent_kafka

        versions["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        pass
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "memory_gb": round(memory_kb / 2**20, 1),
        "kernel": platform.release(),
        "versions": versions,
        "commit": _commit(checkout),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _commit(checkout: Path) -> str:
    """The checkout's commit, ``+dirty`` with uncommitted changes ("" outside git)."""

    def git(*args: str) -> str:
        command = ["git", "-C", str(checkout), *args]
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        head, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain")
    except OSError:
        return ""
    return head + ("+dirty" if head and dirty else "")


def slug(title: str) -> str:
    """A result's title as a file name: ``ycsbt zipf=0.99`` is ``ycsbt-zipf0_99`` (no dot, so a
    suffix added to it is the only one)."""
    return title.replace(" ", "-").replace("=", "").replace(".", "_")


def write_result(stem: Path, report: dict[str, Any]) -> Path:
    """``<stem>.json``, its folder made if need be."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    path = stem.with_suffix(".json")
    path.write_text(json.dumps(report, indent=2))
    return path


def pyplot() -> ModuleType | None:
    """``matplotlib.pyplot`` drawing to files, not a screen; None (and a note) without
    matplotlib: the JSON is the result, a PNG only a view of it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no PNG (pip install matplotlib)", file=sys.stderr)
        return None
    return plt


def save_figure(plt: ModuleType, fig: Any, path: Path) -> None:
    """Write ``fig`` as a PNG at ``path`` and free it (a long run draws many)."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_bars(path: Path, panels: list[tuple[str, str, dict[str, float]]]) -> bool:
    """One bar chart per panel ``(title, y label, {bar label: value})``, side by side, as a
    PNG; False (and a note) without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, (title, ylabel, bars) in zip(axes[0], panels, strict=True):
        ax.bar(range(len(bars)), list(bars.values()), color="tab:blue")
        ax.set_xticks(range(len(bars)), list(bars), rotation=15, fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        for i, value in enumerate(bars.values()):
            text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
            ax.annotate(text, (i, value), ha="center", va="bottom", fontsize=8)
    save_figure(plt, fig, path)
    return True


def timed(result: dict[str, Any]) -> bool:
    """Whether a run's rate means anything: False for a drain too short to time (see
    :data:`bench.drain.MIN_TIMED_S`); results from before the flag were all timed."""
    return bool(result.get("timed", True))


def measured(result: dict[str, Any]) -> float | None:
    """A run's rate for a figure or a plot, or None for a drain too short to time."""
    return float(result["tps"]) if timed(result) else None


def rate(result: dict[str, Any], unit: str = "") -> str:
    """A drain's rate for a table; a drain too short to time says so instead."""
    if not timed(result):
        return f"untimed ({result['seconds']:.2f} s)"
    return f"{result['tps']:,.0f}{unit}"


def cell(value: float | None) -> str:
    """A :func:`measured` rate in a table's cell: "-" where there is none."""
    return "-" if value is None else f"{value:,.0f}"


def cpu_by_role(cpu: dict[str, float]) -> str:
    """CPU µs per transaction by role, as a report prints it: "bench 1.0, worker0 15.8"; "-"
    for a run that measured none."""
    return ", ".join(f"{role} {us:.1f}" for role, us in cpu.items()) or "-"
