"""Snapshots to Delta Lake (delta-rs) and recovery: strong replay of the command log, weak
re-sequencing of the input topics, and their PySpark jobs. Lands with the snapshot issue."""

from epochal.recovery.replay import replay_command_log

__all__ = ["replay_command_log"]
