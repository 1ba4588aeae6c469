"""Learned per-op time model: XGBoost on the log ratio of measured time to a physics base.

For an op of class ``c`` (gemm, vector, attention) on a GPU of vendor ``v``:

.. math::

    t_\\text{base} = L_{v,c} + t_\\text{roofline}, \\qquad
    \\hat t = t_\\text{base} \\cdot \\exp f_c(x)

where ``t_roofline`` is the roofline time at the row dtype's peak
(:func:`perfcast.features.roofline.roofline_time_s`), ``L_{v,c}`` a launch/host constant
(the 5% quantile of the measured times of the training ops whose roofline is under 1 us,
per vendor and class) and ``f_c`` one XGBoost booster per class fitted on
``log(t / t_base)`` over the GPU-relative features of :mod:`perfcast.features.op_features`.
The physics carries the scale, the trees the efficiency, so the model transfers to GPUs
it has not seen (leave-one-GPU-out results: ``benchmarks/results/op_logo.md``).

The interval answers "how wrong is the model on a GPU it has not seen". An inner
leave-one-GPU-out loop over the ``n`` training GPUs collects out-of-GPU log residuals.
They split into a shift per GPU (the median residual of its ops, ``s_g``) and the spread
of the ops around it (``e``, each GPU with equal total weight). Since the shifts dominate
and come from a handful of GPUs, the interval treats the shift of a new GPU as a draw of a
random effect, a Student-t predictive over the ``n`` observed shifts,

.. math::

    r = S + E, \\qquad S \\sim \\bar s + s_s \\sqrt{1 + 1/n}\\; t_{n-1}, \\qquad E \\sim \\{e\\},

and the interval is ``pred * exp([-q, q])`` with ``q`` the ``c`` quantile of ``|r|``: the
absolute-residual score of split conformal, symmetric in log time around the median. It
widens with the disagreement between GPUs rather than being set by the ops of the GPUs
seen, so a GPU unlike the rest keeps most of its coverage. It is symmetric because the
skew of a handful of calibration GPUs' residuals does not carry to the next GPU (the
comparison with the skewed quantile interval: ``benchmarks/results/docstring_notes.md``).

Physical bounds. Whatever the trees say, a predicted time is never below the op's
roofline time, and its efficiency ``t_roofline / t`` never above the best the training data
measured for the op's class and dtype family:

.. math::

    \\hat t \\ge t_\\text{roofline} / \\eta_{c,d}, \\qquad
    \\eta_{c,d} = \\min\\bigl(1,\\; (1 + m) \\max_{\\text{train } c, d} t_\\text{roofline} / t\\bigr)

with ``m`` = :data:`EFFICIENCY_MARGIN` (+10% relative) and ``d`` the dtype family
(:func:`dtype_family`: 32-bit, 16-bit, 8-bit, 4-bit, by element size). The ceilings are
fitted with the boosters and saved with them (``efficiency_ceiling_``); a (class, family)
without training rows, and a bundle saved before the bound, use ``eta = 1``, the roofline
itself. The median is raised to the floor; the interval is then built around the raised
median and its lower end raised to the floor too, so ``floor <= lo <= pred <= hi``. The
inner leave-one-GPU-out residuals of the interval are those of the unbounded model.

Shapes:
    ``X``: (n,) op-table rows (a DataFrame); ``predict``: (n,) ms;
    ``predict_interval``: (n, 2) ms, ``lo <= predict <= hi``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from perfcast.errors import BundleError, OutOfDomainWarning, SpecError
from perfcast.features.hardware import HardwareSpec
from perfcast.features.op_features import FEATURE_SPEC, FEATURE_SPEC_VERSION, featurize_ops
from perfcast.features.ops import OpClass

__all__ = ["DEFAULT_LAUNCH_MS", "EFFICIENCY_MARGIN", "OpTimeRegressor", "dtype_family"]

logger = logging.getLogger(__name__)

MODELLED_CLASSES = (OpClass.GEMM.value, OpClass.VECTOR.value, OpClass.ATTENTION.value)
DEFAULT_MAX_DEPTH = {OpClass.GEMM.value: 4, OpClass.VECTOR.value: 5, OpClass.ATTENTION.value: 5}

DEFAULT_LAUNCH_MS = 0.02
"""Launch term when the training set has too few tiny ops to measure it: 20 us, a typical
PyTorch eager op's launch plus host overhead on a discrete GPU (NeuSight's fastest ops run
in 5-20 us)."""
LAUNCH_ROOFLINE_MS = 1e-3  # ops whose roofline is under 1 us measure the launch term
LAUNCH_QUANTILE = 0.05
MIN_LAUNCH_ROWS = 50  # tiny ops needed per (vendor, class); else the class's pooled value
POOLED = "*"  # vendor key of a class's pooled launch term

INNER_ROWS_FRACTION = 0.5  # the inner LOGO loop fits on half the rows ...
INNER_TREES_FRACTION = 0.75  # ... and 3/4 of the trees (research: 20k rows / 300 trees)
MIN_CALIBRATION_GPUS = 3
N_ROW_FOLDS = 5

SHIFT_DONORS = {OpClass.ATTENTION.value: OpClass.GEMM.value}
"""A class fitted on fewer than MIN_CALIBRATION_GPUS GPUs borrows the GPU shifts of this class:
fused attention is matmul-bound, and the shipped default learns it from one GPU (H200)."""

# GPU descriptors checked by out_of_domain (catalog fields).
DOMAIN_DESCRIPTORS = ("sm_count", "mem_bw_gbps", "l2_cache_mib", "peak_fp32_tflops")
DOMAIN_DIMS = {
    OpClass.GEMM.value: ("l_b", "l_m", "l_n", "l_k"),
    OpClass.VECTOR.value: ("l_rows", "l_cols"),
    OpClass.ATTENTION.value: ("l_b", "l_heads", "l_seq_q", "l_seq_kv", "l_head_dim"),
}
_DOMAIN_TOL = 1e-9
LEGACY_ELEM_BYTES = (1.0, 2.0, 4.0)
"""Element sizes (fp8, 16-bit, 32-bit) assumed for a bundle that does not record its training
dtypes: every dtype that existed before the block-scaled ones. A row whose dtype's size
(``elem_bytes``) is not among the training sizes is out of domain: its correction comes from
other formats' efficiency over its own roofline."""


