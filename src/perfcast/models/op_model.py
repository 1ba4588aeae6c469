"""Learned per-op time model: XGBoost on the log ratio of measured time to a physics base.

For an op of class ``c`` (gemm, vector, attention) on a GPU of vendor ``v``:

.. math::

    t_\\text{base} = L_{v,c} + \\max(t_\\text{roofline}, t_\\text{issue}), \\qquad
    \\hat t = t_\\text{base} \\cdot \\exp f_c(x)

where ``t_roofline`` is the roofline time at the row dtype's peak
(:func:`perfcast.features.roofline.roofline_time_s`), ``t_issue`` the instruction-issue time
of an embedding forward's gather (0 for other ops), ``L_{v,c}`` a launch/host constant
(the 5% quantile of the measured times of the training ops whose roofline is under 1 us,
per vendor and class: :mod:`perfcast.models.op_base`) and ``f_c`` one XGBoost booster per
class fitted on ``log(t / t_base)`` over the GPU-relative features of
:mod:`perfcast.features.op_features`.
The physics carries the scale, the trees the efficiency, so the model transfers to GPUs
it has not seen (leave-one-GPU-out results: ``benchmarks/results/op_logo.md``).

The interval (:mod:`perfcast.models.op_interval`) answers "how wrong is the model on a GPU it
has not seen": a random effect for the new GPU's shift, fitted on out-of-GPU log residuals of
an inner leave-one-GPU-out loop, plus the spread of the ops around their GPU's shift; it is
``pred * exp([-q, q])``, symmetric in log time around the median. An op that fewer than two
training GPUs ran (a fused kernel, a dtype one GPU was measured in) gets, on a GPU that did
not run it, at least the quantile of the inner residuals of such ops
(``op_interval.rare_op_residuals``).

Physical bounds (:mod:`perfcast.models.op_bounds`): whatever the trees say, a predicted time
is never below the op's roofline time over the efficiency ceiling ``eta`` of its class and
dtype family, the best efficiency measured in training plus a margin, at most 1. The
ceilings are fitted with the boosters and saved with them (``efficiency_ceiling_``); a
bundle saved before the bound uses ``eta = 1``, the roofline itself. The median is raised
to the floor; the interval is then built around the raised median and its lower end
raised to the floor too, so ``floor <= lo <= pred <= hi``. The inner leave-one-GPU-out
residuals of the interval are those of the unbounded model.

Timing method: with ``timing=True`` the model reads each row's ``timing``
(:class:`~perfcast.data.schema.OpTiming`: a launch-inclusive CUDA-event call, the kernels'
device time, a loop mean), from the column or from its source
(:func:`~perfcast.data.op_timing.record_timing`). The launch term is then fitted per
``(vendor, class, timing)`` and the trees get :data:`~perfcast.features.op_features.TIMING_FEATURE`,
so sources timed differently are told apart instead of averaged. A query that names no
timing gets :data:`~perfcast.data.schema.QUERY_TIMING` (``gpu_kernels``: the time the op
takes inside a training step, launches hidden); a timing absent from a class's training rows
takes its default launch term (2 us for kernel-only timings). Models saved without the flag
(``timing`` absent from the saved parameters) ignore the column and predict as before.

Shapes:
    ``X``: (n,) op-table rows (a DataFrame); ``predict``: (n,) ms;
    ``predict_interval``: (n, 2) ms, ``lo <= predict <= hi``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from perfcast.data.op_timing import record_timing
from perfcast.data.schema import QUERY_TIMING
from perfcast.errors import BundleError, SpecError
from perfcast.features.op_features import (
    FEATURE_SPEC,
    FEATURE_SPEC_VERSION,
    TIMING_FEATURE,
    featurize_ops,
    timing_feature,
)
from perfcast.features.ops import OpClass
from perfcast.models import op_bounds, op_domain, op_interval
from perfcast.models.intervals import check_coverage, log_interval, split_group_shifts, weighted_quantiles
from perfcast.models.op_base import LAUNCH_QUANTILE as LAUNCH_QUANTILE
from perfcast.models.op_base import LAUNCH_ROOFLINE_MS as LAUNCH_ROOFLINE_MS
from perfcast.models.op_base import MIN_LAUNCH_ROWS as MIN_LAUNCH_ROWS
from perfcast.models.op_base import base_ms, fit_launch
from perfcast.models.op_domain import featurize_known, rows_hint, warn_out_of_domain
from perfcast.models.op_interval import INNER_ROWS_FRACTION, INNER_TREES_FRACTION, RESIDUAL_LEVELS, gpu_equal_weights

__all__ = ["OpTimeRegressor"]

MODELLED_CLASSES = (OpClass.GEMM.value, OpClass.VECTOR.value, OpClass.ATTENTION.value)
DEFAULT_MAX_DEPTH = {OpClass.GEMM.value: 4, OpClass.VECTOR.value: 5, OpClass.ATTENTION.value: 5}


class OpTimeRegressor(RegressorMixin, BaseEstimator):
    """Per-op time (ms) of compute ops: physics base times a learned efficiency ratio.

    Hyperparameters (stored only; checked in :meth:`fit`):
        n_estimators, learning_rate, subsample, colsample_bytree, min_child_weight:
            XGBoost's (``reg:squarederror``, ``hist``).
        max_depth: tree depth; ``None`` uses the per-class default (gemm 4, vector and
            attention 5).
        max_rows_per_gpu: rows per GPU and class used for training (a seeded sample above
            it); each GPU gets equal total weight whatever its row count.
        calibrate: fit the GPU-level interval with an inner leave-one-GPU-out loop (needs
            >= 3 training GPUs; with fewer, 5-fold out-of-fold residuals over rows, a
            within-GPU interval). ``False`` keeps in-sample residuals: a fast but
            optimistic interval, for experiments.
        random_state, n_jobs: seed and XGBoost threads.
        timing: use each row's timing method (module docstring); ``False`` (default) pools the methods.

    Fitted attributes:
        launch_ms_: ``{(vendor, class): ms}``, ``(op_base.POOLED, class)`` the class fallback;
            with timing, ``{(vendor, class, timing): ms}`` and ``(op_base.POOLED, class, timing)``.
        uses_timing_: whether the fitted model reads the timing method (``timing`` at fit).
        train_timings_: ``{class: timings of its training rows}`` (empty without timing).
        boosters_: ``{class: xgboost.Booster}``.
        residuals_: ``{class: (log_residuals, weights)}`` of the interval: the ops' spread
            around their GPU's shift when ``gpu_shifts_[class]`` is set, else the plain
            (row-fold or in-sample) residuals.
        gpu_shifts_: ``{class: shifts}``, the median out-of-GPU log residual of each
            calibration GPU (empty without a GPU-level calibration).
        interval_kind_: ``{class: "gpu" | "row" | "in-sample" | "borrowed:<class>"}``
            (borrowed: too few GPUs of its own, see :data:`~perfcast.models.op_interval.SHIFT_DONORS`).
        feature_spec_version_, feature_names_, train_gpus_, gpu_domain_, dim_domain_.
        backward_classes_: op classes with backward rows among the training rows (attention
            measured forward only leaves ``attention`` out).
        train_elem_bytes_: element sizes (``DType.bytes_per_element``) of the training rows;
            other dtypes are out of domain.
        efficiency_ceiling_: ``{class: {dtype family: eta}}``, the efficiency ceilings of
            the physical bound (module docstring); a missing entry is 1.
    """

    def __init__(
        self,
        *,
        n_estimators: int = 400,
        learning_rate: float = 0.07,
        max_depth: int | None = None,
        subsample: float = 0.8,
        colsample_bytree: float = 0.8,
        min_child_weight: float = 5,
        max_rows_per_gpu: int = 40_000,
        calibrate: bool = True,
        random_state: int = 0,
        n_jobs: int = 2,
        timing: bool = False,
    ) -> None:
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.max_rows_per_gpu = max_rows_per_gpu
        self.calibrate = calibrate
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.timing = timing

    # ------------------------------------------------------------------------ fit

    def fit(self, X: pd.DataFrame, y: Any, *, sample_weight: Any = None) -> OpTimeRegressor:
        """Fit one booster per op class present in ``X`` and the interval.

        Args:
            X: op-table rows (``op``, shapes, ``dtype``, ``gpu``); groups are the GPUs.
            y: measured times, ms, > 0.
            sample_weight: optional row weights (> 0), applied within each GPU's equal share.

        Raises:
            SpecError: bad hyperparameters, mismatched lengths, non-positive times or
                weights, collective rows (see ``CollectiveTimeRegressor``), unknown ops/GPUs.
        """
        self._check_params()
        feats, t, w = self._check_xy(X, y, sample_weight)
        self.uses_timing_ = bool(self.timing)
        timing = self._row_timing(X)
        rng = np.random.default_rng(self.random_state)
        classes = [c for c in MODELLED_CLASSES if (feats["op_class"] == c).any()]

        self.__dict__.pop("_quantile_cache", None)
        self.launch_ms_: dict[tuple[str, str], float] = {}
        self.boosters_: dict[str, Any] = {}
        self.residuals_: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.interval_kind_: dict[str, str] = {}
        self.gpu_shifts_: dict[str, np.ndarray] = {}
        self.op_key_gpus_: dict[str, dict[str, tuple[str, ...]]] = {}
        self.rare_residuals_: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.feature_names_ = {c: self._feature_names(c) for c in classes}
        self.train_timings_: dict[str, tuple[str, ...]] = {}
        for cls in classes:
            m = (feats["op_class"] == cls).to_numpy()
            fc, tc, wc = feats.loc[m], t[m], w[m]
            tim = None if timing is None else timing[m]
            if tim is not None:
                self.train_timings_[cls] = tuple(sorted(pd.unique(tim)))
            launch, booster = self._fit_class(cls, fc, tc, wc, rng, self.max_rows_per_gpu, self.n_estimators, tim)
            self.launch_ms_.update(launch)
            self.boosters_[cls] = booster
            (res, weights), self.interval_kind_[cls] = self._fit_residuals(cls, fc, tc, wc, booster, launch, tim)
            gpus, keys = fc["gpu_id"].to_numpy(), op_interval.op_keys(fc)
            self.op_key_gpus_[cls] = op_interval.key_gpus(keys, gpus)
            if self.interval_kind_[cls] == "gpu":
                rare = op_interval.rare_op_residuals(res, gpus, keys, weights)
                if rare is not None:
                    self.rare_residuals_[cls] = rare
                res, self.gpu_shifts_[cls] = split_group_shifts(res, weights, gpus)
            else:
                self.gpu_shifts_[cls] = np.empty(0)
            grid = weighted_quantiles(res, weights, RESIDUAL_LEVELS)
            self.residuals_[cls] = (grid, np.ones_like(grid))
        op_interval.borrow_gpu_shifts(self.interval_kind_, self.gpu_shifts_)
        self.efficiency_ceiling_ = op_bounds.fit_efficiency_ceilings(feats, t, classes)

        self.feature_spec_version_ = FEATURE_SPEC_VERSION
        self.train_gpus_ = tuple(sorted(pd.unique(feats["gpu_id"])))
        self.train_elem_bytes_ = tuple(sorted(float(v) for v in pd.unique(feats["elem_bytes"].dropna())))
        backward = feats["is_backward"].fillna(0).to_numpy(dtype=float) > 0
        self.backward_classes_ = tuple(c for c in classes if (backward & (feats["op_class"] == c).to_numpy()).any())
        self.gpu_domain_ = op_domain.gpu_domain(self.train_gpus_)
        self.dim_domain_ = op_domain.dim_domain(feats, classes)
        return self

    def _feature_names(self, cls: str) -> tuple[str, ...]:
        """The booster's feature columns of ``cls``: the FeatureSpec's, plus the timing feature if used."""
        extra = (TIMING_FEATURE,) if getattr(self, "uses_timing_", False) else ()
        return (*FEATURE_SPEC.columns[cls], *extra)

    def _row_timing(self, X: pd.DataFrame) -> np.ndarray | None:
        """Each row's timing method (``None`` for a model that does not use it); queries default to QUERY_TIMING."""
        if not getattr(self, "uses_timing_", False):
            return None
        return record_timing(X, QUERY_TIMING)

    def _check_params(self) -> None:
        checks = {
            "n_estimators": isinstance(self.n_estimators, int | np.integer) and self.n_estimators >= 1,
            "learning_rate": 0 < self.learning_rate <= 1,
            "max_depth": self.max_depth is None
            or (isinstance(self.max_depth, int | np.integer) and self.max_depth >= 1),
            "subsample": 0 < self.subsample <= 1,
            "colsample_bytree": 0 < self.colsample_bytree <= 1,
            "min_child_weight": self.min_child_weight >= 0,
            "max_rows_per_gpu": isinstance(self.max_rows_per_gpu, int | np.integer) and self.max_rows_per_gpu >= 10,
            "n_jobs": isinstance(self.n_jobs, int | np.integer) and self.n_jobs >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            got = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            raise SpecError(f"invalid OpTimeRegressor hyperparameters: {got}")

    def _check_xy(self, X: Any, y: Any, sample_weight: Any) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
        if not isinstance(X, pd.DataFrame):
            raise SpecError(f"X must be an op-table DataFrame, got {type(X).__name__}")
        t = np.asarray(y, dtype=float).reshape(-1)
        if len(t) != len(X):
            raise SpecError(f"y has {len(t)} values for {len(X)} rows of X")
        if len(t) == 0:
            raise SpecError("X is empty: nothing to fit")
        bad = ~(np.isfinite(t) & (t > 0))
        if bad.any():
            raise SpecError(f"measured times must be finite and > 0 ms; {rows_hint(X.index[bad])} are not")
        w = np.ones(len(t)) if sample_weight is None else np.asarray(sample_weight, dtype=float).reshape(-1)
        if len(w) != len(t) or not (np.isfinite(w) & (w > 0)).all():
            raise SpecError(f"sample_weight must hold {len(t)} finite values > 0")
        feats = featurize_ops(X)
        coll = (feats["op_class"] == OpClass.COLLECTIVE.value).to_numpy()
        if coll.any():
            ops = ", ".join(sorted(pd.unique(X["op"].astype(str)[coll])))
            raise SpecError(
                f"OpTimeRegressor times compute ops only; {rows_hint(X.index[coll])} are collectives ({ops}): "
                "use CollectiveTimeRegressor"
            )
        nan_roof = ~np.isfinite(feats["roofline_ms"].to_numpy())
        if nan_roof.any():
            raise SpecError(f"no roofline time (missing shape columns?) for {rows_hint(X.index[nan_roof])}")
        return feats, t, w

    def _params(self, cls: str) -> dict[str, Any]:
        return {
            "objective": "reg:squarederror",
            "tree_method": "hist",
            "eta": self.learning_rate,
            "max_depth": self.max_depth if self.max_depth is not None else DEFAULT_MAX_DEPTH[cls],
            "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree,
            "min_child_weight": self.min_child_weight,
            "seed": self.random_state,
            "nthread": self.n_jobs,
            "verbosity": 0,
        }

    def _fit_class(
        self,
        cls: str,
        feats: pd.DataFrame,
        t: np.ndarray,
        w: np.ndarray,
        rng: np.random.Generator,
        max_rows: int,
        n_trees: int,
        timing: np.ndarray | None = None,
    ) -> tuple[dict[tuple[str, ...], float], Any]:
        """Launch terms and booster of one class (rows of that class only; trained here or on Dask)."""
        from perfcast.models.boosting import train_booster

        launch = fit_launch(cls, feats, t, timing)
        idx, weights = _sample_per_gpu(feats["gpu_id"].to_numpy(), w, max_rows, rng)
        tim = None if timing is None else timing[idx]
        base = base_ms(feats.iloc[idx], launch, cls, tim)
        target = np.log(t[idx] / base)
        names = list(self._feature_names(cls))
        booster = train_booster(
            self._params(cls),
            _matrix(feats.iloc[idx], cls, tim),
            target,
            weight=weights,
            feature_names=names,
            num_boost_round=int(n_trees),
        )
        return launch, booster

    def _fit_residuals(
        self,
        cls: str,
        feats: pd.DataFrame,
        t: np.ndarray,
        w: np.ndarray,
        booster: Any,
        launch: Mapping[tuple[str, ...], float],
        timing: np.ndarray | None = None,
    ) -> tuple[tuple[np.ndarray, np.ndarray], str]:
        """Log residuals, weights and interval kind of one class (:func:`.op_interval.fit_residuals`)."""
        inner_rows = max(10, int(self.max_rows_per_gpu * INNER_ROWS_FRACTION))
        inner_trees = max(1, int(round(self.n_estimators * INNER_TREES_FRACTION)))

        def in_sample(rows: np.ndarray) -> np.ndarray:
            tr = None if timing is None else timing[rows]
            return base_ms(feats.loc[rows], launch, cls, tr) * np.exp(_raw_predict(booster, feats.loc[rows], cls, tr))

        def out_of_fold(held: np.ndarray, rng: np.random.Generator) -> np.ndarray:
            tin, tout = (None, None) if timing is None else (timing[~held], timing[held])
            fi, ti = feats.loc[~held], t[~held]
            inner_launch, inner = self._fit_class(cls, fi, ti, w[~held], rng, inner_rows, inner_trees, tin)
            fo = feats.loc[held]
            return base_ms(fo, inner_launch, cls, tout) * np.exp(_raw_predict(inner, fo, cls, tout))

        return op_interval.fit_residuals(
            cls,
            feats["gpu_id"].to_numpy(),
            t,
            w,
            calibrate=self.calibrate,
            seed=self.random_state + 1,
            in_sample=in_sample,
            out_of_fold=out_of_fold,
        )

    # ------------------------------------------------------------------------ predict

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Median op time of each row, ms (shape ``(n,)``)."""
        check_is_fitted(self, "boosters_")
        feats = featurize_known(X, self.boosters_)
        warn_out_of_domain(self._out_of_domain(feats))
        return np.fmax(self._predict_ms(feats, self._row_timing(X)), self._floor_ms(feats))

    def efficiency_ceilings(self, X: pd.DataFrame) -> np.ndarray:
        """The efficiency ceiling ``eta`` of each row's class and dtype family (shape ``(n,)``, in (0, 1])."""
        check_is_fitted(self, "boosters_")
        feats = featurize_known(X, self.boosters_)
        return op_bounds.efficiency_ceilings(getattr(self, "efficiency_ceiling_", {}), feats)

    def _floor_ms(self, feats: pd.DataFrame) -> np.ndarray:
        """Physical floor of each row (:func:`~perfcast.models.op_bounds.floor_ms`), ms."""
        return op_bounds.floor_ms(getattr(self, "efficiency_ceiling_", {}), feats)

    def predict_interval(self, X: pd.DataFrame, *, coverage: float = 0.9) -> np.ndarray:
        """``(n, 2)`` interval, ms, meant to cover ``coverage`` of the rows of an unseen GPU.

        ``lo <= predict(X) <= hi`` always (the residual quantiles are clipped at 0).
        """
        return self.predict_with_interval(X, coverage=coverage)[1]

    def predict_with_interval(self, X: pd.DataFrame, *, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`predict` and :meth:`predict_interval` from one featurisation: ``(pred, (n, 2))``, ms."""
        pred, out, _ = self._predict_flagged(X, coverage)
        return pred, out

    def predict_flagged(self, X: pd.DataFrame, *, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`predict_with_interval` and :meth:`out_of_domain` from one featurisation.

        Returns:
            ``(pred, interval, ood)``: ``(n,)`` ms, ``(n, 2)`` ms and ``(n,)`` bool.
        """
        return self._predict_flagged(X, coverage)

    def _predict_flagged(self, X: pd.DataFrame, coverage: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        check_is_fitted(self, "boosters_")
        check_coverage(coverage)
        feats = featurize_known(X, self.boosters_)
        ood = self._out_of_domain(feats)
        warn_out_of_domain(ood, stacklevel=4)
        floor = self._floor_ms(feats)
        pred = np.fmax(self._predict_ms(feats, self._row_timing(X)), floor)
        out = np.empty((len(pred), 2))
        classes = feats["op_class"].to_numpy()
        for cls in pd.unique(classes):
            m = classes == cls
            q_lo, q_hi = self.residual_quantiles(cls, coverage)
            q_rare = self._rare_op_quantile(cls, coverage)
            if q_rare > 0:
                keys, gpus = op_interval.op_keys(feats[m]), feats["gpu_id"].to_numpy()[m]
                rare = op_interval.rare_rows(keys, gpus, self.op_key_gpus_[cls])
                q_lo, q_hi = np.where(rare, min(q_lo, -q_rare), q_lo), np.where(rare, max(q_hi, q_rare), q_hi)
            out[m] = log_interval(pred[m], q_lo, q_hi)
        out[:, 0] = np.fmax(out[:, 0], floor)
        return pred, out, ood

    def residual_quantiles(self, op_class: str, coverage: float = 0.9) -> tuple[float, float]:
        """The log-residual quantiles ``(q_lo <= 0 <= q_hi)`` of ``op_class``'s interval.

        With a GPU-level calibration (own or borrowed shifts), ``(-q, q)`` for ``q`` the
        ``coverage`` quantile of the random-effect ``|S + E|``; otherwise the ``(1-c)/2`` and
        ``(1+c)/2`` quantiles of the row-fold or in-sample residuals
        (:func:`~perfcast.models.op_interval.residual_quantiles`).

        The result is cached per ``(op_class, coverage)`` on the model (cleared by ``fit``,
        empty after loading; not saved).
        """
        check_is_fitted(self, "boosters_")
        cache = self.__dict__.setdefault("_quantile_cache", {})
        key = (op_class, float(coverage))
        if key not in cache:
            cache[key] = self._residual_quantiles(op_class, coverage)
        return cache[key]

    def _rare_op_quantile(self, op_class: str, coverage: float) -> float:
        """The least ``|log|`` half-width of a rare op key's interval (:func:`.op_interval.rare_op_quantile`;
        0 for a class without rare-op residuals, and for bundles saved before them). Cached like
        :meth:`residual_quantiles`."""
        cache = self.__dict__.setdefault("_quantile_cache", {})
        key = ("rare", op_class, float(coverage))
        if key not in cache:
            cache[key] = op_interval.rare_op_quantile(getattr(self, "rare_residuals_", {}).get(op_class), coverage)
        return cache[key]

    def _residual_quantiles(self, op_class: str, coverage: float) -> tuple[float, float]:
        values, weights = self.residuals_[op_class]
        shifts = self.gpu_shifts_.get(op_class, np.empty(0))
        return op_interval.residual_quantiles(values, weights, shifts, coverage)

    def feature_importance(self) -> dict[str, dict[str, float]]:
        """Total gain of each feature, per op class."""
        check_is_fitted(self, "boosters_")
        return {cls: dict(b.get_score(importance_type="total_gain")) for cls, b in self.boosters_.items()}

    def out_of_domain(self, X: pd.DataFrame) -> np.ndarray:
        """Boolean per row: its GPU's descriptors, its dtype or its log dims lie outside the training domain.

        The rule is :func:`perfcast.models.op_domain.out_of_domain`'s.
        """
        check_is_fitted(self, "boosters_")
        return self._out_of_domain(featurize_known(X, self.boosters_))

    def _predict_ms(self, feats: pd.DataFrame, timing: np.ndarray | None) -> np.ndarray:
        out = np.empty(len(feats))
        for cls in pd.unique(feats["op_class"]):
            m = (feats["op_class"] == cls).to_numpy()
            fc = feats.loc[m]
            tim = None if timing is None else timing[m]
            out[m] = base_ms(fc, self.launch_ms_, cls, tim) * np.exp(_raw_predict(self.boosters_[cls], fc, cls, tim))
        return out

    def _out_of_domain(self, feats: pd.DataFrame) -> np.ndarray:
        sizes = getattr(self, "train_elem_bytes_", op_domain.LEGACY_ELEM_BYTES)
        return op_domain.out_of_domain(feats, self.gpu_domain_, self.dim_domain_, sizes)

    # ------------------------------------------------------------------------ persistence

    def _save_to(self, directory: str | Path) -> dict[str, Any]:
        """Write ``op_<class>.ubj`` boosters into ``directory``; return the JSON-able rest."""
        check_is_fitted(self, "boosters_")
        directory = Path(directory)
        key_gpus = getattr(self, "op_key_gpus_", {})
        files = {}
        for cls, booster in self.boosters_.items():
            name = f"op_{cls}.ubj"
            booster.save_model(str(directory / name))
            files[cls] = name
        return {
            "class": f"{type(self).__module__}.{type(self).__qualname__}",
            "params": self.get_params(),
            "feature_spec_version": self.feature_spec_version_,
            "files": files,
            "feature_names": {c: list(v) for c, v in self.feature_names_.items()},
            "launch_ms": [[*key, float(ms)] for key, ms in self.launch_ms_.items()],
            "timing": bool(getattr(self, "uses_timing_", False)),
            "train_timings": {c: list(v) for c, v in getattr(self, "train_timings_", {}).items()},
            "interval_kind": dict(self.interval_kind_),
            "gpu_shifts": {c: v.tolist() for c, v in self.gpu_shifts_.items()},
            "residuals": {
                c: {"values": vals.tolist(), "weights": wts.tolist()} for c, (vals, wts) in self.residuals_.items()
            },
            "op_key_gpus": {c: {k: list(g) for k, g in v.items()} for c, v in key_gpus.items()},
            "rare_residuals": {c: v.tolist() for c, (v, _) in getattr(self, "rare_residuals_", {}).items()},
            "train_gpus": list(self.train_gpus_),
            "train_elem_bytes": list(self.train_elem_bytes_),
            "backward_classes": list(getattr(self, "backward_classes_", ())),
            "gpu_domain": {k: list(v) for k, v in self.gpu_domain_.items()},
            "dim_domain": {c: {k: list(v) for k, v in r.items()} for c, r in self.dim_domain_.items()},
            "efficiency_margin": op_bounds.EFFICIENCY_MARGIN,
            "efficiency_ceiling": {c: dict(r) for c, r in getattr(self, "efficiency_ceiling_", {}).items()},
        }

    @classmethod
    def _load_from(cls, directory: str | Path, meta: Mapping[str, Any]) -> OpTimeRegressor:
        """Rebuild a fitted model from :meth:`_save_to`'s files and dict."""
        import xgboost as xgb

        directory = Path(directory)
        try:
            # a model saved before the timing method existed does not use it (absent = False)
            model = cls(**{"timing": False, **meta["params"]})
            model.uses_timing_ = bool(meta.get("timing", False))
            model.train_timings_ = {c: tuple(v) for c, v in meta.get("train_timings", {}).items()}
            model.feature_spec_version_ = int(meta["feature_spec_version"])
            if model.feature_spec_version_ != FEATURE_SPEC_VERSION:
                raise BundleError(
                    f"op model was saved with FeatureSpec version {model.feature_spec_version_}; "
                    f"this perfcast has version {FEATURE_SPEC_VERSION}"
                )
            model.feature_names_ = {c: tuple(v) for c, v in meta["feature_names"].items()}
            for c, names in model.feature_names_.items():
                if names != model._feature_names(c):
                    raise BundleError(f"op model's {c} features differ from FeatureSpec version {FEATURE_SPEC_VERSION}")
            model.launch_ms_ = {tuple(entry[:-1]): float(entry[-1]) for entry in meta["launch_ms"]}
            model.interval_kind_ = dict(meta["interval_kind"])
            # bundles written before the random-effect interval have no shifts: pooled residuals
            model.gpu_shifts_ = {c: np.asarray(v, dtype=float) for c, v in meta.get("gpu_shifts", {}).items()}
            model.residuals_ = {
                c: (np.asarray(r["values"], dtype=float), np.asarray(r["weights"], dtype=float))
                for c, r in meta["residuals"].items()
            }
            # bundles written before the rare-op interval have neither: every op gets the class's interval
            model.op_key_gpus_ = {
                c: {k: tuple(g) for k, g in v.items()} for c, v in meta.get("op_key_gpus", {}).items()
            }
            model.rare_residuals_ = {
                c: (np.asarray(v, dtype=float), np.ones(len(v))) for c, v in meta.get("rare_residuals", {}).items()
            }
            model.train_gpus_ = tuple(meta["train_gpus"])
            model.train_elem_bytes_ = tuple(float(v) for v in meta.get("train_elem_bytes", op_domain.LEGACY_ELEM_BYTES))
            model.backward_classes_ = tuple(meta.get("backward_classes", ()))  # older bundles: forward rows only
            model.gpu_domain_ = {k: (float(a), float(b)) for k, (a, b) in meta["gpu_domain"].items()}
            model.dim_domain_ = {
                c: {k: (float(a), float(b)) for k, (a, b) in r.items()} for c, r in meta["dim_domain"].items()
            }
            # bundles written before the physical bound have no ceilings: efficiency 1 (the roofline)
            model.efficiency_ceiling_ = {
                c: {f: float(eta) for f, eta in r.items()} for c, r in meta.get("efficiency_ceiling", {}).items()
            }
            boosters = {}
            for c, name in meta["files"].items():
                path = directory / name
                if not path.is_file():
                    raise BundleError(f"bundle file {path} is missing")
                booster = xgb.Booster()
                booster.load_model(str(path))
                booster.set_param({"nthread": model.n_jobs})
                boosters[c] = booster
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"op model metadata in {directory} is malformed: {exc!r}") from None
        model.boosters_ = boosters
        return model


# --------------------------------------------------------------------------- helpers


def _raw_predict(booster: Any, feats: pd.DataFrame, cls: str, timing: np.ndarray | None = None) -> np.ndarray:
    """The booster's log ratio for rows of ``cls`` (features selected by name; the timing feature last if given)."""
    if timing is None:
        return booster.inplace_predict(feats[list(FEATURE_SPEC.columns[cls])].astype(np.float32))
    return booster.inplace_predict(_matrix(feats, cls, timing))


def _matrix(feats: pd.DataFrame, cls: str, timing: np.ndarray | None) -> np.ndarray:
    """Float32 feature matrix of rows of ``cls``: the FeatureSpec columns, then the timing feature if given."""
    x = feats[list(FEATURE_SPEC.columns[cls])].to_numpy(dtype=np.float32)
    if timing is None:
        return x
    return np.column_stack([x, timing_feature(timing).astype(np.float32)])


def _sample_per_gpu(
    gpus: np.ndarray, w: np.ndarray, max_rows: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (at most ``max_rows`` per GPU, seeded) and weights, equal total per GPU, mean 1."""
    parts = []
    for gpu in sorted(pd.unique(gpus)):
        rows = np.flatnonzero(gpus == gpu)
        if len(rows) > max_rows:
            rows = np.sort(rng.choice(rows, max_rows, replace=False))
        parts.append(rows)
    idx = np.concatenate(parts)
    return idx, gpu_equal_weights(gpus[idx], w[idx])
