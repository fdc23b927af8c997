from __future__ import annotations

from pathlib import Path

from epochal.actors.layout import _parse_cpulist, default_workers, numa_cpus, worker_cpus


def test_cpulists_parse() -> None:
    assert _parse_cpulist("0-3,8-9,12\n") == [0, 1, 2, 3, 8, 9, 12]


def test_workers_spread_over_nodes_first() -> None:
    assert worker_cpus(4, [[0, 1], [2, 3]]) == [0, 2, 1, 3]
    assert worker_cpus(3, [[0, 1, 2, 3]]) == [0, 1, 2]
    assert worker_cpus(5, [[0], [1]]) == [0, 1, 0, 1, 0]


def test_without_numa_information_all_cpus_form_one_node(tmp_path: Path) -> None:
    nodes = numa_cpus(tmp_path)
    assert len(nodes) == 1 and nodes[0]


def test_default_workers_leave_a_core_to_the_sequencer_and_are_at_least_one() -> None:
    assert default_workers([[0]]) == 1
    assert default_workers([[0, 1]]) == 1
    assert default_workers([[0, 1, 2, 3], [4, 5, 6, 7]]) == 7
