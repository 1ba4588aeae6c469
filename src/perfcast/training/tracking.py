"""MLflow as the system of record: where runs go and what each one records.

The tracking store is ``MLFLOW_TRACKING_URI`` when set (a real server), else a local
SQLite file ``mlflow.db`` in the working folder (embedded, no server). A training run
records its parameters, the content hashes of every dataset it read, the metrics of each
held-out split, plots, and the predictor bundle as artifacts.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

logger = logging.getLogger(__name__)

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "perfcast"


def tracking_uri() -> str:
    """The tracking URI in force: ``MLFLOW_TRACKING_URI`` or the local SQLite default."""
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


@contextlib.contextmanager
def tracked_run(experiment: str = DEFAULT_EXPERIMENT, run_name: str | None = None,
                tags: Mapping[str, str] | None = None) -> Iterator[Any]:  # fmt: skip
    """Start an MLflow run in ``experiment`` on the tracking store in force."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=run_name, tags=dict(tags or {})) as run:
        logger.info("MLflow run %s in experiment %r at %s", run.info.run_id, experiment, tracking_uri())
        yield run


def active() -> bool:
    """Whether an MLflow run is active (training logs to it only then)."""
    import sys

    if "mlflow" not in sys.modules:  # never imported: no run can be active
        return False
    import mlflow

    return mlflow.active_run() is not None


def log_params(params: Mapping[str, Any]) -> None:
    """Log parameters to the active run (values cut to MLflow's 6000-character limit)."""
    import mlflow

    mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})


def log_metrics(metrics: Mapping[str, float]) -> None:
    """Log metrics to the active run."""
    import mlflow

    mlflow.log_metrics({k: float(v) for k, v in metrics.items()})


def log_datasets(cards: Mapping[str, Mapping[str, Any]]) -> None:
    """Log each dataset's name, row counts and content hashes (``dataset.<name>.<table>.*``)."""
    import mlflow

    params: dict[str, Any] = {}
    for name, card in cards.items():
        for table, meta in card.get("tables", {}).items():
            params[f"dataset.{name}.{table}.rows"] = meta.get("rows")
            params[f"dataset.{name}.{table}.hash"] = str(meta.get("content_hash", ""))[:64]
        params[f"dataset.{name}.source"] = str(card.get("source", ""))[:500]
    mlflow.log_params(params)


def _key(*parts: str) -> str:
    """An MLflow metric name from parts (only alphanumerics, ``_ - . /`` allowed)."""
    return "/".join("".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in p) for p in parts)


def log_logo_table(table: pd.DataFrame, summary: pd.DataFrame, markdown: str) -> None:
    """Log leave-one-GPU-out metrics per (class, GPU, predictor), their medians, and the tables."""
    import mlflow

    metrics: dict[str, float] = {}
    for row in table.to_dict("records"):
        for metric in ("mape", "median_ape", "p90_ape", "coverage", "rel_width"):
            value = row.get(metric)
            if value is not None and pd.notna(value):
                metrics[_key("logo", row["eval_class"], row["gpu"], row["predictor"], metric)] = float(value)
    for (klass, predictor), row in summary.iterrows():
        for metric, value in row.items():
            if pd.notna(value):
                metrics[_key("logo_median", klass, predictor, str(metric))] = float(value)
    mlflow.log_metrics(metrics)
    mlflow.log_text(markdown, "evaluation/logo.md")
    mlflow.log_text(table.to_csv(index=False), "evaluation/logo.csv")


def log_figures(figures: Mapping[str, Any]) -> None:
    """Log matplotlib figures as PNG artifacts under ``plots/``."""
    import matplotlib.pyplot as plt
    import mlflow

    for name, fig in figures.items():
        mlflow.log_figure(fig, f"plots/{name}.png")
        plt.close(fig)


def log_bundle_dir(path: Path) -> None:
    """Log a predictor bundle directory as artifacts under ``bundle/``."""
    import mlflow

    mlflow.log_artifacts(str(path), artifact_path="bundle")


def log_table(table: pd.DataFrame, artifact_file: str) -> None:
    """Log a table as a CSV artifact."""
    import mlflow

    mlflow.log_text(table.to_csv(index=False), artifact_file)
