"""``perfcast predict steps|ops``: batch-predict a run table or an op table into a file or
stdout, with a preview table and (steps) a breakdown plot."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from perfcast.data.tables import ERROR_COLUMN, STDOUT
from perfcast.errors import SpecError
from perfcast.models.physics_bounds import AT_CEILING_COLUMN
from perfcast.serve.cli._guard import user_errors
from perfcast.serve.output import format_cell

ERROR_PREVIEW_CHARS = 48
PLOT_ROWS = 40
"""Configs ``--plot`` draws (the first valid ones)."""
MAX_TABLE_ROWS = 10_000
"""Most rows ``--format table`` prints (write a file for more)."""
FORMAT_HELP = "Output format: table (on stdout), csv, json or jsonl; default: the -o suffix, csv for -o -."

predict_app = typer.Typer(help="Batch-predict a run table (steps) or an op table (ops).", no_args_is_help=True)
_err = Console(stderr=True, soft_wrap=True)
_out = Console(width=None if sys.stdout.isatty() else 160)


def _example(name: str) -> Path:
    return Path(str(resources.files("perfcast.examples").joinpath(name)))


Column = tuple[str, Callable[[pd.Series], str]]


def _show(df: pd.DataFrame, columns: list[Column], title: str, limit: int, *, total: int | None = None) -> None:
    """Print the first ``limit`` rows as a table (the output has every row and column) and
    say how many of the ``total`` rows are not shown."""
    table = Table(title=title)
    for header, _ in columns:
        table.add_column(header, overflow="fold")
    for _, row in df.head(limit).iterrows():
        table.add_row(*[get(row) for _, get in columns])
    _out.print(table)
    hidden = (len(df) if total is None else total) - min(limit, len(df))
    if hidden > 0:
        _out.print(f"... {hidden:,} more rows not shown (all are in the output)")


def _field(name: str) -> Callable[[pd.Series], str]:
    return lambda row: format_cell(row.get(name))


def _interval(lo: str, hi: str, show: Callable[[object], str]) -> Callable[[pd.Series], str]:
    def cell(row: pd.Series) -> str:
        if pd.isna(row.get(lo)) or pd.isna(row.get(hi)):
            return ""
        return f"{show(row[lo])} - {show(row[hi])}"

    return cell


def _duration(value: object) -> str:
    """A time in ms as people read it: ms below a second, then s, min or h."""
    if not isinstance(value, int | float) or value != value:
        return ""
    ms = float(value)
    for unit, size, limit in (("ms", 1.0, 1e3), ("s", 1e3, 60e3), ("min", 60e3, 3600e3), ("h", 3600e3, float("inf"))):
        if abs(ms) < limit:
            return f"{format_cell(ms / size)} {unit}"
    return ""


def _timed(name: str) -> Callable[[pd.Series], str]:
    return lambda row: _duration(row.get(name))


def _flag(name: str) -> Callable[[pd.Series], str]:
    return lambda row: "yes" if pd.notna(row.get(name)) and bool(row.get(name)) else ""


def _short_error(row: pd.Series) -> str:
    text = str(row.get(ERROR_COLUMN) or "")
    return text if len(text) <= ERROR_PREVIEW_CHARS else text[: ERROR_PREVIEW_CHARS - 1] + "…"


def _layout(row: pd.Series) -> str:
    """The row's stated parallel degrees above 1 (``etp`` and ``vpp`` too), its ZeRO stage and recomputation."""
    parts = [
        f"{k}{format_cell(row.get(k))}"
        for k in ("tp", "pp", "vpp", "dp", "cp", "ep", "etp")
        if format_cell(row.get(k)) not in ("", "1")
    ]
    if format_cell(row.get("zero_stage")) not in ("", "0"):
        parts.append(f"zero{format_cell(row.get('zero_stage'))}")
    if format_cell(row.get("recompute")) not in ("", "none"):
        parts.append(f"rc:{format_cell(row.get('recompute'))}")
    return " ".join(parts) or "1 GPU"


def _mfu(row: pd.Series) -> str:
    """MFU in percent, marked where the step sits on its MFU ceiling (``at_mfu_ceiling``)."""
    if pd.isna(row.get("mfu")):
        return ""
    capped = row.get(AT_CEILING_COLUMN)
    return f"{format_cell(100 * row['mfu'])}%" + (" (ceiling)" if pd.notna(capped) and bool(capped) else "")


def _model_name(row: pd.Series) -> str:
    name = format_cell(row.get("model"))
    return name or f"L{format_cell(row.get('num_layers'))} h{format_cell(row.get('hidden_size'))}"


