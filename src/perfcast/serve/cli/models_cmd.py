"""``perfcast models list|show``: browse the model presets."""

from __future__ import annotations

import json
import sys

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from perfcast.serve.cli._guard import user_errors
from perfcast.serve.output import OutputFormat, echo_table, format_cell

models_app = typer.Typer(help="Browse the model presets.", no_args_is_help=True)
_out = Console(width=None if sys.stdout.isatty() else 160)


@models_app.command("list")
def models_list(
    fmt: OutputFormat = typer.Option(OutputFormat.TABLE, "--format", "-f", help="table, csv, json or jsonl"),
) -> None:
    """List the model presets with their parameter counts."""
    from perfcast.features.model import TransformerSpec, list_models

    rows = []
    for name in list_models():
        m = TransformerSpec.from_name(name)
        rows.append({"id": name, "num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_heads": m.num_heads,
                     "num_kv_heads": m.kv_heads, "ffn_hidden_size": m.ffn_size, "num_experts": m.num_experts,
                     "params_b": round(m.num_params / 1e9, 2),
                     "active_params_b": round(m.num_active_params / 1e9, 2)})  # fmt: skip
    if fmt is not OutputFormat.TABLE:
        echo_table(pd.DataFrame(rows), fmt)
        return
    table = Table(title="model presets")
    for col in ("id", "layers", "hidden", "heads", "kv heads", "ffn", "experts", "params (B)", "active (B)"):
        table.add_column(col)
    for row in rows:
        table.add_row(*[format_cell(v) if not isinstance(v, str) else v for v in row.values()])
    _out.print(table)


@models_app.command("show")
def models_show(
    name: str = typer.Argument(..., help="Preset id, or a config.json / spec JSON path."),
    fmt: OutputFormat = typer.Option(OutputFormat.JSON, "--format", "-f", help="json (default), table, csv or jsonl"),
) -> None:
    """Print a model spec, with its parameter counts."""
    from perfcast.features.model import TransformerSpec

    def run() -> None:
        m = TransformerSpec.load(name)
        data = m.model_dump(mode="json")
        data["num_params"] = m.num_params
        data["num_active_params"] = m.num_active_params
        if fmt is OutputFormat.JSON:
            typer.echo(json.dumps(data, indent=2))
        elif fmt is OutputFormat.TABLE:
            table = Table("field", "value", title=m.name)
            for key, value in data.items():
                table.add_row(key, format_cell(value) if isinstance(value, int | float) else str(value))
            _out.print(table)
        else:
            echo_table(pd.DataFrame([{k: json.dumps(v) if isinstance(v, dict) else v for k, v in data.items()}]), fmt)

    with user_errors():
        run()
