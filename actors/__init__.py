"""Actors and transactions: the user API, partitions, the epoch executor, workers, live queries.

The engine lands here with the transactional actors issue; this package exists so that the
layout follows the data flow from the first commit.
"""

__all__: list[str] = []
