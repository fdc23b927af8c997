from __future__ import annotations

from epochal.log.topics import TopicNames


def test_topic_names_follow_the_design() -> None:
    names = TopicNames("bank")
    assert names.input("transfers") == "bank.in.transfers"
    assert names.egress("receipts") == "bank.out.receipts"
    assert (names.requests, names.command_log, names.dead_letters) == (
        "bank.requests",
        "bank.cmd",
        "bank.dlq",
    )
