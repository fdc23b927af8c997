from __future__ import annotations

from epochal import errors
from epochal.errors import EpochalError, LogError, SchemaError, describe_exception


def test_error_prints_its_context_after_the_message() -> None:
    error = SchemaError("not msgpack", topic="bank.in.transfers", partition=2, offset=41)
    assert str(error) == "not msgpack (topic=bank.in.transfers, partition=2, offset=41)"
    assert error.context == {"topic": "bank.in.transfers", "partition": 2, "offset": 41}


def test_missing_context_is_left_out() -> None:
    assert str(LogError("broker gone", topic=None)) == "broker gone"


def test_every_exported_error_descends_from_the_root() -> None:
    exported = [getattr(errors, name) for name in errors.__all__]
    classes = [cls for cls in exported if isinstance(cls, type)]
    assert len(classes) == len(exported) - 1  # and the one function, describe_exception
    assert all(issubclass(cls, EpochalError) for cls in classes)
    assert all(cls.__doc__ for cls in classes)


def test_any_exception_can_be_described_even_one_whose_str_raises() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError

    assert describe_exception(ValueError("bad")) == "ValueError: bad"
    assert describe_exception(KeyError()) == "KeyError"
    assert describe_exception(Unprintable()) == "Unprintable: <unprintable message>"
