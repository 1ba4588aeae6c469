"""MLflow pyfunc flavour of a perfcast op predictor, logged as code (nothing pickled).

``perfcast train ops`` logs this file with ``mlflow.pyfunc.log_model(python_model=<this
path>, artifacts={"bundle": <bundle dir>})``; MLflow runs it on load, and
``load_context`` reads the bundle through :func:`perfcast.models.bundle.load_bundle`.
``predict`` takes an op table and returns the same rows with ``pred_ms``,
``pred_lo_ms``, ``pred_hi_ms`` and ``error`` (``params={"coverage": 0.8}`` changes the
interval), so ``mlflow models serve`` answers op tables.
"""

from __future__ import annotations

from typing import Any

import mlflow
import pandas as pd

from perfcast.models.bundle import load_bundle
from perfcast.serve.batch import DEFAULT_COVERAGE, predict_ops_table


class PerfcastOpModel(mlflow.pyfunc.PythonModel):
    """Pyfunc wrapper around a perfcast op-predictor bundle."""

    def load_context(self, context: Any) -> None:
        """Load the bundle logged as the ``bundle`` artifact."""
        self.bundle = load_bundle(context.artifacts["bundle"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """Predict an op table (rows with invalid input get their reason in ``error``)."""
        coverage = float((params or {}).get("coverage", DEFAULT_COVERAGE))
        return predict_ops_table(pd.DataFrame(model_input), predictor=self.bundle, coverage=coverage)


mlflow.models.set_model(PerfcastOpModel())
