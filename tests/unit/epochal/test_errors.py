from __future__ import annotations

from epochal import errors
from epochal.errors import EpochalError, LogError, SchemaError


def test_error_prints_its_context_after_the_message() -> None:
    error = SchemaError("not msgpack", topic="bank.in.transfers", partition=2, offset=41)
    assert str(error) == "not msgpack (topic=bank.in.transfers, partition=2, offset=41)"
    assert error.context == {"topic": "bank.in.transfers", "partition": 2, "offset": 41}


def test_missing_context_is_left_out() -> None:
    assert str(LogError("broker gone", topic=None)) == "broker gone"


def test_every_exported_error_descends_from_the_root() -> None:
    exported = [getattr(errors, name) for name in errors.__all__]
    assert all(issubclass(cls, EpochalError) for cls in exported)
    assert all(cls.__doc__ for cls in exported)
