"""BENCHMARKS.md's sections for the benchmarks that keep flags of their own (the bank, the long
run, queries, snapshots, restart, recovery): each script's JSON as it wrote it, beside the
published figure it is compared with, or a plain statement that there is none.

A report here is ``{"kind", "title", "command", "result", "exit_code", "png"}``, or ``{"kind",
"title", "command", "error"}`` for a run that wrote nothing: :func:`bench.cli.run_measure`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from bench.long_run import MIN_SPAN, NOT_JUDGED
from bench.queries import engine_with_queries, summarize
from bench.report import cpu_by_role, slug

__all__ = ["section"]

Cells = dict[tuple[str, int, int], dict[str, Any]]  # queries' cells by (level, keys, in flight)

TSPOON_BANK = (
    "TSpoon (JPDC 2020), bank transfers over 100,000 accounts, uniform, PL4 (serializable): "
    "transactions cost about **7x** throughput against plain Flink without transactions."
)
TSPOON_QUERIES = "TSpoon (JPDC 2020): **53,900 point queries/s** on its cluster."
S_QUERY_QUERIES = (
    "S-QUERY (ICDE 2022): its queryable-snapshot configuration adds **at most 8 ms** to the "
    "stream's latency at p99.99."
)
S_QUERY_SNAPSHOTS = "S-QUERY: snapshots add **5 ms** to the stream's latency at p99.99."
STYX_RESTART = "Styx: about **2.5 s** from a kill to the first output, end to end."


def section(report: dict[str, Any], cores: int, plotted: bool) -> list[str]:
    """The heading, the command that made the figures, its kind's body, and the plot."""
    lines = [f"## {HEADINGS[report['kind']]}", "", f"Run: `{report['command']}`.", ""]
    if "result" not in report:
        return [*lines, f"The run did not complete: {report['error']}", ""]
    if report.get("exit_code"):
        lines += [f"The run exited with status {report['exit_code']}.", ""]
    lines += RENDERERS[report["kind"]](report["result"], cores)
    if plotted:
        lines += [f"![{report['title']}](bench/plots/{slug(report['title'])}.png)", ""]
    return lines


# --- the bank ---------------------------------------------------------------------------------


def _accounts(result: dict[str, Any]) -> str:
    """The accounts a bank run drew from (a run before they were recorded: not said)."""
    accounts = result.get("accounts")
    return f"{accounts:,} accounts" if accounts else "the accounts"


