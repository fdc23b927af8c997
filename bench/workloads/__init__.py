"""The benchmark workloads ``epochal bench`` runs, by name (:mod:`bench.workloads.base`)."""

from __future__ import annotations

from bench.workloads.base import Workload
from bench.workloads.leaderboard import Leaderboard
from bench.workloads.tspoon import TSpoonBank
from bench.workloads.tstream import GrepSum, OnlineBidding, StreamingLedger, TollProcessing
from bench.workloads.ycsbt import YcsbT

__all__ = ["WORKLOADS"]

WORKLOADS: dict[str, type[Workload]] = {
    w.name: w
    for w in (
        YcsbT,
        GrepSum,
        StreamingLedger,
        OnlineBidding,
        TollProcessing,
        Leaderboard,
        TSpoonBank,
    )
}
