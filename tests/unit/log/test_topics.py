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


def test_the_status_topic_is_named_after_the_app() -> None:
    assert TopicNames("bank").status == "bank.status"
