"""MLflow pyfunc flavour of a perfcast predictor bundle, logged as code (nothing pickled).

``perfcast train ops|steps`` logs this file with ``mlflow.pyfunc.log_model(python_model=<this
path>, artifacts={"bundle": <bundle dir>})``; MLflow runs it on load, and
``load_context`` reads the bundle through :func:`perfcast.models.bundle.load_bundle`.
``predict`` takes an op table (rows with an ``op`` column) and returns the same rows with
``pred_ms``, ``pred_lo_ms``, ``pred_hi_ms`` and ``error``, or a run table and returns the
rows with ``step_ms``, its interval, memory, MFU, tokens/s and ``error``;
``params={"coverage": 0.8}`` changes the interval. So ``mlflow models serve`` answers
both tables.

The stored calibrations fitted for this bundle (:func:`perfcast.serve.predictors.with_calibrations`,
the path every front door shares) apply to both tables unless the model is loaded with
``model_config={"calibration": False}``.
"""

from __future__ import annotations

from typing import Any

import mlflow
import pandas as pd

from perfcast.serve.batch import DEFAULT_COVERAGE, predict_ops_table, predict_steps_table
from perfcast.serve.predictors import load_op_predictor, with_calibrations


class PerfcastOpModel(mlflow.pyfunc.PythonModel):
    """Pyfunc wrapper around a perfcast predictor bundle (op tables and run tables)."""

    def load_context(self, context: Any) -> None:
        """Load the bundle logged as the ``bundle`` artifact (``self.bundle``, uncalibrated) and its
        op and step predictors with the stored calibrations (``self.ops``, ``self.steps``)."""
        calibration = bool((getattr(context, "model_config", None) or {}).get("calibration", True))
        self.bundle = load_op_predictor(str(context.artifacts["bundle"]))
        self.ops = with_calibrations(self.bundle, "ops", calibration)
        self.steps = with_calibrations(self.bundle.step_predictor(), "steps", calibration)

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """Predict an op table or a run table (invalid rows get their reason in ``error``)."""
        coverage = float((params or {}).get("coverage", DEFAULT_COVERAGE))
        table = pd.DataFrame(model_input)
        if "op" in table.columns:
            return predict_ops_table(table, predictor=self.ops, coverage=coverage)
        return predict_steps_table(table, predictor=self.steps, coverage=coverage)


mlflow.models.set_model(PerfcastOpModel())