def _op_shape(row: pd.Series) -> str:
    names = ("batch", "m", "n", "k", "rows", "cols", "heads", "seq_q", "seq_kv", "head_dim", "bytes", "n_ranks")
    return " ".join(f"{k}={format_cell(row.get(k))}" for k in names if format_cell(row.get(k)))


STEP_COLUMNS: list[Column] = [
    ("model", _model_name),
    ("gpu", _field("gpu")),
    ("gpus", _field("num_gpus")),
    ("layout", _layout),
    ("step", _timed("step_ms")),
    ("interval", _interval("step_lo_ms", "step_hi_ms", _duration)),
    ("mem GiB", _field("peak_mem_gib")),
    ("fits", _field("fits_memory")),
    ("MFU", _mfu),
    ("tokens/s", _field("tokens_per_s")),
    ("extrapolates", _flag("out_of_domain")),
    ("error", _short_error),
]
OP_COLUMNS_SHOWN: list[Column] = [
    ("op", _field("op")),
    ("shape", _op_shape),
    ("dtype", _field("dtype")),
    ("gpu", _field("gpu")),
    ("pred ms", _field("pred_ms")),
    ("lo", _field("pred_lo_ms")),
    ("hi", _field("pred_hi_ms")),
    ("extrapolates", _flag("out_of_domain")),
    ("error", _short_error),
]


def _input(path: Path | None, example: str) -> Path:
    if path is not None:
        return path
    default = _example(example)
    _err.print(f"[dim]no input given: using the packaged example {default}[/dim]")
    return default


@predict_app.command("steps")
def predict_steps(
    input_path: Path | None = typer.Argument(
        None, metavar="IN", help="Run table, CSV or Parquet (default: packaged example)."
    ),
    output: str = typer.Option(
        ..., "-o", "--output", help="Predictions file (.csv, .csv.gz, .parquet, .json, .jsonl), or - for stdout."
    ),
    fmt: str | None = typer.Option(None, "--format", help=FORMAT_HELP),
    model: str | None = typer.Option(
        None,
        "--model",
        help="'analytic' (every op at its roofline: an optimistic baseline), 'composed' (the learned op model "
        "through the schedule, no step correction), a bundle folder or an MLflow URI (models:/NAME/VERSION); "
        "default: shipped.",
    ),
    coverage: float = typer.Option(0.9, "--coverage", help="Nominal coverage of the interval step_lo_ms..step_hi_ms."),
    breakdown: bool = typer.Option(
        False, "--breakdown", help="Add compute, attention, exposed communication, bubble, optimizer and memory parts."
    ),
    plot: Path | None = typer.Option(
        None, "--plot", help="Save a PNG of where each config's step time goes (turns on --breakdown)."
    ),
    calibration: bool = typer.Option(
        True, "--calibration/--no-calibration", help="Apply stored per-cluster corrections (perfcast calibrate steps)."
    ),
    dask: str | None = typer.Option(None, "--dask", help="Predict on Dask: 'local' (a LocalCluster) or an address."),
    show: int = typer.Option(20, "--show", help="Rows to print as a table (0: none)."),
) -> None:
    """Predict step time (with an interval), peak memory, MFU and tokens/s of every config in a run table."""

    def run() -> None:
        path = _input(input_path, "runs.csv")
        target = _target(output, fmt)
        parts = breakdown or plot is not None
        if dask and parts:
            raise SpecError("--breakdown and --plot are not available with --dask; predict without --dask")
        rows, n_bad, preview, name = _predict_file(
            "steps", path, output, target, model=model, coverage=coverage, calibration=calibration, dask=dask,
            breakdown=parts, preview_rows=max(show, PLOT_ROWS if plot else 0),
        )  # fmt: skip
        _report(preview, STEP_COLUMNS, f"step predictions ({name})", show, output, target, rows, n_bad)
        if plot is not None:
            _plot_breakdown(preview, plot)

    with user_errors():
        run()


