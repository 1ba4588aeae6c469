"""``perfcast calibrate steps``: fit per-cluster step corrections from the user's measured runs.

The input is a run table whose rows carry ``measured_step_ms`` (one to five runs per
cluster are enough; see :mod:`perfcast.models.step_calibration`). Each cluster's runs are
predicted without calibration, a correction is fitted per cluster and stored under
``<calibration folder>/steps``, where ``perfcast predict steps`` picks it up for every
later config on that cluster.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from perfcast.errors import PerfcastError, SpecError

EXIT_USER_ERROR = 2
MEASURED_COLUMN = "measured_step_ms"
_err = Console(stderr=True, soft_wrap=True)


def step_calibration_dir() -> Path:
    """Where step corrections live: the ``steps`` folder of the calibration folder."""
    from perfcast.serve.calibrate_cmd import calibration_dir

    return calibration_dir() / "steps"


def fit_step_corrections(runs: pd.DataFrame, predictor: object) -> tuple[list, pd.DataFrame]:
    """Per-cluster corrections from the valid rows of ``runs`` that have a measured step.

    Returns:
        The corrections and the predicted rows (with ``error`` for rows that were not used).

    Raises:
        SpecError: no ``measured_step_ms`` column, or no valid measured row.
    """
    from perfcast.features.run_config import parse_run_row
    from perfcast.models.step_calibration import config_cluster_key, fit_step_correction
    from perfcast.serve.batch import predict_steps_table

    if MEASURED_COLUMN not in runs:
        raise SpecError(f"the run table has no {MEASURED_COLUMN} column: calibration needs measured steps, ms")
    measured = pd.to_numeric(runs[MEASURED_COLUMN], errors="coerce").to_numpy(dtype=float)
    bad = ~(np.isfinite(measured) & (measured > 0))
    if bad.all():
        raise SpecError(f"no row has a positive {MEASURED_COLUMN}; got {runs[MEASURED_COLUMN].head(3).tolist()}")
    predicted = predict_steps_table(runs, predictor=predictor)
    usable = ~bad & (predicted["error"] == "").to_numpy()
    if not usable.any():
        raise SpecError("no row is both a valid config and measured; see the error column of `perfcast predict steps`")
    keys = np.full(len(runs), "", dtype=object)
    for pos in np.flatnonzero(usable):
        keys[pos] = config_cluster_key(parse_run_row(runs.iloc[pos].to_dict()))
    corrections = []
    for key in sorted(set(keys[usable])):
        rows = usable & (keys == key)
        pred = predicted["step_ms"].to_numpy(dtype=float)[rows]
        corrections.append(fit_step_correction(key, measured[rows], pred, model=getattr(predictor, "name", "")))
    return corrections, predicted


def calibrate_steps_command(
    runs_path: Path = typer.Argument(..., metavar="RUNS", help="Run table (CSV/Parquet) with measured_step_ms."),
    model: str | None = typer.Option(None, "--model", help="Step predictor: 'analytic', a bundle or an MLflow URI."),
    store: Path | None = typer.Option(None, "--store", help="Folder for the corrections (default: calibration/steps)."),
) -> None:
    """Fit a per-cluster correction from one to five measured steps of your own cluster."""
    from perfcast.data.tables import read_table
    from perfcast.models.step_calibration import save_step_correction
    from perfcast.serve.predictors import load_step_predictor

    try:
        runs = read_table(runs_path)
        corrections, _ = fit_step_corrections(runs, load_step_predictor(model))
    except PerfcastError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=EXIT_USER_ERROR) from None
    folder = store or step_calibration_dir()
    table = Table("cluster", "runs", "correction", title=f"step calibration, stored in {folder}")
    for corr in corrections:
        save_step_correction(corr, folder)
        table.add_row(corr.cluster, str(corr.n_runs), f"x{corr.factor:.3f}")
    Console().print(table)
