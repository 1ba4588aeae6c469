"""``perfcast evaluate ops``: leave-one-GPU-out accuracy of the op predictor beside the baselines."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from perfcast.errors import PerfcastError

EXIT_USER_ERROR = 2
evaluate_app = typer.Typer(help="Evaluate predictors the way they are used (unseen GPUs).", no_args_is_help=True)
_err = Console(stderr=True, soft_wrap=True)


@evaluate_app.command("ops")
def evaluate_ops_command(
    data: list[Path] = typer.Option(..., "--data", "-d", help="Dataset folders or source files (repeatable)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the Markdown tables here too."),
    coverage: float = typer.Option(0.9, "--coverage", help="Nominal coverage of the evaluated interval."),
    n_estimators: int = typer.Option(400, "--n-estimators", help="Boosting rounds per op class."),
    max_rows_per_gpu: int = typer.Option(40_000, "--max-rows-per-gpu", help="Training rows sampled per GPU."),
) -> None:
    """Hold out each GPU in turn; print MAPE, median and p90 APE, coverage and width per GPU and class."""
    from perfcast.features.hardware import resolve_gpu_name
    from perfcast.features.op_features import featurize_ops
    from perfcast.models.op_model import OpTimeRegressor
    from perfcast.training.evaluate import evaluate_logo, evaluation_class, markdown_table
    from perfcast.training.train_ops import COLLECTIVE_CLASS, load_op_records

    def run() -> None:
        records, _ = load_op_records(data, resolve_gpu=resolve_gpu_name)
        op_class = featurize_ops(records)["op_class"]
        compute = records[(op_class != COLLECTIVE_CLASS).to_numpy()]
        if compute["gpu"].nunique() < 2:
            raise PerfcastError("leave-one-GPU-out needs op records of at least two GPUs")
        result = evaluate_logo(
            compute,
            compute["measured_ms"].to_numpy(dtype=float),
            make_model=lambda: OpTimeRegressor(n_estimators=n_estimators, max_rows_per_gpu=max_rows_per_gpu),
            eval_class=evaluation_class(compute, op_class[compute.index]),
            coverage=coverage,
            progress=lambda gpu: _err.print(f"[dim]holding out {gpu}[/dim]"),
        )
        text = markdown_table(result)
        typer.echo(text)
        if output is not None:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text + "\n", encoding="utf-8")

    try:
        run()
    except PerfcastError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=EXIT_USER_ERROR) from None
