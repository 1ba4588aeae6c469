"""``perfcast train ops|steps``: train, evaluate and register predictors in MLflow."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from perfcast.serve.cli._guard import user_errors
from perfcast.training.defaults import DEFAULT_CORRECTION_SCALE

train_app = typer.Typer(help="Train predictors; every run is tracked in MLflow.", no_args_is_help=True)
_err = Console(stderr=True, soft_wrap=True)


def _default_output() -> Path:
    return Path("bundles") / f"ops-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"


@train_app.command("ops")
def train_ops_command(
    data: list[Path] = typer.Option(..., "--data", "-d", help="Dataset folders or source files (repeatable)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Bundle folder (default: bundles/ops-<UTC>)."),
    experiment: str = typer.Option("perfcast", "--experiment", help="MLflow experiment name."),
    register: str | None = typer.Option("perfcast-ops", "--register", help="Registered model name ('' to skip)."),
    evaluate: bool = typer.Option(True, "--evaluate/--no-evaluate", help="Leave-one-GPU-out evaluation first."),
    collectives: bool = typer.Option(
        True, "--collectives/--no-collectives", help="Fit the collective model (else: catalog alpha-beta)."
    ),
    track: bool = typer.Option(
        True, "--track/--no-track", help="Log the run to MLflow (MLFLOW_TRACKING_URI or ./mlflow.db)."
    ),
    n_estimators: int = typer.Option(400, "--n-estimators", help="Boosting rounds per op class."),
    max_rows_per_gpu: int = typer.Option(40_000, "--max-rows-per-gpu", help="Training rows sampled per GPU."),
    timing: bool = typer.Option(
        False,
        "--timing/--no-timing",
        help="Learn a launch term per timing method (CUDA events around a call, kernel time ...) and predict "
        "queries as kernel time inside a step (default: pool the methods, as the shipped default does).",
    ),
    dask: str | None = typer.Option(
        None, "--dask", help="Train the boosters on Dask (xgboost.dask): 'local' (a LocalCluster) or an address."
    ),
) -> None:
    """Train the op predictor on measured op records and save it as a bundle.

    With ``--dask`` every booster (the op classes' and the interval's inner folds) trains on
    the cluster with ``xgboost.dask``; the rest runs here and the bundle is the same kind.
    """
    from perfcast.features.hardware_spec import resolve_gpu_name
    from perfcast.training.train_ops import load_op_records, median_summary, train_op_predictor

    out = output or _default_output()
    params = {"n_estimators": n_estimators, "max_rows_per_gpu": max_rows_per_gpu, "timing": timing}

    def run() -> None:
        records, cards = load_op_records(data, resolve_gpu=resolve_gpu_name)
        _err.print(
            f"{len(records)} op records from {len(data)} input(s), GPUs: {', '.join(sorted(records.gpu.unique()))}"
        )

        def train() -> None:
            result = train_op_predictor(records, output=out, params=params, evaluate=evaluate, collectives=collectives,
                                        cards=cards,
                                        progress=lambda msg: _err.print(f"[dim]{msg}[/dim]"))  # fmt: skip
            if result.logo is not None:
                _print_summary(median_summary(result.logo))
            _err.print(f"fit {result.n_compute_rows} compute + {result.n_collective_rows} collective rows in "
                       f"{result.fit_seconds:.1f} s; bundle: {result.bundle_path}")  # fmt: skip
            if track:
                _log_model(result.bundle_path, register or None, "ops")

        if dask is None:
            _maybe_tracked(train, track=track, experiment=experiment, run_name=out.name)
            return
        from perfcast.models.boosting import train_on_dask
        from perfcast.serve.dask_predict import dask_client

        with dask_client(dask) as client, train_on_dask(client):
            _err.print(f"training the boosters on Dask at {client.scheduler.address}")
            _maybe_tracked(train, track=track, experiment=experiment, run_name=out.name)

    with user_errors():
        run()


@train_app.command("steps")
def train_steps_command(
    data: Path | None = typer.Option(
        None, "--data", "-d", help="Folder with the measured run sources (vTrain, NeuSight, MLPerf files)."
    ),
    runs: list[Path] = typer.Option([], "--runs", help="Your own run tables with measured_step_ms (repeatable)."),
    sources: str = typer.Option(
        "vtrain,neusight,mlperf,published", "--sources", help="Run sources to read from --data."
    ),
    model_type: str = typer.Option("gbdt", "--model-type", help="Step model: gbdt or gnn."),
    correction_scale: float = typer.Option(
        DEFAULT_CORRECTION_SCALE,
        "--correction-scale",
        min=0.0,
        max=1.0,
        help="GBDT: share of the learned log correction applied over the composed physics (1 = all of it).",
    ),  # fmt: skip
    op_model: str | None = typer.Option(
        None, "--op-model", help="Op predictor bundle to compose with (default: shipped)."
    ),
    output: Path | None = typer.Option(None, "-o", "--output", help="Bundle folder (default: bundles/steps-<UTC>)."),
    experiment: str = typer.Option("perfcast", "--experiment", help="MLflow experiment name."),
    register: str | None = typer.Option("perfcast-steps", "--register", help="Registered model name ('' to skip)."),
    evaluate: bool = typer.Option(True, "--evaluate/--no-evaluate", help="Evaluate on the held-out splits first."),
    track: bool = typer.Option(
        True, "--track/--no-track", help="Log the run to MLflow (MLFLOW_TRACKING_URI or ./mlflow.db)."
    ),
) -> None:
    """Train a step model (GBDT or GNN) on measured runs, over steps composed by an op predictor."""
    import pandas as pd

    from perfcast.data.tables import read_table
    from perfcast.errors import SpecError
    from perfcast.models.bundle import PredictorBundle
    from perfcast.serve.predictors import load_op_predictor
    from perfcast.training.train_steps import load_runs, train_step_predictor

    out = output or Path("bundles") / f"steps-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"

    def run() -> None:
        frames = [load_runs(data, [s.strip() for s in sources.split(",") if s.strip()])] if data else []
        frames += [read_table(path).assign(source="user", timing_scope="step") for path in runs]
        if not frames:
            raise SpecError("give --data (a folder of run sources) and/or --runs (run tables with measured_step_ms)")
        table = pd.concat(frames, ignore_index=True)
        if "measured_step_ms" not in table:
            raise SpecError("the run tables have no measured_step_ms column: training needs measured steps, ms")
        table = table[pd.to_numeric(table["measured_step_ms"], errors="coerce") > 0].reset_index(drop=True)
        bundle = load_op_predictor(op_model)
        if not isinstance(bundle, PredictorBundle):
            raise SpecError(f"--op-model {op_model!r} is not a learned op bundle; steps are composed from one")
        _err.print(f"{len(table)} measured runs: {table['source'].value_counts().to_dict()}")

        def train() -> None:
            params = {"correction_scale": correction_scale} if model_type == "gbdt" else {}
            say = lambda msg: _err.print(f"[dim]{msg}[/dim]")  # noqa: E731
            result = train_step_predictor(table, bundle, output=out, model_type=model_type, evaluate=evaluate,
                                          params=params, progress=say)  # fmt: skip
            if result.evaluation is not None:
                _print_step_evaluation(result.evaluation)
            _err.print(f"fit on {result.n_runs} runs ({result.n_invalid} invalid configs left out) in "
                       f"{result.fit_seconds:.1f} s; bundle: {result.bundle_path}")  # fmt: skip
            if track:
                _log_model(result.bundle_path, register or None, "steps")

        _maybe_tracked(train, track=track, experiment=experiment, run_name=out.name)

    with user_errors():
        run()


def _print_step_evaluation(evaluation) -> None:  # type: ignore[no-untyped-def]
    table = Table(title="held-out step evaluation (APE in %, coverage of the 90% interval)")
    for col in ("split", "predictor", "n_test", "MAPE", "median APE", "p90 APE", "coverage", "Spearman"):
        table.add_column(col)
    for row in evaluation.to_dict("records"):
        cov = row.get("coverage")
        table.add_row(row["split"], row["predictor"], str(row["n_test"]), f"{row['mape']:.1f}",
                      f"{row['median_ape']:.1f}", f"{row['p90_ape']:.1f}",
                      f"{100 * cov:.0f}%" if cov is not None and cov == cov else "-",
                      f"{row['spearman_mean']:.3f}")  # fmt: skip
    Console().print(table)


def _maybe_tracked(train: Callable[[], None], *, track: bool, experiment: str, run_name: str) -> None:
    """Run ``train`` inside an MLflow run when ``track``, else as is."""
    if not track:
        train()
        return
    from perfcast.training import tracking

    with tracking.tracked_run(experiment, run_name=run_name) as active:
        train()
        _err.print(f"MLflow run {active.info.run_id} at {tracking.tracking_uri()}")


def _log_model(bundle: Path, register: str | None, kind: str) -> None:
    from perfcast.training.tracking import log_pyfunc_model

    info = log_pyfunc_model(bundle, kind=kind, register=register)
    where = f"models:/{register}/{info.registered_model_version}" if register else info.model_uri
    _err.print(f"logged pyfunc model {info.model_uri}" + (f", registered as {where}" if register else ""))


def _print_summary(summary) -> None:  # type: ignore[no-untyped-def]
    table = Table(title="leave-one-GPU-out, median over held-out GPUs")
    for col in summary.columns:
        table.add_column(col)
    for row in summary.itertuples(index=False):
        table.add_row(*[f"{v:.3g}" if isinstance(v, float) else str(v) for v in row])
    Console().print(table)
