"""The root ``perfcast`` app: global options (``--debug``, ``--verbose``, ``--version``) and
every command group, each from its own module.

Errors that bad input causes print one line to stderr and exit with code 2 (see
:mod:`perfcast.serve.cli._guard`); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import logging
import sys
import warnings

import typer
from rich.console import Console

from perfcast.serve.cli._guard import set_debug
from perfcast.serve.cli.calibrate_cmd import calibrate_command
from perfcast.serve.cli.calibrate_steps_cmd import calibrate_steps_command
from perfcast.serve.cli.data_cmd import data_app
from perfcast.serve.cli.evaluate_cmd import evaluate_app
from perfcast.serve.cli.hardware_cmd import hardware_app
from perfcast.serve.cli.models_cmd import models_app
from perfcast.serve.cli.predict_cmd import predict_app
from perfcast.serve.cli.profile_cmd import profile_command
from perfcast.serve.cli.search_cmd import search_command
from perfcast.serve.cli.serve_cmd import serve_command
from perfcast.serve.cli.train_cmd import train_app

app = typer.Typer(
    help="perfcast: predict the time of deep-learning operators and distributed training steps.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(predict_app, name="predict")
app.add_typer(hardware_app, name="hardware")
app.add_typer(models_app, name="models")
app.add_typer(data_app, name="data")
app.command("profile")(profile_command)
app.add_typer(train_app, name="train")
calibrate_app = typer.Typer(
    help="Correct predictions with measurements of your own hardware: ops (this device) or steps (your runs).",
    invoke_without_command=True,
)
calibrate_app.callback()(calibrate_command)
calibrate_app.command("steps")(calibrate_steps_command)
app.add_typer(calibrate_app, name="calibrate")
app.add_typer(evaluate_app, name="evaluate")
app.command("serve")(serve_command)
app.command("search")(search_command)

_err = Console(stderr=True, soft_wrap=True)


def _one_line_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
    """Print a warning as one line on stderr, without the source line Python adds."""
    _err.print(f"[yellow]warning:[/yellow] {message}", highlight=False, markup=True)


def _print_version(value: bool) -> None:
    if value:
        from perfcast import __version__

        typer.echo(f"perfcast {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks instead of one-line errors."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details to stderr."),
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """perfcast: predict training performance before you run it."""
    set_debug(debug)
    warnings.showwarning = _one_line_warning
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