EFFICIENCY_MARGIN = 0.10
"""Relative margin over the best measured efficiency (roofline / time) of a class and dtype family."""
DTYPE_FAMILIES = ((3.0, "32-bit"), (1.5, "16-bit"), (0.75, "8-bit"), (0.0, "4-bit"))
"""(smallest element size in bytes, family): fp32/tf32, fp16/bf16, fp8/mxfp8, nvfp4/mxfp4."""


def dtype_family(elem_bytes: Any) -> np.ndarray:
    """Dtype family of each element size (``DType.bytes_per_element``, block scales included)."""
    elem = np.asarray(elem_bytes, dtype=float).reshape(-1)
    out = np.full(len(elem), DTYPE_FAMILIES[-1][1], dtype=object)
    for size, family in reversed(DTYPE_FAMILIES):
        out[elem >= size] = family
    return out


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """Lower weighted quantile: the smallest value whose cumulative weight share reaches ``q``."""
    order = np.argsort(values, kind="stable")
    cw = np.cumsum(weights[order])
    cw = cw / cw[-1]
    idx = min(int(np.searchsorted(cw, q, side="left")), len(values) - 1)
    return float(values[order][idx])


RESIDUAL_GRID = 1001
"""Equal-weight points kept of each class's residual distribution (quantile steps of 0.1%)."""


