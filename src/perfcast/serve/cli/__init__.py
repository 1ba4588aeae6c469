"""The ``perfcast`` command line (Typer): :data:`app` is the console script's entry point.

One module per command group (``*_cmd.py``); :mod:`.main` assembles them under the root
app, and :mod:`._guard` is the one place bad input becomes an exit code.
"""

from __future__ import annotations

from perfcast.serve.cli._guard import EXIT_USER_ERROR
from perfcast.serve.cli.main import app

__all__ = ["EXIT_USER_ERROR", "app"]
