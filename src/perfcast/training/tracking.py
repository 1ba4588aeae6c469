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
import warnings
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


def log_training_data(records: pd.DataFrame, *, name: str, context: str = "training") -> None:
    """Record the table a model was fitted on as an MLflow dataset input of the active run
    (its schema, row count and MLflow's content digest)."""
    import mlflow

    with warnings.catch_warnings():  # MLflow's schema hints about integer and mixed columns (schema inferred lazily)
        warnings.simplefilter("ignore", UserWarning)
        dataset = mlflow.data.from_pandas(records.reset_index(drop=True), name=name)
        mlflow.log_input(dataset, context=context)


MODEL_REQUIREMENTS = (
    "numpy", "pandas", "pyarrow", "pydantic", "scikit-learn", "scipy", "xgboost-cpu", "mlflow", "matplotlib",
    "typer", "rich",
)  # fmt: skip
"""Distributions the logged pyfunc imports, pinned to the installed versions (perfcast itself
travels as code, so ``mlflow models serve`` builds its environment from a package index)."""


def log_pyfunc_model(bundle: Path, *, kind: str, register: str | None = None) -> Any:
    """Log ``bundle`` as an MLflow pyfunc model answering op and run tables (``kind``: which
    table the input example shows, ``ops`` or ``steps``), and register it as ``register``.

    The model carries perfcast's code (``code_paths``) and pinned requirements, a signature
    whose params schema declares ``coverage`` (the interval's nominal coverage, honoured by
    the pyfunc), and no input schema, since one model answers both table kinds.

    Returns:
        MLflow's ``ModelInfo``.
    """
    from importlib import metadata, resources

    import mlflow
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ParamSchema, ParamSpec

    from perfcast.data.tables import DEFAULT_COVERAGE

    signature = ModelSignature(params=ParamSchema([ParamSpec("coverage", "double", DEFAULT_COVERAGE)]))
    package = Path(str(resources.files("perfcast")))
    code = str(package.parent / "perfcast")
    requirements = [f"{name}=={metadata.version(name)}" for name in MODEL_REQUIREMENTS]
    with warnings.catch_warnings():  # MLflow's schema hint about the example's integer columns
        warnings.simplefilter("ignore", UserWarning)
        return mlflow.pyfunc.log_model(
            name="model",
            python_model=str(package / "serve" / "pyfunc_model.py"),
            artifacts={"bundle": str(bundle)},
            code_paths=[code],
            pip_requirements=requirements,
            signature=signature,
            input_example=INPUT_EXAMPLES[kind],
            registered_model_name=register,
        )


INPUT_EXAMPLES = {
    "ops": pd.DataFrame([{"op": "matmul", "m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "gpu": "h100-sxm5-80gb"}]),
    "steps": pd.DataFrame([{"model": "llama3-8b", "tp": 2, "dp": 4, "micro_batch": 1, "global_batch": 64,
                            "gpu": "h100-sxm5-80gb", "num_gpus": 8}]),
}  # fmt: skip
"""One row of each table kind, the logged model's input example."""
