"""The command line's one error guard: what a :class:`~perfcast.errors.PerfcastError` does.

Bad input (any :class:`~perfcast.errors.PerfcastError`) prints ``error: <message>`` as one
line on stderr and exits with :data:`EXIT_USER_ERROR`; after ``perfcast --debug`` the
exception propagates with its traceback instead. Every command wraps its work in
:func:`user_errors`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from perfcast.errors import PerfcastError

EXIT_USER_ERROR = 2
"""Exit code of a command stopped by bad input."""

_state = {"debug": False}


def set_debug(debug: bool) -> None:
    """Let :func:`user_errors` re-raise (``--debug``) or print one line (the default)."""
    _state["debug"] = debug


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a :class:`~perfcast.errors.PerfcastError` raised in the block into one stderr line
    and ``typer.Exit(EXIT_USER_ERROR)`` (re-raised unchanged under ``--debug``)."""
    try:
        yield
    except PerfcastError as exc:
        if _state["debug"]:
            raise
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=EXIT_USER_ERROR) from None