def compress_residuals(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weighted residual distribution as ``RESIDUAL_GRID`` equal-weight quantile points."""
    order = np.argsort(values, kind="stable")
    cw = np.cumsum(weights[order])
    cw = cw / cw[-1]
    levels = np.linspace(0.0, 1.0, RESIDUAL_GRID)
    idx = np.minimum(np.searchsorted(cw, levels, side="left"), len(values) - 1)
    grid = values[order][idx]
    return grid, np.ones_like(grid)


def _rows_hint(index: pd.Index, limit: int = 5) -> str:
    shown = ", ".join(map(str, list(index[:limit])))
    more = f" and {len(index) - limit} more" if len(index) > limit else ""
    return f"rows {shown}{more}"


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

    Fitted attributes:
        launch_ms_: ``{(vendor, class): ms}``, ``(POOLED, class)`` the class fallback.
        boosters_: ``{class: xgboost.Booster}``.
        residuals_: ``{class: (log_residuals, weights)}`` of the interval: the ops' spread
            around their GPU's shift when ``gpu_shifts_[class]`` is set, else the plain
            (row-fold or in-sample) residuals.
        gpu_shifts_: ``{class: shifts}``, the median out-of-GPU log residual of each
            calibration GPU (empty without a GPU-level calibration).
        interval_kind_: ``{class: "gpu" | "row" | "in-sample" | "borrowed:<class>"}``
            (borrowed: too few GPUs of its own, see :data:`SHIFT_DONORS`).
        feature_spec_version_, feature_names_, train_gpus_, gpu_domain_, dim_domain_.
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
        rng = np.random.default_rng(self.random_state)
        classes = [c for c in MODELLED_CLASSES if (feats["op_class"] == c).any()]

        self.__dict__.pop("_quantile_cache", None)
        self.launch_ms_: dict[tuple[str, str], float] = {}
        self.boosters_: dict[str, Any] = {}
        self.residuals_: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.interval_kind_: dict[str, str] = {}
        self.gpu_shifts_: dict[str, np.ndarray] = {}
        self.feature_names_ = {c: tuple(FEATURE_SPEC.columns[c]) for c in classes}
        for cls in classes:
            m = (feats["op_class"] == cls).to_numpy()
            fc, tc, wc = feats.loc[m], t[m], w[m]
            launch, booster = self._fit_class(cls, fc, tc, wc, rng, self.max_rows_per_gpu, self.n_estimators)
            self.launch_ms_.update(launch)
            self.boosters_[cls] = booster
            (res, weights), self.interval_kind_[cls] = self._fit_residuals(cls, fc, tc, wc, booster, launch)
            if self.interval_kind_[cls] == "gpu":
                res, self.gpu_shifts_[cls] = _split_gpu_shifts(res, weights, fc["gpu_id"].to_numpy())
            else:
                self.gpu_shifts_[cls] = np.empty(0)
            self.residuals_[cls] = compress_residuals(res, weights)
        self._borrow_gpu_shifts()
        self.efficiency_ceiling_ = _fit_efficiency_ceilings(feats, t, classes)

        self.feature_spec_version_ = FEATURE_SPEC_VERSION
        self.train_gpus_ = tuple(sorted(pd.unique(feats["gpu_id"])))
        self.train_elem_bytes_ = tuple(sorted(float(v) for v in pd.unique(feats["elem_bytes"].dropna())))
        self.gpu_domain_ = _gpu_domain(self.train_gpus_)
        self.dim_domain_ = {
            cls: {
                col: (float(feats.loc[feats["op_class"] == cls, col].min()),
                      float(feats.loc[feats["op_class"] == cls, col].max()))
                for col in DOMAIN_DIMS[cls]
            }
            for cls in classes
        }  # fmt: skip
        return self

    def _borrow_gpu_shifts(self) -> None:
        """Give a class fitted on too few GPUs the GPU shifts of its :data:`SHIFT_DONORS` class.

        Its interval then adds the donor's spread between GPUs to its own within-GPU spread
        (``interval_kind_`` ``"borrowed:<donor>"``) instead of covering only the GPUs it saw.
        """
        for cls, donor in SHIFT_DONORS.items():
            if (
                self.interval_kind_.get(cls, "gpu") != "gpu"
                and self.interval_kind_.get(donor) == "gpu"
                and len(self.gpu_shifts_[donor]) >= MIN_CALIBRATION_GPUS
            ):
                self.gpu_shifts_[cls] = self.gpu_shifts_[donor].copy()
                self.interval_kind_[cls] = f"borrowed:{donor}"
                logger.warning(
                    "%s: instead of that within-GPU interval, the %s class's shifts between %d GPUs are added to "
                    "its spread (a GPU-level interval borrowed from %s)",
                    cls, donor, len(self.gpu_shifts_[donor]), donor,
                )  # fmt: skip

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
            raise SpecError(f"measured times must be finite and > 0 ms; {_rows_hint(X.index[bad])} are not")
        w = np.ones(len(t)) if sample_weight is None else np.asarray(sample_weight, dtype=float).reshape(-1)
        if len(w) != len(t) or not (np.isfinite(w) & (w > 0)).all():
            raise SpecError(f"sample_weight must hold {len(t)} finite values > 0")
        feats = featurize_ops(X)
        coll = (feats["op_class"] == OpClass.COLLECTIVE.value).to_numpy()
        if coll.any():
            ops = ", ".join(sorted(pd.unique(X["op"].astype(str)[coll])))
            raise SpecError(
                f"OpTimeRegressor times compute ops only; {_rows_hint(X.index[coll])} are collectives ({ops}): "
                "use CollectiveTimeRegressor"
            )
        nan_roof = ~np.isfinite(feats["roofline_ms"].to_numpy())
        if nan_roof.any():
            raise SpecError(f"no roofline time (missing shape columns?) for {_rows_hint(X.index[nan_roof])}")
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
    ) -> tuple[dict[tuple[str, str], float], Any]:
        """Launch terms and booster of one class (rows of that class only; trained here or on Dask)."""
        from perfcast.models.boosting import train_booster

        launch = _fit_launch(cls, feats, t)
        idx, weights = _sample_per_gpu(feats["gpu_id"].to_numpy(), w, max_rows, rng)
        base = _base_ms(feats.iloc[idx], launch, cls)
        target = np.log(t[idx] / base)
        names = list(FEATURE_SPEC.columns[cls])
        booster = train_booster(
            self._params(cls),
            feats.iloc[idx][names].to_numpy(dtype=np.float32),
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
        launch: Mapping[tuple[str, str], float],
    ) -> tuple[tuple[np.ndarray, np.ndarray], str]:
        """Log residuals ``log(t / pred)`` and their weights for the interval of one class."""
        gpus = feats["gpu_id"].to_numpy()
        distinct = sorted(pd.unique(gpus))
        if not self.calibrate:
            pred = _base_ms(feats, launch, cls) * np.exp(_raw_predict(booster, feats, cls))
            return (np.log(t / pred), _gpu_equal_weights(gpus, w)), "in-sample"
        inner_rows = max(10, int(self.max_rows_per_gpu * INNER_ROWS_FRACTION))
        inner_trees = max(1, int(round(self.n_estimators * INNER_TREES_FRACTION)))
        rng = np.random.default_rng(self.random_state + 1)
        res = np.full(len(t), np.nan)
        if len(distinct) >= MIN_CALIBRATION_GPUS:
            kind = "gpu"
            folds = [gpus == g for g in distinct]
        else:
            kind = "row"
            logger.warning(
                "%s: only %d training GPU(s) (%s); the interval comes from %d-fold out-of-fold residuals over "
                "rows, a WITHIN-GPU interval that under-covers on unseen GPUs",
                cls, len(distinct), ", ".join(distinct), N_ROW_FOLDS,
            )  # fmt: skip
            n_folds = min(N_ROW_FOLDS, len(t))
            fold_of = rng.permutation(len(t)) % n_folds
            folds = [fold_of == f for f in range(n_folds)] if n_folds >= 2 else []
        for held in folds:
            if held.all() or not held.any():
                continue
            fi, ti = feats.loc[~held], t[~held]
            inner_launch, inner = self._fit_class(cls, fi, ti, w[~held], rng, inner_rows, inner_trees)
            fo = feats.loc[held]
            pred = _base_ms(fo, inner_launch, cls) * np.exp(_raw_predict(inner, fo, cls))
            res[held] = np.log(t[held] / pred)
        if np.isnan(res).any():  # too few rows to hold any out: in-sample
            miss = np.isnan(res)
            pred = _base_ms(feats.loc[miss], launch, cls) * np.exp(_raw_predict(booster, feats.loc[miss], cls))
            res[miss] = np.log(t[miss] / pred)
            kind = "in-sample" if miss.all() else kind
        return (res, _gpu_equal_weights(gpus, w)), kind

    # ------------------------------------------------------------------------ predict

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Median op time of each row, ms (shape ``(n,)``)."""
        check_is_fitted(self, "boosters_")
        feats = self._featurize_checked(X)
        self._warn_out_of_domain(self._out_of_domain(feats))
        return np.fmax(self._predict_ms(feats), self._floor_ms(feats))

    def efficiency_ceilings(self, X: pd.DataFrame) -> np.ndarray:
        """The efficiency ceiling ``eta`` of each row's class and dtype family (shape ``(n,)``, in (0, 1])."""
        check_is_fitted(self, "boosters_")
        return self._ceilings(self._featurize_checked(X))

    def _ceilings(self, feats: pd.DataFrame) -> np.ndarray:
        ceilings = getattr(self, "efficiency_ceiling_", {})
        families = dtype_family(feats["elem_bytes"].to_numpy(dtype=float))
        classes = feats["op_class"].to_numpy()
        out = np.ones(len(feats))
        for cls, by_family in ceilings.items():
            for family, eta in by_family.items():
                out[(classes == cls) & (families == family)] = eta
        return out

    def _floor_ms(self, feats: pd.DataFrame) -> np.ndarray:
        """Physical floor of each row: its roofline time over its efficiency ceiling, ms."""
        return feats["roofline_ms"].to_numpy(dtype=float) / self._ceilings(feats)

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
        if not 0 < coverage < 1:
            raise SpecError(f"coverage={coverage!r} must be in (0, 1)")
        feats = self._featurize_checked(X)
        ood = self._out_of_domain(feats)
        self._warn_out_of_domain(ood, stacklevel=4)
        floor = self._floor_ms(feats)
        pred = np.fmax(self._predict_ms(feats), floor)
        out = np.empty((len(pred), 2))
        classes = feats["op_class"].to_numpy()
        for cls in pd.unique(classes):
            m = classes == cls
            q_lo, q_hi = self.residual_quantiles(cls, coverage)
            out[m, 0] = pred[m] * np.exp(q_lo)
            out[m, 1] = pred[m] * np.exp(q_hi)
        out[:, 0] = np.fmax(out[:, 0], floor)
        return pred, out, ood

    def residual_quantiles(self, op_class: str, coverage: float = 0.9) -> tuple[float, float]:
        """The log-residual quantiles ``(q_lo <= 0 <= q_hi)`` of ``op_class``'s interval.

        With a GPU-level calibration (own or borrowed shifts), ``(-q, q)`` for ``q`` the
        ``coverage`` quantile of the random-effect ``|S + E|`` (module docstring); otherwise the ``(1-c)/2`` and
        ``(1+c)/2`` quantiles of the row-fold or in-sample residuals.

        The result is cached per ``(op_class, coverage)`` on the model (cleared by ``fit``,
        empty after loading; not saved).
        """
        check_is_fitted(self, "boosters_")
        cache = self.__dict__.setdefault("_quantile_cache", {})
        key = (op_class, float(coverage))
        if key not in cache:
            cache[key] = self._residual_quantiles(op_class, coverage)
        return cache[key]

    def _residual_quantiles(self, op_class: str, coverage: float) -> tuple[float, float]:
        values, weights = self.residuals_[op_class]
        shifts = self.gpu_shifts_.get(op_class, np.empty(0))
        if len(shifts) >= MIN_CALIBRATION_GPUS:
            q = _random_effect_abs_quantile(shifts, values, weights, coverage)
            q_lo, q_hi = -q, q
        else:
            q_lo = weighted_quantile(values, weights, (1 - coverage) / 2)
            q_hi = weighted_quantile(values, weights, (1 + coverage) / 2)
        return min(q_lo, 0.0), max(q_hi, 0.0)

    def feature_importance(self) -> dict[str, dict[str, float]]:
        """Total gain of each feature, per op class."""
        check_is_fitted(self, "boosters_")
        return {cls: dict(b.get_score(importance_type="total_gain")) for cls, b in self.boosters_.items()}

    def out_of_domain(self, X: pd.DataFrame) -> np.ndarray:
        """Boolean per row: its GPU's descriptors or its log dims fall outside the training range.

        GPU descriptors (:data:`DOMAIN_DESCRIPTORS`) are compared with the range over the
        training GPUs; a missing catalog figure counts as outside. Dims are the class's
        :data:`DOMAIN_DIMS`.
        """
        check_is_fitted(self, "boosters_")
        return self._out_of_domain(self._featurize_checked(X))

    def _featurize_checked(self, X: Any) -> pd.DataFrame:
        if not isinstance(X, pd.DataFrame):
            raise SpecError(f"X must be an op-table DataFrame, got {type(X).__name__}")
        feats = featurize_ops(X)
        unknown = ~feats["op_class"].isin(list(self.boosters_)).to_numpy()
        if unknown.any():
            ops = ", ".join(sorted(pd.unique(X["op"].astype(str)[unknown])))
            classes = ", ".join(sorted(pd.unique(feats["op_class"][unknown])))
            raise SpecError(
                f"no model for op class {classes} (ops {ops}, {_rows_hint(X.index[unknown])}); "
                f"this model was trained on: {', '.join(self.boosters_)}"
            )
        return feats

    def _predict_ms(self, feats: pd.DataFrame) -> np.ndarray:
        out = np.empty(len(feats))
        for cls in pd.unique(feats["op_class"]):
            m = (feats["op_class"] == cls).to_numpy()
            fc = feats.loc[m]
            out[m] = _base_ms(fc, self.launch_ms_, cls) * np.exp(_raw_predict(self.boosters_[cls], fc, cls))
        return out

    def _out_of_domain(self, feats: pd.DataFrame) -> np.ndarray:
        flags = np.zeros(len(feats), dtype=bool)
        gpu_ids = feats["gpu_id"].to_numpy()
        for gpu in pd.unique(gpu_ids):
            hw = HardwareSpec.from_name(gpu)
            for name, (lo, hi) in self.gpu_domain_.items():
                value = getattr(hw, name)
                if value is None or not (lo - _DOMAIN_TOL <= value <= hi + _DOMAIN_TOL):
                    flags[gpu_ids == gpu] = True
                    break
        sizes = np.asarray(getattr(self, "train_elem_bytes_", LEGACY_ELEM_BYTES), dtype=float)
        elem = feats["elem_bytes"].to_numpy(dtype=float)
        seen = np.isclose(elem[:, None], sizes[None, :], rtol=0.0, atol=1e-6).any(axis=1)
        flags |= ~np.isnan(elem) & ~seen
        for cls, ranges in self.dim_domain_.items():
            m = (feats["op_class"] == cls).to_numpy()
            for col, (lo, hi) in ranges.items():
                v = feats[col].to_numpy()
                flags |= m & ((v < lo - _DOMAIN_TOL) | (v > hi + _DOMAIN_TOL))
        return flags

    def _warn_out_of_domain(self, ood: np.ndarray, stacklevel: int = 3) -> None:
        """Warn (:class:`OutOfDomainWarning`) when any of the ``ood`` flags is set."""
        n = int(ood.sum())
        if n:
            warnings.warn(
                f"{n} of {len(ood)} op rows lie outside the training domain (GPU descriptors outside the "
                f"training GPUs' range, or dims outside the trained range): their predictions extrapolate",
                OutOfDomainWarning,
                stacklevel=stacklevel,
            )

    # ------------------------------------------------------------------------ persistence

    def _save_to(self, directory: str | Path) -> dict[str, Any]:
        """Write ``op_<class>.ubj`` boosters into ``directory``; return the JSON-able rest."""
        check_is_fitted(self, "boosters_")
        directory = Path(directory)
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
            "launch_ms": [[v, c, float(ms)] for (v, c), ms in self.launch_ms_.items()],
            "interval_kind": dict(self.interval_kind_),
            "gpu_shifts": {c: v.tolist() for c, v in self.gpu_shifts_.items()},
            "residuals": {
                c: {"values": vals.tolist(), "weights": wts.tolist()} for c, (vals, wts) in self.residuals_.items()
            },
            "train_gpus": list(self.train_gpus_),
            "train_elem_bytes": list(self.train_elem_bytes_),
            "gpu_domain": {k: list(v) for k, v in self.gpu_domain_.items()},
            "dim_domain": {c: {k: list(v) for k, v in r.items()} for c, r in self.dim_domain_.items()},
            "efficiency_margin": EFFICIENCY_MARGIN,
            "efficiency_ceiling": {c: dict(r) for c, r in getattr(self, "efficiency_ceiling_", {}).items()},
        }

    @classmethod
    def _load_from(cls, directory: str | Path, meta: Mapping[str, Any]) -> OpTimeRegressor:
        """Rebuild a fitted model from :meth:`_save_to`'s files and dict."""
        import xgboost as xgb

        directory = Path(directory)
        try:
            model = cls(**meta["params"])
            model.feature_spec_version_ = int(meta["feature_spec_version"])
            if model.feature_spec_version_ != FEATURE_SPEC_VERSION:
                raise BundleError(
                    f"op model was saved with FeatureSpec version {model.feature_spec_version_}; "
                    f"this perfcast has version {FEATURE_SPEC_VERSION}"
                )
            model.feature_names_ = {c: tuple(v) for c, v in meta["feature_names"].items()}
            for c, names in model.feature_names_.items():
                if names != tuple(FEATURE_SPEC.columns[c]):
                    raise BundleError(f"op model's {c} features differ from FeatureSpec version {FEATURE_SPEC_VERSION}")
            model.launch_ms_ = {(v, c): float(ms) for v, c, ms in meta["launch_ms"]}
            model.interval_kind_ = dict(meta["interval_kind"])
            # bundles written before the random-effect interval have no shifts: pooled residuals
            model.gpu_shifts_ = {c: np.asarray(v, dtype=float) for c, v in meta.get("gpu_shifts", {}).items()}
            model.residuals_ = {
                c: (np.asarray(r["values"], dtype=float), np.asarray(r["weights"], dtype=float))
                for c, r in meta["residuals"].items()
            }
            model.train_gpus_ = tuple(meta["train_gpus"])
            model.train_elem_bytes_ = tuple(float(v) for v in meta.get("train_elem_bytes", LEGACY_ELEM_BYTES))
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


