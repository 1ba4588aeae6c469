"""``perfcast hardware``: browse the accelerator catalog.

``list`` prints every catalog entry (table, CSV, JSON or JSON Lines); ``show`` prints one entry,
found by id, alias or device name. Errors from perfcast (an unknown name, a bad format)
print one line to stderr and exit with code 2.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

import pandas as pd
import typer

from perfcast.serve.cli._guard import user_errors
from perfcast.serve.output import OutputFormat, echo_table

hardware_app = typer.Typer(
    help="Browse the hardware catalog: accelerator datasheets (dense peaks) and their aliases.",
    no_args_is_help=True,
)

# (column header, HardwareSpec attribute) of `list`; figures keep the catalog's units.
LIST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "id"),
    ("name", "name"),
    ("vendor", "vendor"),
    ("bf16 TFLOPS", "peak_bf16_tflops"),
    ("fp32 TFLOPS", "peak_fp32_tflops"),
    ("mem GiB", "mem_gib"),
    ("mem GB/s", "mem_bw_gbps"),
    ("TDP W", "tdp_w"),
    ("link GB/s", "intra_node_bw_gbps"),
)
PIPED_WIDTH = 160  # characters of table width when stdout is not a terminal


class ShowFormat(str, Enum):
    """Output formats of ``perfcast hardware show``."""

    TABLE = "table"
    JSON = "json"


def _cell(value: Any) -> str:
    """Text of a table cell: empty for unknown, no trailing ``.0`` on whole numbers."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (tuple, list)):
        return ", ".join(str(v) for v in value)
    return str(value)


def _list_rows() -> list[dict[str, Any]]:
    from perfcast.features.hardware_spec import list_hardware

    return [{header: getattr(hw, attr) for header, attr in LIST_COLUMNS} for hw in list_hardware()]


def _print_table(title: str, headers: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, header in enumerate(headers):
        text_column = i < 3
        table.add_column(header, no_wrap=i == 0 or not text_column, justify="left" if text_column else "right")
    for row in rows:
        table.add_row(*row)
    console = Console(soft_wrap=False)
    if not console.is_terminal:  # piped output has no width limit; don't squeeze columns
        console.width = max(console.width, PIPED_WIDTH)
    console.print(table)


@hardware_app.command("list")
def list_command(
    fmt: OutputFormat = typer.Option(OutputFormat.TABLE, "--format", "-f", help="table, csv, json or jsonl"),
) -> None:
    """List every accelerator of the catalog with its headline figures (link = bidirectional)."""
    with user_errors():
        rows = _list_rows()
    headers = [header for header, _ in LIST_COLUMNS]
    if fmt is not OutputFormat.TABLE:
        keys = [attr for _, attr in LIST_COLUMNS]
        echo_table(pd.DataFrame([dict(zip(keys, row.values(), strict=True)) for row in rows]), fmt)
    else:
        _print_table("perfcast hardware catalog", headers, [[_cell(v) for v in row.values()] for row in rows])


@hardware_app.command("show")
def show_command(
    id_or_name: str = typer.Argument(..., metavar="ID_OR_NAME", help="catalog id, alias or device name"),
    fmt: ShowFormat = typer.Option(ShowFormat.TABLE, "--format", "-f", help="table or json"),
) -> None:
    """Show every field of one catalog entry, found by id, alias or device name."""
    from perfcast.features.hardware_spec import HardwareSpec

    with user_errors():
        hw = HardwareSpec.from_name(id_or_name)
    data = hw.model_dump(mode="json")
    if fmt is ShowFormat.JSON:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    _print_table(f"{hw.id}: {hw.name}", ["field", "value"], [[k, _cell(v)] for k, v in data.items()])
