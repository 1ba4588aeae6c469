"""``perfcast calibrate steps``: fit per-cluster step corrections from the user's measured runs.

The input is a run table whose rows carry ``measured_step_ms`` (one run per cluster is
enough, three or more also fit per-part factors; see :mod:`perfcast.models.step_calibration`).
Each cluster's runs are predicted without calibration and screened: a row whose measured
value is not a positive finite time, implies an MFU above 110% of the GPUs' peak, lies more
than 20x off the prediction, is an outlier among its cluster's runs, or is not a valid
config is left out and named with its reason. A correction (a shift and, from the
predictor's breakdown of each run, a time factor for attention, the rest of the compute and
exposed communication, plus the best MFU the runs measured) is fitted per cluster for the
step predictor used and stored in the ``steps``
folder of the calibration folder (:mod:`perfcast.serve.calibration_store`), where
``perfcast predict steps`` with the same predictor picks it up for every later config on
that cluster.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import typer
from rich.console import Console
from rich.table import Column, Table

from perfcast.errors import AtMFUCeilingWarning, SpecError
from perfcast.models.predictor_protocol import StepTimePredictor
from perfcast.serve.calibration_store import FOLDER_HELP, STEPS_FOLDER, step_calibration_dir
from perfcast.serve.cli._guard import user_errors

MEASURED_COLUMN = "measured_step_ms"
_err = Console(stderr=True, soft_wrap=True)


class StepFit(NamedTuple):
    """What :func:`fit_step_corrections` returns."""

    corrections: list
    """One :class:`~perfcast.models.step_calibration.ClusterCorrection` per cluster, by cluster key."""
    predicted: pd.DataFrame
    """The predicted rows of the table (``error`` says why a row is not a valid config)."""
    refused: list[str]
    """Rows with a measured value used by no cluster (not a number, not a valid config), each with its reason."""


def fit_step_corrections(runs: pd.DataFrame, predictor: StepTimePredictor) -> StepFit:
    """Per-cluster corrections, for ``predictor``, from the rows of ``runs`` that have a measured step.

    A row with an empty ``measured_step_ms`` was not measured and is skipped silently;
    every other row that is not used is named with its reason, in ``refused`` or in its
    correction's ``excluded`` (:func:`~perfcast.models.step_calibration.fit_step_correction`).

    Raises:
        SpecError: no ``measured_step_ms`` column, no measured row, no row that is a valid
            config and measured, or a cluster none of whose runs survives the screening.
    """
    from perfcast.features.run_config import parse_run_row
    from perfcast.models.calibration import predictor_identity
    from perfcast.models.correction_store import summarize_reasons
    from perfcast.models.physics_bounds import MAX_MEASURED_MFU, measured_mfu
    from perfcast.models.step_calibration import config_cluster_key, fit_step_correction
    from perfcast.serve.batch import predict_steps_table

    if MEASURED_COLUMN not in runs:
        raise SpecError(f"the run table has no {MEASURED_COLUMN} column: calibration needs measured steps, ms")
    raw = runs[MEASURED_COLUMN]
    given = (raw.notna() & (raw.astype(str).str.strip() != "")).to_numpy()
    if not given.any():
        raise SpecError(f"no row has a {MEASURED_COLUMN} value; got {raw.head(3).tolist()}")
    measured = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    labels = [f"row {i}" for i in runs.index]
    refused = [
        f"{labels[pos]}: {MEASURED_COLUMN}={raw.iloc[pos]!r} is not a number"
        for pos in np.flatnonzero(given & np.isnan(measured))
    ]
    numeric = given & ~np.isnan(measured)
    with warnings.catch_warnings():  # the uncalibrated steps on their ceiling are what the runs correct
        warnings.simplefilter("ignore", AtMFUCeilingWarning)
        predicted = predict_steps_table(runs, predictor=predictor, breakdown=True)
    errors = predicted["error"].to_numpy(dtype=object)
    valid = errors == ""
    refused += [f"{labels[pos]}: not a valid config: {errors[pos]}" for pos in np.flatnonzero(numeric & ~valid)]
    usable = numeric & valid
    if not usable.any():
        raise SpecError(f"no row is both a valid config and measured: {summarize_reasons(refused)}")
    configs = {pos: parse_run_row(runs.iloc[pos].to_dict()) for pos in np.flatnonzero(usable)}
    mfu = np.full(len(runs), np.nan)
    timed = [pos for pos in configs if measured[pos] > 0]  # other values: screened with their own reason
    if timed:
        mfu[timed] = measured_mfu([configs[pos] for pos in timed], measured[timed])
    for pos in timed:  # a measured step faster than the GPUs' peak compute is not a step of this config
        if mfu[pos] > MAX_MEASURED_MFU:
            refused.append(
                f"{labels[pos]}: {MEASURED_COLUMN}={measured[pos]:g} implies MFU {mfu[pos]:.3g}, above "
                f"{MAX_MEASURED_MFU:.0%} of the GPUs' dense peak: check the unit (ms) and that it times one "
                "whole training step"
            )
            usable[pos] = False
            del configs[pos]
    if not usable.any():
        raise SpecError(f"no measured row is a plausible step of a valid config: {summarize_reasons(refused)}")
    keys = np.full(len(runs), "", dtype=object)
    for pos, config in configs.items():
        keys[pos] = config_cluster_key(config)
    identity = predictor_identity(predictor)
    name = str(predictor.name)
    pred = predicted["step_ms"].to_numpy(dtype=float)
    corrections = []
    for key in sorted(set(keys[usable])):
        rows = np.flatnonzero(usable & (keys == key))
        corrections.append(
            fit_step_correction(
                key,
                measured[rows],
                pred[rows],
                model=name,
                predictor=identity,
                labels=[labels[pos] for pos in rows],
                breakdown=predicted.iloc[rows],
                mfu=mfu[rows],
            )
        )
    return StepFit(corrections, predicted, refused)


def calibrate_steps_command(
    runs_path: Path = typer.Argument(..., metavar="RUNS", help="Run table (CSV/Parquet) with measured_step_ms."),
    model: str | None = typer.Option(None, "--model", help="Step predictor: 'analytic', a bundle or an MLflow URI."),
    store: Path | None = typer.Option(
        None,
        "--store",
        help=f"Folder to store the corrections in (default: '{STEPS_FOLDER}' in {FOLDER_HELP}; "
        "perfcast predict reads only that one).",
    ),
) -> None:
    """Fit a per-cluster correction from measured steps of your own cluster (one or more).

    One run fits a shared factor; three or more also fit a factor per part of the step; every
    fit is shrunk toward no correction, less the more runs there are.

    Corrections are stored in the 'steps' folder of $PERFCAST_CALIBRATION_DIR if set, else
    of ~/.config/perfcast/calibration, and apply to later predictions of the same predictor
    (--model) only; each prediction row names the correction in its calibration column.
    The table shows, per component of the step (attention, the rest of the compute, exposed
    communication), the factor its predicted time is multiplied by.
    """
    from perfcast.data.tables import read_table
    from perfcast.models.step_calibration import CALIBRATED_COMPONENTS, save_step_correction
    from perfcast.serve.predictors import load_step_predictor

    with user_errors():
        runs = read_table(runs_path)
        predictor = load_step_predictor(model)
        fit = fit_step_corrections(runs, predictor)
        folder = store or step_calibration_dir()
        paths = [save_step_correction(corr, folder) for corr in fit.corrections]
    table = Table(
        Column("cluster", overflow="fold"), "runs used", "left out", *CALIBRATED_COMPONENTS,
        title=f"step calibration, stored in {folder}",
    )  # fmt: skip
    for corr in fit.corrections:
        factors = [f"x{corr.factors.get(c, corr.factor):.3f}" for c in CALIBRATED_COMPONENTS]
        table.add_row(corr.cluster, str(corr.n_runs), str(len(corr.excluded)), *factors)
    Console().print(table)
    for reason in [*fit.refused, *(r for corr in fit.corrections for r in corr.excluded)]:
        _err.print(f"left out of the fit: {reason}", markup=False)
    names = ", ".join(p.name for p in paths)
    _err.print(f"stored {names}; they apply to predictions by {fit.corrections[0].predictor} only", markup=False)
