"""The command line's one error guard: every command turns bad input into one stderr line
and exit code 2, and ``--debug`` re-raises it instead."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from perfcast.errors import PerfcastError, SpecError
from perfcast.serve.cli import EXIT_USER_ERROR, app
from perfcast.serve.cli._guard import set_debug, user_errors

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_debug():
    """``--debug`` is process state: start and leave every test without it."""
    set_debug(False)
    yield
    set_debug(False)


def test_a_perfcast_error_becomes_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exit_info, user_errors():
        raise SpecError("tp=3 does not divide num_heads=32")
    assert exit_info.value.exit_code == EXIT_USER_ERROR == 2
    assert capsys.readouterr().err == "error: tp=3 does not divide num_heads=32\n"


def test_debug_reraises_and_other_errors_pass_through() -> None:
    set_debug(True)
    with pytest.raises(SpecError), user_errors():
        raise SpecError("bad")
    with pytest.raises(RuntimeError), user_errors():
        raise RuntimeError("a bug, not bad input")


@pytest.mark.parametrize(
    "args",
    [["hardware", "show", "no-such-gpu"], ["models", "show", "no-such-model"], ["predict", "ops", "-o", "x.txt"]],
)
def test_subcommands_share_the_guard(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == EXIT_USER_ERROR, result.output
    assert result.output.count("error:") == 1
    debug = runner.invoke(app, ["--debug", *args])
    assert isinstance(debug.exception, PerfcastError)