def _fit_launch(cls: str, feats: pd.DataFrame, t: np.ndarray) -> dict[tuple[str, str], float]:
    """Launch term per vendor of one class: 5% quantile of the times of sub-1-us-roofline ops."""
    small = feats["roofline_ms"].to_numpy() < LAUNCH_ROOFLINE_MS
    vendors = feats["vendor"].to_numpy()
    if small.sum() >= MIN_LAUNCH_ROWS:
        pooled = float(np.quantile(t[small], LAUNCH_QUANTILE))
    else:
        logger.info(
            "%s: %d training ops with roofline < 1 us; launch term defaults to %.3f ms",
            cls, int(small.sum()), DEFAULT_LAUNCH_MS,
        )  # fmt: skip
        pooled = DEFAULT_LAUNCH_MS
    out = {(POOLED, cls): pooled}
    for vendor in pd.unique(vendors):
        m = small & (vendors == vendor)
        out[(str(vendor), cls)] = float(np.quantile(t[m], LAUNCH_QUANTILE)) if m.sum() >= MIN_LAUNCH_ROWS else pooled
    return out


def _fit_efficiency_ceilings(feats: pd.DataFrame, t: np.ndarray, classes: list[str]) -> dict[str, dict[str, float]]:
    """``{class: {dtype family: min(1, (1 + margin) * best measured roofline / time)}}``."""
    eff = feats["roofline_ms"].to_numpy(dtype=float) / t
    families = dtype_family(feats["elem_bytes"].to_numpy(dtype=float))
    op_class = feats["op_class"].to_numpy()
    out: dict[str, dict[str, float]] = {}
    for cls in classes:
        out[cls] = {}
        for family in sorted(pd.unique(families[op_class == cls])):
            best = float(np.nanmax(eff[(op_class == cls) & (families == family)]))
            out[cls][str(family)] = float(min(1.0, (1.0 + EFFICIENCY_MARGIN) * best))
    return out


