"""Topic names of an application (docs/recovery.md), in one place."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TopicNames"]


@dataclass(frozen=True)
class TopicNames:
    """``<app>.in.<name>``, ``<app>.requests``, ``<app>.cmd``, ``<app>.out.<name>``, ``<app>.dlq``.

    >>> TopicNames("bank").input("transfers")
    'bank.in.transfers'
    """

    app: str

    def input(self, name: str) -> str:
        return f"{self.app}.in.{name}"

    def is_input(self, topic: str) -> bool:
        """Named like an input of this app, whether a transaction reads it or not: the
        sequencer reads every such topic, so that records produced to a misspelt one are
        dead-lettered (no transaction reads it) instead of never seen.

        >>> TopicNames("bank").is_input("bank.in.transfrs")
        True
        """
        return topic.startswith(f"{self.app}.in.")

    def egress(self, name: str) -> str:
        return f"{self.app}.out.{name}"

    @property
    def requests(self) -> str:
        return f"{self.app}.requests"

    @property
    def replies(self) -> str:
        """The outcomes of client transactions, for the client library (``ClientReply``)."""
        return f"{self.app}.replies"

    @property
    def command_log(self) -> str:
        return f"{self.app}.cmd"

    @property
    def dead_letters(self) -> str:
        return f"{self.app}.dlq"

    @property
    def amendments(self) -> str:
        """Compacted: skipped transactions and re-coded epochs (``log/amendments.py``)."""
        return f"{self.app}.amendments"

    @property
    def egress_positions(self) -> str:
        """Compacted: how far each egress writer has released egress (``log/egress.py``)."""
        return f"{self.app}.egress-positions"

    @property
    def status(self) -> str:
        """Compacted: each process's latest status record, for ``epochal status``
        (``log/status.py``)."""
        return f"{self.app}.status"
