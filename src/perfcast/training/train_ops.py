"""Train the op predictor: load op records, evaluate leave-one-GPU-out, fit, save a bundle.

Compute ops (GEMM, attention, vector) train an
:class:`~perfcast.models.op_model.OpTimeRegressor`; collectives a
:class:`~perfcast.models.collective_model.CollectiveTimeRegressor`. Every step is logged
to the active MLflow run, if one is active (see :mod:`perfcast.training.tracking`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast.data.dataset import build_card, load_dataset
from perfcast.data.sources import read_source
from perfcast.data.validate import GpuResolver
from perfcast.errors import DatasetError
from perfcast.features.op_features import featurize_ops
from perfcast.models.bundle import save_bundle
from perfcast.models.collective_model import CollectiveTimeRegressor
from perfcast.models.op_model import OpTimeRegressor
from perfcast.training import plots, tracking
from perfcast.training.evaluate import LogoResult, evaluate_logo, evaluation_class, markdown_table

logger = logging.getLogger(__name__)

COLLECTIVE_CLASS = "collective"
MIN_ROWS = 20


@dataclass
class TrainOpsResult:
    """What a training run produced."""

    bundle_path: Path
    n_compute_rows: int
    n_collective_rows: int
    fit_seconds: float
    logo: LogoResult | None = None
    cards: dict[str, dict[str, Any]] = field(default_factory=dict)


def load_op_records(paths: Sequence[Path], *, resolve_gpu: GpuResolver) -> tuple[pd.DataFrame, dict[str, dict]]:
    """Op records from dataset folders or source files, and a card per input (for hashes).

    Raises:
        DatasetError: an input holds no op records.
    """
    frames, cards = [], {}
    for path in paths:
        path = Path(path)
        if path.is_dir():
            ds = load_dataset(path, resolve_gpu=resolve_gpu)
            records, card = ds.ops, ds.card
        else:
            loaded = read_source(path, resolve_gpu=resolve_gpu)
            records = loaded.records if loaded.kind == "ops" else pd.DataFrame()
            card = build_card(path.name, source=loaded.reader.name, how_measured=loaded.reader.description,
                              tables={"ops": records})  # fmt: skip
        if records.empty:
            raise DatasetError(f"{path} holds no op records")
        frames.append(records)
        cards[path.name] = card
    return pd.concat(frames, ignore_index=True), cards


def train_op_predictor(
    records: pd.DataFrame,
    *,
    output: Path,
    params: dict[str, Any] | None = None,
    evaluate: bool = True,
    collectives: bool = True,
    cards: dict[str, dict] | None = None,
    progress: Callable[[str], None] | None = None,
) -> TrainOpsResult:
    """Evaluate (leave-one-GPU-out), fit on everything, save the bundle to ``output``.

    Args:
        records: checked op records (``measured_ms`` and op-table columns).
        output: bundle folder to write.
        params: OpTimeRegressor keyword hyperparameters.
        evaluate: run the leave-one-GPU-out evaluation of the compute-op model first.
        collectives: fit the collective model; without it the bundle times collectives with
            the catalog alpha-beta estimate.
        cards: dataset cards whose hashes go into the manifest and the MLflow run.
        progress: called with a short message at each stage.
    """
    params = dict(params or {})
    say = progress or (lambda msg: logger.info("%s", msg))
    op_class = featurize_ops(records)["op_class"]
    collective = records[(op_class == COLLECTIVE_CLASS).to_numpy()]
    compute = records[(op_class != COLLECTIVE_CLASS).to_numpy()]
    y_compute = compute["measured_ms"].to_numpy(dtype=float)
    if tracking.active():
        tracking.log_params({f"op_model.{k}": v for k, v in params.items()})
        tracking.log_params({"rows.compute": len(compute), "rows.collective": len(collective),
                             "gpus": ",".join(sorted(records["gpu"].astype(str).unique()))})  # fmt: skip
        tracking.log_datasets(cards or {})
        tracking.log_training_data(records, name="op-records")

    logo = None
    if evaluate and compute["gpu"].nunique() >= 2:
        classes = evaluation_class(compute, op_class[compute.index])
        logo = evaluate_logo(
            compute, y_compute, make_model=lambda: OpTimeRegressor(**params), eval_class=classes,
            progress=lambda gpu: say(f"leave-one-GPU-out: holding out {gpu}"),
        )  # fmt: skip
        if tracking.active():
            tracking.log_logo_table(logo.table, logo.summary(), markdown_table(logo))
            tracking.log_figures({
                "parity": plots.parity_plot(logo.predictions),
                "error_by_gpu": plots.error_by_gpu_plot(logo.table),
                "calibration": plots.calibration_plot(logo.predictions),
            })  # fmt: skip

    start = time.perf_counter()
    op_model = None
    if len(compute) >= MIN_ROWS:
        say(f"fitting the op model on {len(compute)} rows")
        op_model = OpTimeRegressor(**params).fit(compute, y_compute)
    collective_model = None
    if collectives and len(collective) >= MIN_ROWS:
        say(f"fitting the collective model on {len(collective)} rows")
        collective_model = CollectiveTimeRegressor().fit(collective, collective["measured_ms"].to_numpy(dtype=float))
    fit_seconds = time.perf_counter() - start
    if op_model is None and collective_model is None:
        raise DatasetError(f"too few op records to train ({len(records)}; need at least {MIN_ROWS} of a kind)")

    metrics = {"fit_seconds": fit_seconds}
    if logo is not None:
        for (klass, predictor), row in logo.summary().iterrows():
            metrics.update({f"logo_median.{klass}.{predictor}.{k}": float(v) for k, v in row.items() if pd.notna(v)})
    hashes = {name: {t: m.get("content_hash") for t, m in card.get("tables", {}).items()}
              for name, card in (cards or {}).items()}  # fmt: skip
    bundle = save_bundle(output, op_model=op_model, collective_model=collective_model, metrics=metrics,
                         datasets=hashes)  # fmt: skip
    if tracking.active():
        tracking.log_metrics({"fit_seconds": fit_seconds})
        if op_model is not None:
            tracking.log_figures({"feature_importance": plots.importance_plot(op_model.feature_importance())})
        tracking.log_bundle_dir(bundle)
    return TrainOpsResult(
        bundle_path=bundle,
        n_compute_rows=len(compute),
        n_collective_rows=len(collective),
        fit_seconds=fit_seconds,
        logo=logo,
        cards=dict(cards or {}),
    )


def median_summary(logo: LogoResult) -> pd.DataFrame:
    """The per-class medians as a flat frame for printing."""
    out = logo.summary().reset_index()
    return out[[c for c in ("eval_class", "predictor", "mape", "median_ape", "p90_ape", "coverage", "rel_width")
                if c in out]].replace({np.nan: None})  # fmt: skip
