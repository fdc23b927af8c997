"""The pytest plugin of :mod:`epochal.testing` (registered as ``pytest11`` entry point
``epochal``): the ``epochal_app`` fixture.

::

    def test_deposit(epochal_app):
        t = epochal_app(app, partitions=4)
        t.send("transfers", Deposit("acct-0001", 100))
        t.run()

The harness is imported when a test asks for the fixture, not when pytest loads the plugin:
every pytest run in an environment with epochal installed loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:
    from epochal.actors.api import App
    from epochal.testing import AppTest

__all__ = ["AppTestFactory", "epochal_app"]


class AppTestFactory(Protocol):
    """``epochal_app(app, partitions=1, **options)``: a fresh :class:`AppTest` each call."""

    def __call__(self, app: App, partitions: int = 1, **options: Any) -> AppTest: ...


@pytest.fixture
def epochal_app() -> AppTestFactory:
    """Make :class:`~epochal.testing.AppTest` harnesses: ``epochal_app(app, partitions=4)``."""
    from epochal.testing import AppTest

    def make(app: App, partitions: int = 1, **options: Any) -> AppTest:
        return AppTest(app, partitions, **options)

    return make