def _base_ms(feats: pd.DataFrame, launch: Mapping[tuple[str, str], float], cls: str) -> np.ndarray:
    pooled = launch[(POOLED, cls)]
    vendors = feats["vendor"].to_numpy()
    lmap = {v: launch.get((str(v), cls), pooled) for v in pd.unique(vendors)}
    return np.array([lmap[v] for v in vendors], dtype=float) + feats["roofline_ms"].to_numpy(dtype=float)


def _raw_predict(booster: Any, feats: pd.DataFrame, cls: str) -> np.ndarray:
    """The booster's log ratio for rows of ``cls`` (features selected by name)."""
    names = list(FEATURE_SPEC.columns[cls])
    return booster.inplace_predict(feats[names].astype(np.float32))


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
    return idx, _gpu_equal_weights(gpus[idx], w[idx])


def _split_gpu_shifts(res: np.ndarray, w: np.ndarray, gpus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each GPU's weighted median log residual (its shift), and the residuals minus their GPU's shift."""
    centred = np.asarray(res, dtype=float).copy()
    shifts = []
    for gpu in sorted(pd.unique(gpus)):
        m = gpus == gpu
        shift = weighted_quantile(centred[m], w[m], 0.5)
        centred[m] -= shift
        shifts.append(shift)
    return centred, np.asarray(shifts)


def _random_effect_abs_quantile(shifts: np.ndarray, spread: np.ndarray, weights: np.ndarray, coverage: float) -> float:
    """The ``coverage`` quantile of ``|S + E|``: ``S`` a new GPU's shift, ``E`` the op spread.

    ``S = mean + sd * sqrt(1 + 1/n) * t_{n-1}``, the Student-t predictive over the ``n``
    calibration GPUs' shifts;
    ``E`` is the weighted empirical spread. ``P(|S + E| <= q)`` is the weighted mean over
    ``E`` of the shifted t CDF between ``-q`` and ``q``, inverted by bisection (to 1e-6 in
    log time).
    """
    from scipy.special import stdtr

    n = len(shifts)
    mean, scale = float(np.mean(shifts)), float(np.std(shifts, ddof=1)) * np.sqrt(1 + 1 / n)
    p = np.asarray(weights, dtype=float) / np.sum(weights)
    e = np.asarray(spread, dtype=float)
    if scale <= 0:
        return weighted_quantile(np.abs(mean + e), p, coverage)

    def covered(q: float) -> float:
        return float(p @ (stdtr(n - 1, (q - mean - e) / scale) - stdtr(n - 1, (-q - mean - e) / scale)))

    lo, hi = 0.0, abs(mean) + np.abs(e).max() + 50 * scale
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if covered(mid) < coverage else (lo, mid)
    return (lo + hi) / 2


def _gpu_equal_weights(gpus: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``w`` rescaled so every GPU's rows sum to the same total; mean 1."""
    out = np.asarray(w, dtype=float).copy()
    for gpu in pd.unique(gpus):
        m = gpus == gpu
        out[m] = out[m] / out[m].sum()
    return out / out.mean()


def _gpu_domain(gpu_ids: tuple[str, ...]) -> dict[str, tuple[float, float]]:
    """Range of each :data:`DOMAIN_DESCRIPTORS` figure over the training GPUs (known figures only)."""
    specs = [HardwareSpec.from_name(g) for g in gpu_ids]
    out = {}
    for name in DOMAIN_DESCRIPTORS:
        values = [float(getattr(s, name)) for s in specs if getattr(s, name) is not None]
        if values:
            out[name] = (min(values), max(values))
    return out
