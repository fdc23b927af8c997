"""The ``epochal`` command's parser and answers that need no broker, Spark or warehouse."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from epochal.cli import _parser, _sigterm_as_exit, main


def _parsers(
    parser: argparse.ArgumentParser, path: str = "epochal"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """The parser and every subparser under it, with the command line that reaches it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _has_default(action: argparse.Action) -> bool:
    """An option with a value to tell: not a ``store_true`` flag (its default is its absence),
    nor a repeatable one that starts empty."""
    default = action.default
    if not action.option_strings or default is None or default is argparse.SUPPRESS:
        return False
    if action.nargs == 0 and isinstance(default, bool):
        return False
    return default != []


def test_help_shows_every_default() -> None:
    hidden = []
    for path, parser in _parsers(_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if _has_default(action):
                text = " ".join(formatter._format_action(action).split())
                told = "default" in (action.help or "")  # worked out at run time, said in words
                if not told and f"(default: {action.default})" not in text:
                    hidden.append(f"{path} {'/'.join(action.option_strings)}: {text}")
    assert not hidden, "\n".join(hidden)


def test_help_walk_reaches_every_command() -> None:
    paths = {path for path, _ in _parsers(_parser())}
    assert {"epochal run", "epochal kafka", "epochal sql", "epochal snapshots"} <= paths


def test_replay_show_of_an_unknown_actor_type_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Said before anything is read (no broker here), naming what the app has instead."""
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # else replay re-executes itself under it
    app = "tests.unit.actors.workload:app"
    code = main(["replay", app, "--show", "Account", "--show", "Unknown", "--bootstrap", "x:1"])
    assert code == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "--show Unknown: testbank has no such actor type" in said
    assert "(its actor types: Account, AuditLog)" in said


@pytest.mark.parametrize("flag", ["--workers", "--partitions"])
@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_workers_and_partitions_below_one_are_refused(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """0 once meant "the default" without a word; the default is the flag left out."""
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["run", "examples.bank.app:app", flag, value])
    assert exited.value.code == 2
    said = capsys.readouterr().err
    assert f"argument {flag}: " in said
    assert f"got {value}" in said or f"got {value!r}" in said


def test_workers_and_partitions_left_out_are_worked_out_at_run_time() -> None:
    args = _parser().parse_args(["run", "examples.bank.app:app"])
    assert args.workers is None and args.partitions is None
    assert _parser().parse_args(["run", "x:app", "--workers", "3"]).workers == 3


@pytest.mark.parametrize(
    ("layout", "said"),
    [
        (["--workers", "2", "--partitions", "1"], "partitions 1 is fewer than the 2 workers:"),
        (["--partitions", "1"], "workers (the default: usable cores - 1)"),
    ],
)
def test_fewer_partitions_than_workers_is_refused_before_anything_starts(
    layout: list[str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused before anything starts or is asked of the broker; it left a worker idle."""
    monkeypatch.setattr("epochal.actors.layout.default_workers", lambda: 3)
    assert main(["run", "examples.bank.app:app", *layout, "--bootstrap", "x:1"]) == 1
    told = " ".join(capsys.readouterr().err.split())
    assert said in told and "a worker would own no partition" in told


def test_demo_and_bench_outside_a_checkout_say_so_and_what_to_do() -> None:
    """From a wheel (no ``examples/`` nor ``bench/`` beside the package) both commands stop at
    once with what is missing and where to run them instead."""
    from epochal.cli import _checkout_root
    from epochal.errors import ConfigError

    said = r"epochal demo runs from a checkout.*its nowhere/ folder is not installed.*\./dev"
    with pytest.raises(ConfigError, match=said):
        _checkout_root("demo", "nowhere/app.py")
    assert (_checkout_root("bench", "bench/cli.py") / "examples" / "bank").is_dir()


def test_a_sigterm_left_set_inside_a_c_call_still_exits_with_its_code() -> None:
    """The SystemExit a SIGTERM raised in a Kafka client's C call comes back as the cause of a
    SystemError from the next C function: ``epochal bench``/``demo`` still exit 143."""

    def interrupted(args: argparse.Namespace) -> int:
        try:
            raise SystemExit(143)  # what the handler raised, inside the C call
        except SystemExit as exc:
            raise SystemError("<built-in function monotonic> returned a result with an "
                              "exception set") from exc  # fmt: skip

    def broken(args: argparse.Namespace) -> int:
        raise SystemError("a real one")

    with pytest.raises(SystemExit) as exited:
        _sigterm_as_exit(interrupted, argparse.Namespace())
    assert exited.value.code == 143
    with pytest.raises(SystemError, match="a real one"):
        _sigterm_as_exit(broken, argparse.Namespace())
    assert _sigterm_as_exit(lambda args: 7, argparse.Namespace()) == 7
