"""Step-time GBDT: XGBoost on ``log(measured / composed)`` over run features.

The composed step (op predictions through the pipeline schedule) carries the scaling;
the booster learns what composition misses (launch-bound small GEMMs, collectives below
link rate, framework overhead) as a log ratio (DESIGN.md decision 1):

.. math::

    \\hat t = t_{composed} \\cdot \\exp f(x), \\qquad f \\approx \\log(t_{measured} / t_{composed})

``X`` is a run-feature frame (:func:`perfcast.features.run_features.featurize_runs`);
``t_composed = exp(X["log_composed_step_ms"])``.

Interval: split-conformal at the level of groups. ``fit(X, y, groups=...)`` holds each
group out in turn (at most ``n_calibration_folds`` folds of whole groups), fits a booster
on the other groups and records the held-out log residuals
``r = log(t_measured) - log(\\hat t)``; the final booster is then fit on all rows. The
``coverage`` interval is ``\\hat t \\cdot \\exp([q_{(1-c)/2}(r), q_{(1+c)/2}(r)])``, quantiles
of the pooled held-out residuals (with the finite-sample ``(n+1)`` correction), so it
widens monotonically with ``coverage``. Grouping by cluster size makes the residuals
those of extrapolating to a cluster size not seen in training, which is how the model is
used; without ``groups`` every row is its own group (plain K-fold).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from perfcast.errors import BundleError, SpecError
from perfcast.features.run_features import COMPOSED_STEP_COLUMN, RUN_FEATURE_SPEC, RUN_FEATURE_SPEC_VERSION

__all__ = ["StepTimeRegressor"]

BOOSTER_FILE = "step_gbdt.ubj"


class StepTimeRegressor(RegressorMixin, BaseEstimator):
    """Gradient-boosted correction of the composed step time (see the module docstring).

    Args:
        n_estimators, max_depth, learning_rate, subsample, colsample_bytree,
            min_child_weight, reg_lambda: XGBoost hyperparameters.
        n_calibration_folds: most folds of whole groups for the conformal residuals.
        features: columns of ``X`` to use; ``None`` uses every column of
            :data:`~perfcast.features.run_features.RUN_FEATURE_SPEC`.
        random_state: seed of the booster's row and column sampling and the fold split.
        n_jobs: XGBoost threads (step tables are small: one thread avoids OpenMP spin costs on busy machines).

    Attributes:
        booster_: the XGBoost booster fitted on all rows.
        feature_names_: the columns used, in order.
        residuals_: sorted held-out log residuals (conformal scores).
    """

    inputs = "run_features"
    """What ``predict`` takes: a run-feature frame (:func:`~perfcast.features.run_features.featurize_runs`)."""

    def __init__(
        self,
        *,
        n_estimators: int = 300,
        max_depth: int = 4,
        learning_rate: float = 0.05,
        subsample: float = 0.8,
        colsample_bytree: float = 0.8,
        min_child_weight: float = 3.0,
        reg_lambda: float = 1.0,
        n_calibration_folds: int = 5,
        features: tuple[str, ...] | None = None,
        random_state: int = 0,
        n_jobs: int = 1,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.reg_lambda = reg_lambda
        self.n_calibration_folds = n_calibration_folds
        self.features = features
        self.random_state = random_state
        self.n_jobs = n_jobs

    # ------------------------------------------------------------------------ fit

    def fit(self, X: pd.DataFrame, y: Any, *, groups: Any = None, sample_weight: Any = None) -> Self:
        """Fit the booster on all rows and the conformal residuals on held-out groups.

        Args:
            X: run features (must hold ``log_composed_step_ms`` and the used columns).
            y: measured step times, ms, all > 0.
            groups: group label per row for the held-out calibration folds (e.g. the
                cluster size); ``None`` makes each row its own group.
            sample_weight: optional non-negative weight per row.

        Raises:
            SpecError: bad shapes, missing columns, non-positive times, fewer than 2 groups.
        """
        if self.n_calibration_folds < 2:
            raise SpecError(f"n_calibration_folds={self.n_calibration_folds} must be >= 2")
        names = self._feature_names(X)
        target = self._log_ratio(X, y)
        weights = np.ones(len(target)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        if weights.shape != target.shape or (weights < 0).any():
            raise SpecError(f"sample_weight must be {len(target)} non-negative numbers")
        labels = np.arange(len(target)) if groups is None else np.asarray(groups)
        if labels.shape != target.shape:
            raise SpecError(f"groups has {labels.shape[0]} entries for {len(target)} rows")
        unique = np.unique(labels)
        if len(unique) < 2:
            raise SpecError(f"need at least 2 groups for the held-out calibration, got {len(unique)}")
        data = X.loc[:, names].to_numpy(dtype=float)
        rng = np.random.default_rng(self.random_state)
        fold_of_group = rng.permutation(len(unique)) % min(self.n_calibration_folds, len(unique))
        folds = fold_of_group[np.searchsorted(unique, labels)]
        residuals = np.empty(len(target))
        for k in np.unique(folds):
            held = folds == k
            booster = self._train(data[~held], target[~held], weights[~held])
            residuals[held] = target[held] - self._raw(booster, data[held])
        self.feature_names_ = names
        self.residuals_ = np.sort(residuals)
        self.booster_ = self._train(data, target, weights)
        self.n_features_in_ = len(names)
        return self

    def _feature_names(self, X: Any) -> tuple[str, ...]:
        if not isinstance(X, pd.DataFrame):
            raise SpecError(f"X must be a DataFrame of run features, got {type(X).__name__}")
        names = tuple(self.features) if self.features is not None else RUN_FEATURE_SPEC.columns
        missing = [c for c in (*names, COMPOSED_STEP_COLUMN) if c not in X.columns]
        if missing:
            raise SpecError(f"X lacks run-feature columns {missing}")
        return names

    @staticmethod
    def _log_ratio(X: pd.DataFrame, y: Any) -> np.ndarray:
        true = np.asarray(y, dtype=float).ravel()
        if true.shape != (len(X),):
            raise SpecError(f"y has {true.size} values for {len(X)} rows")
        if not (np.isfinite(true) & (true > 0)).all():
            raise SpecError("measured step times y must be finite and > 0 ms")
        return np.log(true) - X[COMPOSED_STEP_COLUMN].to_numpy(dtype=float)

    def _train(self, data: np.ndarray, target: np.ndarray, weights: np.ndarray) -> Any:
        import xgboost as xgb

        params = {
            "objective": "reg:squarederror",
            "max_depth": self.max_depth,
            "eta": self.learning_rate,
            "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree,
            "min_child_weight": self.min_child_weight,
            "lambda": self.reg_lambda,
            "seed": self.random_state,
            "nthread": self.n_jobs,
        }
        dtrain = xgb.DMatrix(data, label=target, weight=weights)
        return xgb.train(params, dtrain, num_boost_round=self.n_estimators)

    @staticmethod
    def _raw(booster: Any, data: np.ndarray) -> np.ndarray:
        return booster.inplace_predict(data)

    # ------------------------------------------------------------------------ predict

    def _log_pred(self, X: pd.DataFrame) -> np.ndarray:
        check_is_fitted(self, "booster_")
        self._feature_names(X)
        missing = [c for c in self.feature_names_ if c not in X.columns]
        if missing:
            raise SpecError(f"X lacks run-feature columns {missing}")
        data = X.loc[:, list(self.feature_names_)].to_numpy(dtype=float)
        return X[COMPOSED_STEP_COLUMN].to_numpy(dtype=float) + self._raw(self.booster_, data)

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Median step time, ms."""
        return np.exp(self._log_pred(X))

    def predict_interval(self, X: pd.DataFrame, *, coverage: float = 0.9) -> np.ndarray:
        """``(n, 2)`` lower and upper bounds of the ``coverage`` interval, ms."""
        if not 0.0 < coverage < 1.0:
            raise SpecError(f"coverage={coverage!r} must be in (0, 1)")
        log_pred = self._log_pred(X)
        lo_q, hi_q = self._residual_bounds(coverage)
        return np.column_stack([np.exp(log_pred + lo_q), np.exp(log_pred + hi_q)])

    def _residual_bounds(self, coverage: float) -> tuple[float, float]:
        """Conformal quantiles of the held-out log residuals, widened by ``(n+1)/n``."""
        r = self.residuals_
        n = len(r)
        tail = (1.0 - coverage) / 2.0
        lo_level = np.floor(tail * (n + 1)) / n
        hi_level = min(1.0, np.ceil((1.0 - tail) * (n + 1)) / n)
        lo, hi = np.quantile(r, [lo_level, hi_level], method="inverted_cdf")
        return float(min(lo, 0.0)), float(max(hi, 0.0))

    # ------------------------------------------------------------------------ persistence

    def _save_to(self, directory: str | Path) -> dict[str, Any]:
        """Write ``step_gbdt.ubj`` into ``directory``; return the JSON-able rest."""
        check_is_fitted(self, "booster_")
        self.booster_.save_model(str(Path(directory) / BOOSTER_FILE))
        params = self.get_params()
        params["features"] = list(params["features"]) if params["features"] is not None else None
        return {
            "params": params,
            "run_feature_spec_version": RUN_FEATURE_SPEC_VERSION,
            "feature_names": list(self.feature_names_),
            "residuals": self.residuals_.tolist(),
            "booster_file": BOOSTER_FILE,
        }

    @classmethod
    def _load_from(cls, directory: str | Path, meta: dict[str, Any]) -> StepTimeRegressor:
        """Rebuild a fitted model from :meth:`_save_to`'s file and dict."""
        import xgboost as xgb

        path = Path(directory)
        try:
            if int(meta["run_feature_spec_version"]) != RUN_FEATURE_SPEC_VERSION:
                raise BundleError(
                    f"step model was saved with run FeatureSpec version {meta['run_feature_spec_version']}; "
                    f"this perfcast has version {RUN_FEATURE_SPEC_VERSION}"
                )
            params = dict(meta["params"])
            if params.get("features") is not None:
                params["features"] = tuple(params["features"])
            model = cls(**params)
            model.feature_names_ = tuple(meta["feature_names"])
            model.residuals_ = np.asarray(meta["residuals"], dtype=float)
            file = path / meta["booster_file"]
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"step model metadata in {path} is malformed: {exc!r}") from None
        if not file.is_file():
            raise BundleError(f"bundle file {file} is missing")
        booster = xgb.Booster()
        booster.load_model(str(file))
        booster.set_param({"nthread": model.n_jobs})
        model.booster_ = booster
        model.n_features_in_ = len(model.feature_names_)
        return model
