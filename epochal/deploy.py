"""What a start checks before it runs another version of the app's code over the command log.

Every epoch of the command log carries the hash of the code that logged it (docs/concepts.md,
"Determinism and the code hash"). The epochs a start will replay are those after the latest
snapshot. If the running code differs from theirs:

- none of them released egress (a stop that was a savepoint leaves none at all; a cluster that
  could not get past an epoch leaves only epochs nobody saw): they run under the new code, and a
  RECODE amendment records it (``log/amendments.py``), so later restarts need no flag;
- some released egress: re-running them could contradict what downstream consumers already
  read. The start is refused, naming the epochs, the code that ran them and what was released,
  unless ``--allow-code-change`` is given: then they are re-coded too, with a warning naming
  exactly what may be contradicted. The flag counts for this start only.

A transaction whose handler the new code no longer has, with no skip recorded for it, cannot
run at all: the start is refused, naming the handler and its epochs.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from epochal.actors.api import App
from epochal.actors.snapshots import carried_of
from epochal.errors import RecoveryError
from epochal.log.amendments import Amendments, append_amendment, read_amendments
from epochal.log.client import KafkaClients
from epochal.log.command_log import KafkaCommandLog
from epochal.log.egress import read_egress_state
from epochal.recovery.snapshots import DeltaSnapshots
from epochal.schemas.commands import Amendment, AmendmentKind

__all__ = ["DeployPlan", "check_deploy", "plan_deploy"]

logger = logging.getLogger(__name__)


@dataclass
class DeployPlan:
    """What the epochs a start replays say about the running code.

    ``other_code``: ``(epoch, position, code hash)`` of each epoch logged (or re-coded) by other
    code; ``released``: the command-log position before which egress is out (the furthest any
    writer got); ``missing``: per handler the running code lacks, its unskipped transactions'
    epochs.
    """

    running: str
    other_code: list[tuple[int, int, str]] = field(default_factory=list)
    released: int = 0
    missing: dict[str, list[int]] = field(default_factory=dict)
    last_epoch: int = -1

    @property
    def released_other_code(self) -> list[tuple[int, int, str]]:
        return [e for e in self.other_code if e[1] < self.released]


def plan_deploy(
    app: App,
    clients: KafkaClients,
    snapshots: DeltaSnapshots | None,
    amendments: Amendments,
) -> DeployPlan:
    """Read the epochs after the latest snapshot and what was released (no change is made)."""
    running = app.code_hash()
    plan = DeployPlan(running)
    latest = snapshots.latest() if snapshots is not None else None
    if latest is not None and latest.recovery != "strong":
        return plan  # positions of no command log: the worker says the mode differs
    if latest is not None:
        plan.last_epoch = latest.epoch
        for emitted in carried_of(latest):  # interior transactions the snapshot still owes
            if emitted.handler not in app.handlers:
                plan.missing.setdefault(emitted.handler, []).append(latest.epoch + 1)
    topic = app.topics.command_log
    low, high = clients.watermarks(topic)
    start = max(latest.command_log_position if latest is not None else 0, low)
    if start >= high:
        return plan
    for read in KafkaCommandLog(clients, topic).epochs(start, to_end=True):
        record = amendments.apply(read.record)
        plan.last_epoch = record.epoch
        if record.code_hash != running:
            plan.other_code.append((record.epoch, read.position, record.code_hash))
        for txn in record.txns:
            if txn.handler not in app.handlers and txn.seq not in record.skipped:
                plan.missing.setdefault(txn.handler, []).append(record.epoch)
    if plan.other_code:
        state = read_egress_state(clients, app.name, committed=False)  # open ones count: safe
        plan.released = max((p.position for p in state.positions.values()), default=0)
    return plan


def _epochs(epochs: list[int]) -> str:
    """``epoch 4`` or ``epochs 4..9``."""
    if epochs[0] == epochs[-1]:
        return f"epoch {epochs[0]}"
    return f"epochs {epochs[0]}..{epochs[-1]}"


def _codes(entries: list[tuple[int, int, str]]) -> str:
    """The codes that ran ``entries``, short, with their epoch counts when several did."""
    counts = Counter(code[:12] for _, _, code in entries)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{code} for {n}" for code, n in counts.items())


def check_deploy(
    app: App,
    clients: KafkaClients,
    snapshots: DeltaSnapshots | None,
    allow_code_change: bool = False,
) -> DeployPlan:
    """Refuse a start that cannot replay what it must, or record that epochs never released
    run under this code. Strong recovery only: weak mode re-sequences the input after the
    snapshot, so there is nothing logged to re-run."""
    amendments = read_amendments(clients, app.name)
    plan = plan_deploy(app, clients, snapshots, amendments)
    for handler, epochs in plan.missing.items():
        raise RecoveryError(
            f"handler {handler!r} is not in this version of the app, but {len(epochs)} "
            f"transactions of {_epochs(epochs)} still to replay call it: deploy a "
            "version that has it, or send each to the dead letters (`epochal skip`)",
            handler=handler,
        )  # fmt: skip
    if not plan.other_code:
        return plan
    first, last = plan.other_code[0][0], plan.last_epoch
    released = plan.released_other_code
    if released and not allow_code_change:
        raise RecoveryError(
            f"{_epochs([e for e, _, _ in released])} after the latest snapshot ran under other "
            f"code ({_codes(released)}) and released egress (up to command-log position "
            f"{plan.released - 1}): re-running them under this code ({plan.running[:12]}) could "
            "contradict what was released. Start the version that ran them and stop it with "
            "SIGTERM or `epochal stop` (a stop is a savepoint), then deploy this one; or pass "
            "--allow-code-change to re-run them anyway"
        )
    if released:
        logger.warning(
            "--allow-code-change: %s released egress under other code (%s) and now run under "
            "this code (%s); egress up to command-log position %d may be contradicted",
            _epochs([e for e, _, _ in released]), _codes(released), plan.running[:12],
            plan.released - 1,
        )  # fmt: skip
    amendment = Amendment(
        AmendmentKind.RECODE, first, last, code_hash=plan.running,
        at_ms=int(time.time() * 1000),
        note="released, forced" if released else "never released",
    )  # fmt: skip
    append_amendment(clients, app.name, amendment)
    logger.warning(
        "epochs %d..%d were logged by other code (%s)%s: they run under this code (%s), "
        "recorded in %s", first, last, _codes(plan.other_code),
        "" if released else " and never released", plan.running[:12], app.topics.amendments,
    )  # fmt: skip
    return plan