def _bank(result: dict[str, Any], cores: int) -> list[str]:
    plain = next(b["tps"] for b in result["baselines"] if b["baseline"] == "plain bank")
    runs = result["results"]
    lines = [
        f"A backlog of {runs[0]['transfers']:,} transfers over {_accounts(result)} drained by "
        "the default cluster and, in the same run over the same exactly-once Kafka batches, by "
        "the plain bank (one Python process, the balances in a dict) and the exactly-once pipe "
        "(every record copied); medians of the runs.",
        "",
        "| system | transfers/s | per core | slowdown for transactions (plain bank / it) "
        "| rollbacks | CPU µs per transfer by role |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs + result["baselines"]:
        label = r.get("baseline") or _cluster(r)
        pipe = r.get("unit") == "records"  # its rate counts deposits too: no slowdown
        slowdown = "-" if pipe else f"{plain / r['tps']:.1f}x"
        cpu = cpu_by_role(r["cpu_us_per_tx"])
        lines.append(
            f"| {label} | {r['tps']:,.0f}{' records/s' if pipe else ''} | {r['tps'] / cores:,.0f} "
            f"| {slowdown} | {r['rollbacks']} | {cpu} |"
        )
    default = [r for r in runs if r.get("snapshots", "default") == "default"]
    ours = ", ".join(f"{plain / r['tps']:.1f}x on {r['workers']} worker(s)" for r in default)
    return [
        *lines,
        "",
        *_what_snapshots_cost(runs, result.get("steady", [])),
        f"**Anchor:** {TSPOON_BANK} epochal's slowdown for transactions: {ours}, against "
        "TSpoon's 7x. The bars differ: TSpoon's is Flink on its cluster, epochal's one plain "
        f"Python process sharing the {cores} cores with the broker.",
        "",
    ]


def _cluster(r: dict[str, Any]) -> str:
    """A bank run's configuration in words: its workers and snapshot setting."""
    snapshots = r.get("snapshots", "default")
    setting = {"default": "default cluster", "off": "snapshots off"}.get(
        snapshots, f"snapshots {snapshots}"
    )
    return f"epochal, {r['workers']} worker(s), {setting}"


def _what_snapshots_cost(runs: list[dict[str, Any]], steady: list[dict[str, Any]]) -> list[str]:
    """What snapshots cost, where the run has each worker count with them (the default) and
    without: the share of throughput, and at a steady rate the p99 they add (S-QUERY's
    figure)."""
    lines = []
    for workers in sorted({r["workers"] for r in runs}):
        drains = {r.get("snapshots", "default"): r for r in runs if r["workers"] == workers}
        if {"default", "off"} <= drains.keys():
            on, off = drains["default"]["tps"], drains["off"]["tps"]
            lines.append(
                f"- {workers} worker(s): {on:,.0f} transfers/s with snapshots, {off:,.0f} without"
                + (
                    f": they cost {1 - on / off:.0%} of throughput."
                    if on <= off
                    else " (faster with them: within this run's noise)."
                )
            )
    if steady:
        lines += [
            "",
            f"Steady at {steady[0]['rate']:,} transfers/s for {steady[0]['seconds']:.0f} s "
            "(half the slowest drain's rate), latency from the input record's timestamp to its "
            "egress record's, the warm-up left out; the median run by p99:",
            "",
            "| configuration | p50 ms | p99 ms | p99.9 ms | p99 of each run, ms "
            "| CPU µs per transfer by role |",
            "|---|---|---|---|---|---|",
        ]
        for r in steady:
            ms, each = r["latency_ms"], ", ".join(f"{p:.0f}" for p in r.get("p99_runs", []))
            roles = cpu_by_role(r.get("cpu_us_per_tx", {}))  # older results measured none: -
            lines.append(
                f"| {_cluster(r)} | {ms['p50']:.0f} | {ms['p99']:.0f} | {ms['p99.9']:.0f} "
                f"| {each} | {roles} |"
            )
        lines.append("")
        for workers in sorted({r["workers"] for r in steady}):
            at = {r.get("snapshots", "default"): r for r in steady if r["workers"] == workers}
            if {"default", "off"} <= at.keys():
                added = at["default"]["latency_ms"]["p99"] - at["off"]["latency_ms"]["p99"]
                lines.append(
                    f"- {workers} worker(s): snapshots add {added:+.0f} ms at p99 "
                    f"(against {S_QUERY_SNAPSHOTS.removeprefix('S-QUERY: ')[:-1]}; "
                    "a run this short has too few transfers for p99.99)."
                )
    return [*lines, ""] if lines else []


# --- the long run -----------------------------------------------------------------------------


def _long(result: dict[str, Any], cores: int) -> list[str]:
    money = result["conservation"]
    conserved = (
        f"{money['total']:,} in {money['accounts']:,} accounts at the savepoint the cluster "
        f"stopped at, for {money['deposits']:,} deposited, lowest {money['lowest']:,}: "
        + ("conserved" if money["holds"] else "**not conserved**")
        if "total" in money
        else f"not checked: {money['why']}"
    )
    lines = [
        f"A backlog of {result['transfers']:,} bank transfers drained by the default cluster "
        f"(snapshots on, strong recovery) on {result['workers']} workers, once: "
        f"**{result['tps']:,.0f} transfers/s** over {result['seconds']:,.0f} s, "
        f"{result['egress']:,} egress records. Rollbacks: **{result['rollbacks']}** "
        f"(generation {result['generation']} at the end). Money: {conserved}.",
        "",
        "RSS of each process, sampled every second and set against the transfers drained; the "
        f"warm-up is the first {result['warmup_transfers']:,} transfers. *Growth* is a "
        "least-squares line through the later half of the samples after the warm-up (a working "
        "set that fills up rises early and stops; a leak keeps its slope to the end), drawn "
        "from the warm-up to the end: a process is flat if it grows less than "
        f"{result['flat_mb']:.0f} MB (over at least {MIN_SPAN:,} transfers).",
        "",
        "| process | after warm-up MB | at the end MB | peak MB | MB per 1M transfers "
        "| growth MB | flat |",
        "|---|---|---|---|---|---|---|",
    ]
    for role, m in result["memory"].items():
        flat = {True: "yes", False: "**no**", None: "-"}[m["flat"]]
        if role in NOT_JUDGED:
            flat = "not judged (Kafka's JVM)"
        lines.append(
            f"| {role} | {_mb(m['after_warmup_mb'])} | {_mb(m['end_mb'])} "
            f"| {_mb(m['peak_mb'])} | {_signed(m['slope_mb_per_m'], 2)} "
            f"| {_signed(m['growth_mb'], 1)} | {flat} |"
        )
    verdict = {True: "flat", False: "**not flat**", None: "not judged (too short a run)"}
    return [
        *lines,
        "",
        f"Memory: {verdict[result['flat']]}.",
        "",
        "**Anchor:** none published; the bar is the issue's own: a backlog of 10 million "
        "transfers drains without a rollback and with flat memory.",
        "",
    ]


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _signed(value: float | None, places: int) -> str:
    return "-" if value is None else f"{value:+.{places}f}"


# --- queries ----------------------------------------------------------------------------------


def _queries(result: dict[str, Any], cores: int) -> list[str]:
    many, one = max(result["args"]["in_flight"]), min(result["args"]["in_flight"])
    idle, load = summarize(result["idle"]), summarize(result["load"])
    levels = result["args"]["levels"]
    lines = [
        f"Point reads of the bank on 2 workers, by a client process on the same {cores} cores, "
        f"with the engine idle and under {result['rate']:,} transfers/s: q/s with {many} "
        f"queries in flight, latency with {one} at a time (p50 / p99 ms).",
        "",
        "| level | keys per query | idle q/s | idle latency | under load q/s "
        "| under load latency |",
        "|---|---|---|---|---|---|",
    ]
    for level, keys in sorted({k[:2] for k in idle | load}, key=lambda k: (levels.index(k[0]), k)):
        lines.append(
            f"| {level} | {keys:,} | {_qps(idle.get((level, keys, many)))} "
            f"| {_latency(idle.get((level, keys, one)))} | {_qps(load.get((level, keys, many)))} "
            f"| {_latency(load.get((level, keys, one)))} |"
        )
    return [*lines, "", *_engine(result), *_queries_anchor(result, idle, many)]


def _qps(cell: dict[str, Any] | None) -> str:
    return "-" if cell is None else f"{cell['qps']:,.0f}"


def _latency(cell: dict[str, Any] | None) -> str:
    if cell is None or math.isnan(cell["latency_ms"]["p50"]):  # NaN: no query answered
        return "-"
    return f"{cell['latency_ms']['p50']:.2f} / {cell['latency_ms']['p99']:.2f}"


def _engine(result: dict[str, Any]) -> list[str]:
    """The engine's transfers/s (and their latency, when fed at a rate) with and without
    queries: what the queries cost it."""
    lines = ["| the engine | queries | transfers/s | transfer p50 / p99 ms |", "|---|---|---|---|"]
    for peak in (result.get("peak"), result.get("peak_with_queries")):
        if peak:
            lines.append(
                f"| peak (backlog drain) | {_query(peak['query'])} | {peak['tps']:,.0f} | - |"
            )
    fed = f"fed {result['rate']:,}/s"
    windows = [
        (f"{fed}, {when} the queries", "none", window)
        for when, window in zip(("before", "after"), result["engine_without_queries"], strict=True)
    ]
    for level in dict.fromkeys(r["level"] for r in result["load"]):
        engine = engine_with_queries([r for r in result["load"] if r["level"] == level])
        windows.append((f"{fed}, queries running", f"{level}, {engine['qps']:,.0f} q/s", engine))
    for label, queries, w in windows:
        ms = w["latency_ms"]
        latency = f"{ms['p50']:,.0f} / {ms['p99']:,.0f}"
        lines.append(f"| {label} | {queries} | {w['tps']:,.0f} | {latency} |")
    return [*lines, ""]


def _query(query: dict[str, Any] | None) -> str:
    if query is None:
        return "none"
    return f"{query['level']}, {query['keys']} key(s), {query['qps']:,.0f} q/s"


def _queries_anchor(result: dict[str, Any], idle: Cells, many: int) -> list[str]:
    single = [cell for key, cell in idle.items() if key[1] == 1 and key[2] == many]
    best = max(single, key=lambda cell: cell["qps"], default=None)
    ours = "none measured" if best is None else f"{best['qps']:,.0f} q/s ({best['level']})"
    return [
        f"**Anchors:** {TSPOON_QUERIES} epochal's best 1-key q/s, idle: {ours}.",
        "",
        f"{S_QUERY_QUERIES} {_snapshot_cost(result)}",
        "",
    ]


def _snapshot_cost(result: dict[str, Any]) -> str:
    """What SNAPSHOT queries did to the engine's transfers: their p99 with the queries running
    and in the windows before and after (a window is seconds long: no p99.99)."""
    rows = [r for r in result["load"] if r["level"] == "snapshot"]
    if not rows:
        return "epochal: SNAPSHOT not measured."
    before, after = (w["latency_ms"]["p99"] for w in result["engine_without_queries"])
    during = engine_with_queries(rows)["latency_ms"]["p99"]
    return (
        f"epochal's transfers under load, p99 (a window is too short for p99.99): {during:,.0f} "
        f"ms with SNAPSHOT queries running; {before:,.0f} ms before any query, {after:,.0f} ms "
        "after them all."
    )


# --- snapshots, restart, recovery --------------------------------------------------------------


def _snapshots(result: dict[str, Any], cores: int) -> list[str]:
    lines = [
        "The real `DeltaSnapshots` into a local warehouse, no Kafka: a base snapshot creates every "
        "actor, then each measured snapshot has the given share changed; medians of "
        f"{result['repeats']}. *Write* is the worker's side, *commit* the committer's, "
        "*restore* what a restart loads.",
        "",
        "| actors | changed | write s | commit s | restore s | change files MB | state MB "
        "| base snapshot write / commit s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        base = r["base"]
        lines.append(
            f"| {r['actors']:,} | {r['changed']:.0%} | {r['write_s']:.3f} | {r['commit_s']:.3f} "
            f"| {r['restore_s']:.3f} | {r['change_bytes'] / 1e6:.1f} "
            f"| {r['state_bytes'] / 1e6:.1f} | {base['write_s']:.2f} / {base['commit_s']:.2f} |"
        )
    return [
        *lines,
        "",
        f"**Anchor:** {S_QUERY_SNAPSHOTS} Measured here: a snapshot's own time and size; their "
        "cost to throughput and to p99 latency is in the bank's section (the default cluster "
        "against snapshots off, drained and at a steady rate).",
        "",
    ]


def _restart(result: dict[str, Any], cores: int) -> list[str]:
    kill = result["kill"]
    runs = kill["runs"]
    lines = [
        f"kill -9 of one of {kill['workers']} workers while {kill['rate']:,} transfers/s flow; "
        f"seconds from the kill, median of {len(runs)}.",
        "",
        "| from the kill to | seconds | runs |",
        "|---|---|---|",
    ]
    for key, what in RESTART_STEPS:
        every = ", ".join("-" if r[key] is None else f"{r[key]:.2f}" for r in runs)
        lines.append(f"| {what} | {kill[key]:.2f} | {every} |")
    return [
        *lines,
        "",
        f"Records replayed (median, the most of any worker): {kill['replayed_records']:,.0f}.",
        "",
        f"**Anchor:** {STYX_RESTART} epochal: outputs again after {kill['first_output_s']:.2f} s, "
        f"every worker recovered after {kill['recovered_s']:.2f} s.",
        "",
    ]


def _recovery(result: dict[str, Any], cores: int) -> list[str]:
    args = result["args"]
    lines = [
        f"Strong recovery of a command log of {args['transactions']:,} transfers "
        f"({args['accounts']:,} accounts in {args['branches']:,} branches, "
        f"{args['per_epoch']:,} an epoch) from the snapshot at epoch 0: the engine's serial "
        "replay and the Spark job, which includes reading the log and the state and committing "
        "the snapshot, not starting the session. Medians of the runs.",
        "",
        "| replay | transactions/s | seconds | runs (s) |",
        "|---|---|---|---|",
    ]
    for r in result["results"]:
        every = ", ".join(f"{s:.1f}" for s in r["seconds_runs"])
        lines.append(f"| {r['how']} | {r['tps']:,.0f} | {r['seconds']:.1f} | {every} |")
    agree = "all equal" if result["digests_agree"] else "**differ**"
    return [
        *lines,
        "",
        f"The recovered states' digests: {agree}.",
        "",
        "**Anchor:** none published for a replay rate. Styx's 2.5 s from a kill to the first "
        "output is end to end, and is compared with in the restart section.",
        "",
    ]


RESTART_STEPS = (
    ("rollback_s", "the rollback (a new generation)"),
    ("first_output_s", "the new generation's first output"),
    ("fresh_input_s", "the first output of an input produced after the kill"),
    ("recovered_s", "every worker recovered"),
)
HEADINGS = {
    "bank": "bank (TSpoon's transfers, on the example's 10,000 accounts)",
    "long": "long run (a backlog of 10 million transfers: rollbacks and memory)",
    "queries": "queries (point reads per isolation level)",
    "snapshots": "snapshots (time and size)",
    "restart": "restart (kill -9 of a worker)",
    "recovery": "recovery (replay of the command log)",
}
RENDERERS: dict[str, Callable[[dict[str, Any], int], list[str]]] = {
    "bank": _bank,
    "long": _long,
    "queries": _queries,
    "snapshots": _snapshots,
    "restart": _restart,
    "recovery": _recovery,
}