@predict_app.command("ops")
def predict_ops(
    input_path: Path | None = typer.Argument(
        None, metavar="IN", help="Op table, CSV or Parquet (default: packaged example)."
    ),
    output: str = typer.Option(
        ..., "-o", "--output", help="Predictions file (.csv, .csv.gz, .parquet, .json, .jsonl), or - for stdout."
    ),
    fmt: str | None = typer.Option(None, "--format", help=FORMAT_HELP),
    model: str | None = typer.Option(
        None, "--model", help="'analytic', a bundle folder or an MLflow URI (models:/NAME/VERSION); default: shipped."
    ),
    coverage: float = typer.Option(0.9, "--coverage", help="Nominal coverage of the interval pred_lo_ms..pred_hi_ms."),
    calibration: bool = typer.Option(
        True, "--calibration/--no-calibration", help="Apply stored per-GPU corrections (perfcast calibrate)."
    ),
    dask: str | None = typer.Option(None, "--dask", help="Predict on Dask: 'local' (a LocalCluster) or an address."),
    show: int = typer.Option(20, "--show", help="Rows to print as a table (0: none)."),
) -> None:
    """Predict the time of every op in an op table, with an interval."""

    def run() -> None:
        path = _input(input_path, "ops.csv")
        target = _target(output, fmt)
        rows, n_bad, preview, name = _predict_file(
            "ops", path, output, target, model=model, coverage=coverage, calibration=calibration, dask=dask
        )
        _report(preview, OP_COLUMNS_SHOWN, f"op predictions ({name})", show, output, target, rows, n_bad)

    with user_errors():
        run()


def _predict_file(
    kind: str,
    path: Path,
    output: str,
    target: str,
    *,
    model: str | None,
    coverage: float,
    calibration: bool,
    dask: str | None,
    **stream_options: Any,
) -> tuple[int, int, pd.DataFrame, str]:
    """Predict the ``steps`` or ``ops`` table at ``path`` into ``output`` (on Dask, or streamed in
    chunks here with ``stream_options``): rows written, rows with an error, the preview rows and
    the predictor's name."""
    from perfcast.serve.predictors import load_calibrated_predictor

    if dask:
        from perfcast.serve.dask_predict import predict_table_dask

        result = predict_table_dask(path, kind, address=dask, ref=model, coverage=coverage, calibration=calibration)
        _write(result, output, target)
        return len(result), int((result[ERROR_COLUMN] != "").sum()), result, "dask"
    predictor = load_calibrated_predictor(kind, model, calibration)
    done = _stream(path, output, kind, predictor, target, coverage=coverage, **stream_options)
    return done.rows, done.n_errors, done.preview, predictor.name


def _target(output: str, fmt: str | None) -> str:
    """The format the predictions are written in (``table``: all rows printed on stdout), checked
    before any prediction runs."""
    from perfcast.data.table_stream import check_table_target

    if fmt == "table":
        if output != STDOUT:
            raise SpecError(f"--format table prints to stdout: use -o - (got -o {output})")
        return fmt
    return check_table_target(output, fmt)


def _write(result: pd.DataFrame, output: str, target: str) -> None:
    from perfcast.data.table_stream import TableWriter

    if target != "table":
        with TableWriter(output, target) as writer:
            writer.write(result)


def _report(
    preview: pd.DataFrame, columns: list[Column], title: str, show: int, output: str, target: str, rows: int, n_bad: int
) -> None:
    """The preview table (all rows with ``--format table``) and a summary line on stderr; nothing
    else reaches stdout when it carries the table."""
    if target == "table":
        _show(preview, columns, title, len(preview), total=rows)
    elif show and output != STDOUT:
        _show(preview, columns, title, show)
    where = "stdout" if output == STDOUT else output
    _err.print(f"wrote {rows} rows to {where} ({n_bad} invalid, reasons in `{ERROR_COLUMN}`)")


def _plot_breakdown(preview: pd.DataFrame, plot: Path) -> None:
    """Save the step-breakdown bars of the first valid configs of ``preview``."""
    from perfcast.training.plots import step_breakdown_plot

    valid = preview[preview[ERROR_COLUMN] == ""].head(PLOT_ROWS)
    if valid.empty:
        raise SpecError("--plot: no valid config to draw")
    labels = valid.apply(
        lambda r: f"{_model_name(r)} {_layout(r)} {format_cell(r.get('num_gpus'))}x{r.get('gpu')}", axis=1
    )
    plot.parent.mkdir(parents=True, exist_ok=True)
    step_breakdown_plot(valid, labels).savefig(plot, dpi=120)
    _err.print(f"plot: {plot}")


def _stream(path: Path, output: str, kind: str, predictor: object, target: str, **options: object):  # type: ignore[no-untyped-def]
    """Predict ``path`` into ``output`` chunk by chunk, with a progress bar on stderr
    (``--format table``: into memory, to print every row)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from perfcast.data.table_stream import count_rows
    from perfcast.serve.stream_predict import stream_predict

    columns = (TextColumn(f"predicting {kind}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=_err, transient=True) as bar:
        task = bar.add_task(kind, total=count_rows(path))
        advance = lambda n: bar.advance(task, n)  # noqa: E731
        if target == "table":
            options["preview_rows"] = MAX_TABLE_ROWS
            return stream_predict(path, None, kind, predictor, progress=advance, **options)
        return stream_predict(path, output, kind, predictor, progress=advance, fmt=target, **options)
