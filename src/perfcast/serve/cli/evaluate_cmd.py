"""``perfcast evaluate``: how far off predictions are.

* ``evaluate steps DATA`` / ``evaluate ops DATA``: a user's own measurements (a table with
  ``measured_step_ms`` / ``measured_ms``, a dataset folder, a torch.profiler trace, an
  Nsight Systems export, a training log) against the predictor's answers, with a parity plot
  (:mod:`perfcast.serve.measured_eval`).
* ``evaluate logo``: leave-one-GPU-out accuracy of a freshly trained op predictor beside the
  baselines, on profiling datasets.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from perfcast.errors import PerfcastError
from perfcast.serve.cli._guard import user_errors

evaluate_app = typer.Typer(
    help="Evaluate predictors on your measurements, or leave-one-GPU-out on profiling data.", no_args_is_help=True
)
_err = Console(stderr=True, soft_wrap=True)


@evaluate_app.command("logo")
def evaluate_logo_command(
    data: list[Path] = typer.Option(..., "--data", "-d", help="Dataset folders or source files (repeatable)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the Markdown tables here too."),
    coverage: float = typer.Option(0.9, "--coverage", help="Nominal coverage of the evaluated interval."),
    n_estimators: int = typer.Option(400, "--n-estimators", help="Boosting rounds per op class."),
    max_rows_per_gpu: int = typer.Option(40_000, "--max-rows-per-gpu", help="Training rows sampled per GPU."),
) -> None:
    """Hold out each GPU in turn; print MAPE, median and p90 APE, coverage and width per GPU and class."""
    from perfcast.features.hardware_spec import resolve_gpu_name
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

    with user_errors():
        run()


def _measured_command(kind: str):  # type: ignore[no-untyped-def]
    """The ``evaluate steps`` or ``evaluate ops`` command."""

    def command(
        data: Path = typer.Argument(..., help="Measured table, dataset folder, trace, nsys export or training log."),
        model: str | None = typer.Option(None, "--model", help="Predictor: 'analytic', a bundle or an MLflow URI."),
        coverage: float = typer.Option(0.9, "--coverage", help="Nominal coverage of the interval scored."),
        calibration: bool = typer.Option(True, "--calibration/--no-calibration", help="Apply stored corrections."),
        plot: Path = typer.Option(Path(f"parity_{kind}.png"), "--plot", help="Where to write the parity plot (PNG)."),
        output: Path | None = typer.Option(None, "-o", "--output", help="Write every row with its prediction here."),
        gpu: str | None = typer.Option(None, "--gpu", help="GPU of a trace or log that does not name it."),
        dtype: str | None = typer.Option(None, "--dtype", help="dtype of an nsys export."),
        top: int = typer.Option(15, "--top", min=0, help="Groups shown, worst first."),
    ) -> None:
        from rich.table import Table

        from perfcast.data.tables import write_table
        from perfcast.serve.measured_eval import GROUP, PREDICTED, evaluate_measured, load_measured
        from perfcast.serve.predictors import load_calibrated_predictor
        from perfcast.training.plots import measured_parity_plot

        def run() -> None:
            options = {("device" if kind == "ops" else "gpu"): gpu, "dtype": dtype}  # as the readers name them
            measured = load_measured(data, kind, **{k: v for k, v in options.items() if v is not None})
            predictor = load_calibrated_predictor(kind, model, calibration)
            result = evaluate_measured(measured, kind, predictor, coverage=coverage)
            s = result.summary
            cover = f", {coverage:.0%} interval covers {s['coverage']:.0%} (width {s['rel_width']:.2f})" if (
                "coverage" in s) else " (no interval)"  # fmt: skip
            typer.echo(
                f"{int(s['n'])} of {len(result.rows)} measured {kind} predicted by {predictor.name}: MAPE "
                f"{s['mape']:.1f}%, median {s['median_ape']:.1f}%, p90 {s['p90_ape']:.1f}%{cover}; "
                f"Spearman {s['spearman']:.3f}"
            )
            group = GROUP[kind]
            table = Table(title=f"by {group}, worst first")
            for col in (group, "n", "MAPE %", "median %", "p90 %", "coverage"):
                table.add_column(col)
            for row in result.by_group.head(top).to_dict("records"):
                cov = f"{row['coverage']:.0%}" if "coverage" in row and row["coverage"] == row["coverage"] else ""
                table.add_row(str(row[group]), f"{row['n']:.0f}", f"{row['mape']:.1f}", f"{row['median_ape']:.1f}",
                              f"{row['p90_ape']:.1f}", cov)  # fmt: skip
            Console().print(table)
            figure = measured_parity_plot(result.rows, *PREDICTED[kind], group, f"{kind}: {predictor.name}")
            plot.parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(plot, dpi=120)
            _err.print(f"parity plot: {plot}")
            if output is not None:
                write_table(result.rows, output)
                _err.print(f"rows with predictions: {output}")

        with user_errors():
            run()

    command.__doc__ = (
        f"Compare your measured {kind} with perfcast's predictions: MAPE, median and p90 error, "
        "interval coverage, rank correlation, the worst groups and a parity plot."
    )
    return command


evaluate_app.command("steps")(_measured_command("steps"))
evaluate_app.command("ops")(_measured_command("ops"))
