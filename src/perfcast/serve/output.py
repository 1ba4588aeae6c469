"""How commands print tables on standard output: machine-readable (``--format``) and the text
of one cell in a human table."""

from __future__ import annotations

from enum import Enum

import numpy as np
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


def format_cell(value: object) -> str:
    """A cell as plain text: whole numbers and values from 1,000 up with thousands separators,
    others to 4 significant digits, never in e-notation; empty for NaN and None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "" if value is None else str(value)
    if value != value:  # NaN
        return ""
    if abs(value) >= 1000 or float(value).is_integer():
        return f"{value:,.0f}"
    return np.format_float_positional(float(value), precision=4, unique=False, fractional=False, trim="-")
