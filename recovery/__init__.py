"""Snapshots to Delta Lake (delta-rs) and recovery: strong replay of the command log, weak
re-sequencing of the input topics, and their PySpark jobs. Lands with the snapshot issue."""

__all__: list[str] = []
