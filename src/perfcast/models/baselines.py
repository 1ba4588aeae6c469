"""Baselines every learned op model must beat (issue 4's evaluation).

* :class:`RooflineBaseline`: the pure roofline, ``max(FLOPs / peak, bytes / bandwidth)``
  at datasheet peaks; nothing is fitted.
* :class:`EfficiencyBaseline`: ``launch + roofline / efficiency`` with one efficiency per
  op class and one launch constant, fitted on the training GPUs: the efficiency is the
  median of ``roofline / (measured - launch)`` over the class, the launch constant the 5%
  quantile of the measured times of ops whose roofline is under 1 us (the floor every
  tiny op pays on the host).

Both take op-table rows (with ``gpu``) and return milliseconds; their intervals are the
point prediction (no uncertainty).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from perfcast.features.op_features import featurize_ops
from perfcast.models.intervals import check_coverage

TINY_ROOFLINE_MS = 1e-3
LAUNCH_QUANTILE = 0.05
DEFAULT_LAUNCH_MS = 0.01


def _roofline_and_class(X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    feats = featurize_ops(X)
    return feats["roofline_ms"].to_numpy(dtype=float), feats["op_class"].to_numpy(dtype=str)


def _point_interval(pred: np.ndarray, coverage: float) -> np.ndarray:
    """``(n, 2)`` bounds both equal to ``pred``, ms.

    Raises:
        SpecError: ``coverage`` outside (0, 1), as every estimator's interval refuses it.
    """
    check_coverage(coverage)
    return np.column_stack([pred, pred])


class RooflineBaseline(BaseEstimator, RegressorMixin):
    """The pure roofline at datasheet peaks, ms."""

    def fit(self, X: pd.DataFrame, y: np.ndarray | None = None) -> RooflineBaseline:
        """Nothing to learn; returns self."""
        self.fitted_ = True
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Roofline time of each row, ms."""
        check_is_fitted(self)
        return _roofline_and_class(X)[0]

    def predict_interval(self, X: pd.DataFrame, *, coverage: float = 0.9) -> np.ndarray:
        """No uncertainty: both bounds are the prediction (``coverage`` is checked, then unused)."""
        return _point_interval(self.predict(X), coverage)


class EfficiencyBaseline(BaseEstimator, RegressorMixin):
    """``launch + roofline / efficiency(op class)``, fitted on the training rows."""

    def fit(self, X: pd.DataFrame, y: np.ndarray) -> EfficiencyBaseline:
        """Fit the launch constant and one efficiency per op class."""
        roof, cls = _roofline_and_class(X)
        y = np.asarray(y, dtype=float)
        tiny = roof < TINY_ROOFLINE_MS
        self.launch_ms_ = float(np.quantile(y[tiny], LAUNCH_QUANTILE)) if tiny.any() else DEFAULT_LAUNCH_MS
        work = np.maximum(y - self.launch_ms_, 1e-6)
        self.efficiency_ = {
            str(c): float(np.median(roof[cls == c] / work[cls == c])) for c in np.unique(cls)
        }  # fmt: skip
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Predicted time of each row, ms (classes unseen in fit use the median efficiency)."""
        check_is_fitted(self)
        roof, cls = _roofline_and_class(X)
        fallback = float(np.median(list(self.efficiency_.values())))
        eff = np.array([self.efficiency_.get(c, fallback) for c in cls], dtype=float)
        return self.launch_ms_ + roof / eff

    def predict_interval(self, X: pd.DataFrame, *, coverage: float = 0.9) -> np.ndarray:
        """No uncertainty: both bounds are the prediction (``coverage`` is checked, then unused)."""
        return _point_interval(self.predict(X), coverage)
