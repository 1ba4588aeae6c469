"""Machine-readable tables on standard output, for the commands that print them (``--format``)."""

from __future__ import annotations

from enum import Enum

import pandas as pd
import typer

from perfcast.data.tables import table_text


class OutputFormat(str, Enum):
    """What a listing command prints: a human table, or CSV, JSON (an array of rows) or JSON Lines."""

    TABLE = "table"
    CSV = "csv"
    JSON = "json"
    JSONL = "jsonl"


def echo_table(frame: pd.DataFrame, fmt: OutputFormat) -> None:
    """Print ``frame`` to stdout as CSV, JSON or JSON Lines (empty cells as empty / null)."""
    if fmt is OutputFormat.JSON:
        typer.echo("[" + table_text(frame, "json", first=True) + "]")
    else:
        typer.echo(table_text(frame, fmt.value, first=True), nl=False)
