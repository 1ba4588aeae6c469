r"""Collective time model: an alpha-beta fit per link kind plus a learned residual.

For an op-table collective row (allreduce | allgather | reducescatter | alltoall |
sendrecv; ``bytes``, ``n_ranks``, ``ranks_per_node``, ``dtype``, ``gpu``)
:func:`~perfcast.features.collective_features.featurize_collectives` gives the catalog
alpha-beta time split into linear pieces: the bandwidth seconds over the scale-up link
:math:`x^{bw}_{intra}` and over the fabric :math:`x^{bw}_{inter}` (at catalog bandwidth),
and the latency steps :math:`s` of the outermost link. The physics part is

.. math::

    t_{phys} = c + \frac{x^{bw}_{intra}}{e_{k(intra)}} + \frac{x^{bw}_{inter}}{e_{k(inter)}}
               + a_{k(lat)} \, s

with one bandwidth efficiency :math:`e_k` and one per-step latency :math:`a_k` per link
group :math:`k` (:data:`PHYSICS_GROUPS`: ``intra:nvlink`` for NVLink-class scale-up links
-- NVLink, Infinity Fabric, ICI, integrated RoCE --, ``intra:pcie``, and ``inter:<fabric
kind>``, e.g. ``inter:infiniband``) and a launch overhead :math:`c` shared by all. The
parameters come from a bounded least-squares fit on relative errors, robustified by
iteratively reweighted Huber weights, each training table (:func:`table_groups`) weighted
equally. A link group with no training rows uses the pooled fit (one efficiency and one
latency for every link).

The learned part is a small XGBoost regression of :math:`\log(t / t_{phys})` on the
collective features (:data:`RESIDUAL_FEATURES`); prediction is
:math:`t_{phys} \exp(f(x))`, inverted in one place (:meth:`CollectiveTimeRegressor._predict_log`).

Domain: the measured tables are single nodes and pairs of nodes (2-16 ranks) timing
all-reduce and send/recv. A query outside what the model was fitted on -- a collective
kind it never saw, more than twice the ranks or nodes of any training row of that kind, a
message size beyond twice that kind's training range, or a link group (scale-up or
fabric kind) with no training rows -- is *out of domain* (:meth:`~CollectiveTimeRegressor.out_of_domain`):
its residual booster would extrapolate on features it never saw vary (a data-parallel
all-reduce over 256 nodes is not a 2-node one with larger numbers). Such rows get the
catalog alpha-beta time (``alpha_beta_ms``, which carries the scaling in ranks and nodes)
and an interval from the quantiles of ``log(measured / alpha_beta)`` over the training
rows (the catalog formula has no fitted parameter, so these residuals are out of sample).

Interval: the exchangeable unit is the measured table, a (gpu, cluster) pair. ``fit``
refits the whole model leaving one GPU out at a time (>= 3 GPUs; otherwise K-fold
out-of-fold rows), collects the held-out log residuals, weights every table equally and
keeps the weighted quantiles; :meth:`~CollectiveTimeRegressor.predict_interval` returns
``pred * exp([q_lo, q_hi])`` (``q_lo <= 0 <= q_hi`` so that ``lo <= pred <= hi``).

Shapes:
    X: (n, op-table columns); y: (n,) ms; predict: (n,) ms; predict_interval: (n, 2) ms.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Self

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from perfcast.errors import BundleError, SpecError
from perfcast.features.collective_features import COLLECTIVE_FEATURES_VERSION, featurize_collectives
from perfcast.models.intervals import (
    central_levels,
    check_coverage,
    interpolated_weighted_quantiles,
    log_interval,
    straddle_zero,
)

__all__ = ["PHYSICS_GROUPS", "RESIDUAL_FEATURES", "CollectiveTimeRegressor", "table_groups"]

logger = logging.getLogger(__name__)

BOOSTER_FILE = "collective.ubj"
POOLED = "pooled"
PHYSICS_GROUPS: tuple[str, ...] = (
    "intra:nvlink",
    "intra:pcie",
    "inter:infiniband",
    "inter:roce",
    "inter:nvlink",
    "inter:dcn",
    "inter:other",
)
_SCALE_UP_KINDS = frozenset({"nvlink", "xgmi", "ici", "roce"})

# Shape-and-topology features only: the catalog bandwidth and latency figures are left out on
# purpose. With a handful of GPUs they identify the GPU, and the booster then memorises one
# machine's topology quirks (DGX-1 V100 hybrid cube mesh, bridged PCIe pairs) instead of
# learning what transfers; the physics part carries the hardware.
RESIDUAL_FEATURES: tuple[str, ...] = (
    "collective_code",
    "log_bytes",
    "log_bytes_per_rank",
    "n_ranks",
    "ranks_per_node",
    "nodes",
    "intra_link_code",
    "inter_link_code",
    "log_alpha_beta_ms",
    "bw_share",
)

# Probability levels of the stored residual quantiles (the interval reads them by interpolation).
_LEVELS = np.linspace(0.0, 1.0, 401)
_MIN_INV_EFF = 0.02  # efficiency <= 50x the catalog bandwidth
_HUBER_K = 0.2  # relative residual beyond which a row is down-weighted
_LOG_BYTES_SLACK = np.log(2.0)  # message sizes within 2x of the training range count as in domain
_SCALE_SLACK = 2.0  # so do groups of up to 2x the most ranks and nodes (train <= 4 ranks -> 8: see collective_eval)


def table_groups(X: pd.DataFrame) -> np.ndarray:
    """Exchangeable unit of each row: ``gpu | cluster | reader`` of the table it came from.

    ``cluster`` (Vidur's cluster name) and the reader prefix of ``source`` (``vtrain``,
    ``vidur``, ``deepbench`` ...) are used when the columns exist; otherwise the GPU alone.
    """
    parts = [X["gpu"].astype(str)]
    for col in ("cluster", "source"):
        if col in X.columns:
            text = X[col].astype("string").fillna("")
            parts.append(text.str.split(":").str[0] if col == "source" else text)
    key = parts[0]
    for part in parts[1:]:
        key = key + "|" + part.astype(str)
    return key.to_numpy(dtype=str)


def _physics_groups(F: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(intra group, inter group, latency group) of each featurised row."""
    intra = np.where(F["intra_link_kind"].isin(_SCALE_UP_KINDS), "intra:nvlink", "intra:pcie")
    inter_kind = F["inter_link_kind"].astype(str).to_numpy()
    inter = np.array([f"inter:{k}" if f"inter:{k}" in PHYSICS_GROUPS else "inter:other" for k in inter_kind])
    lat = np.where(F["nodes"].to_numpy() > 1, inter, intra)
    return intra.astype(str), inter.astype(str), lat.astype(str)


def _design(F: pd.DataFrame, groups: list[str]) -> np.ndarray:
    """Design matrix: [launch, bw_ms per group, latency steps per group] (ms units)."""
    intra, inter, lat = _physics_groups(F)
    bw_in, bw_out, steps = (F[c].to_numpy(dtype=float) for c in ("bw_intra_ms", "bw_inter_ms", "latency_steps"))
    cols = [np.ones(len(F))]
    cols += [np.where(intra == g, bw_in, 0.0) + np.where(inter == g, bw_out, 0.0) for g in groups]
    cols += [np.where(lat == g, steps, 0.0) for g in groups]
    return np.column_stack(cols)


def _robust_nnls(A: np.ndarray, y: np.ndarray, w: np.ndarray, lower: np.ndarray, *, n_iter: int = 8) -> np.ndarray:
    """Bounded least squares on relative errors ``(A @ theta - y) / y``, Huber-reweighted."""
    from scipy.optimize import lsq_linear

    rel = A / y[:, None]
    scale = np.sqrt(np.average(rel**2, axis=0, weights=w)) + 1e-300
    used = scale > 1e-12
    theta = np.zeros(A.shape[1])
    robust = np.ones_like(w)
    for _ in range(n_iter):
        sw = np.sqrt(w * robust)
        M = rel[:, used] / scale[used] * sw[:, None]
        sol = lsq_linear(M, sw, bounds=(lower[used] * scale[used], np.inf), method="bvls")
        new = np.zeros(A.shape[1])
        new[used] = sol.x / scale[used]
        resid = np.abs(rel @ new - 1.0)
        robust = np.where(resid <= _HUBER_K, 1.0, _HUBER_K / np.maximum(resid, 1e-12))
        if np.allclose(new, theta, rtol=1e-6, atol=0.0):
            theta = new
            break
        theta = new
    return theta


def _domain(F: pd.DataFrame) -> dict[str, Any]:
    """Training domain of featurised rows: per collective code its extent, and the link groups with traffic."""
    collectives = {}
    for code, part in F.groupby("collective_code"):
        collectives[str(int(code))] = {
            "max_n_ranks": float(part["n_ranks"].max()),
            "max_nodes": float(part["nodes"].max()),
            "min_log_bytes": float(part["log_bytes"].min()),
            "max_log_bytes": float(part["log_bytes"].max()),
        }
    intra, inter, _ = _physics_groups(F)
    groups = set(intra[F["bw_intra_ms"].to_numpy() > 0]) | set(inter[F["bw_inter_ms"].to_numpy() > 0])
    return {"collectives": collectives, "link_groups": sorted(groups)}


class CollectiveTimeRegressor(BaseEstimator, RegressorMixin):
    """Collective op time (ms): alpha-beta per link kind, times a learned XGBoost residual.

    Args (keyword only, stored as given; checked in :meth:`fit`):
        n_estimators, learning_rate, max_depth, subsample, colsample_bytree,
            min_child_weight: the residual booster (``reg:squarederror`` on the log ratio).
        max_rows_per_group: rows kept per training table (seeded subsample), for speed.
        calibrate: collect held-out residuals for the interval (inner leave-one-GPU-out).
        n_folds: folds of the out-of-fold fallback when there are fewer than 3 GPUs.
        random_state, n_jobs: XGBoost seed and threads.

    Fitted attributes: ``physics_`` {group: (inv_efficiency, step_latency_ms)} including
    ``"pooled"``, ``launch_ms_``, ``booster_``, ``residual_quantiles_`` (log residuals at
    ``_LEVELS``), ``groups_seen_``, ``feature_spec_version_``, ``calibration_`` (how the
    residuals were obtained), ``n_features_in_``, ``domain_`` (per collective code: most
    ranks and nodes, smallest and largest log message size; and the link groups seen)
    and ``alpha_beta_quantiles_`` (``log(measured / alpha_beta)`` at ``_LEVELS``, the
    interval of out-of-domain rows).
    """

    def __init__(
        self,
        *,
        n_estimators: int = 200,
        learning_rate: float = 0.05,
        max_depth: int = 4,
        subsample: float = 0.8,
        colsample_bytree: float = 0.8,
        min_child_weight: float = 5.0,
        max_rows_per_group: int = 3000,
        calibrate: bool = True,
        n_folds: int = 5,
        random_state: int = 0,
        n_jobs: int = 1,
    ) -> None:
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.max_rows_per_group = max_rows_per_group
        self.calibrate = calibrate
        self.n_folds = n_folds
        self.random_state = random_state
        self.n_jobs = n_jobs

    # ------------------------------------------------------------------ fitting

    def fit(self, X: pd.DataFrame, y: Any, *, sample_weight: Any = None) -> Self:
        """Fit the physics, the residual booster and (``calibrate``) the interval.

        Args:
            X: op-table collective rows; ``cluster``/``source`` columns, when present,
                refine the table groups (:func:`table_groups`).
            y: measured times, ms, positive.
            sample_weight: optional per-row weights (multiplied with the per-table weights).

        Raises:
            SpecError: bad rows (see ``featurize_collectives``), non-positive or non-finite
                ``y``, mismatched lengths, or bad hyperparameters.
        """
        self._check_params()
        if not isinstance(X, pd.DataFrame):
            raise SpecError(f"X must be a pandas DataFrame of op-table rows, got {type(X).__name__}")
        y_arr = np.asarray(y, dtype=float).ravel()
        if len(y_arr) != len(X):
            raise SpecError(f"X has {len(X)} rows but y has {len(y_arr)}")
        if len(X) == 0:
            raise SpecError("cannot fit on 0 rows")
        bad = ~(np.isfinite(y_arr) & (y_arr > 0))
        if bad.any():
            raise SpecError(f"y must be positive finite times in ms; {int(bad.sum())} bad values")
        sw = np.ones(len(X)) if sample_weight is None else np.asarray(sample_weight, dtype=float).ravel()
        if len(sw) != len(X) or not (np.isfinite(sw).all() and (sw >= 0).all()):
            raise SpecError("sample_weight must have one finite value >= 0 per row")
        F = featurize_collectives(X)
        keep = F["alpha_beta_ms"].to_numpy() > 0
        if not keep.all():
            logger.warning("dropping %d one-rank rows (no communication) from the fit", int((~keep).sum()))
        groups = table_groups(X.assign(gpu=F["gpu_id"]))
        rng = np.random.default_rng(self.random_state)
        idx = self._subsample(groups, keep, rng)
        F, y_arr, sw, groups = F.iloc[idx], y_arr[idx], sw[idx], groups[idx]
        gpus = F["gpu_id"].to_numpy(dtype=str)

        self._fit_core(F, y_arr, sw, groups)
        self.domain_ = _domain(F)
        self.alpha_beta_quantiles_ = interpolated_weighted_quantiles(
            np.log(y_arr) - np.log(F["alpha_beta_ms"].to_numpy(dtype=float)), self._table_weights(groups, sw), _LEVELS
        )
        if self.calibrate:
            resid, weight, how = self._held_out_residuals(F, y_arr, sw, groups, gpus, rng)
            self.calibration_ = how
            self.residual_quantiles_ = interpolated_weighted_quantiles(resid, weight, _LEVELS)
        else:
            self.calibration_ = "none (in-sample residuals)"
            resid = np.log(y_arr) - self._predict_log(F)
            self.residual_quantiles_ = interpolated_weighted_quantiles(resid, self._table_weights(groups, sw), _LEVELS)
        self.groups_seen_ = sorted(set(groups))
        self.feature_spec_version_ = COLLECTIVE_FEATURES_VERSION
        self.n_features_in_ = len(RESIDUAL_FEATURES)
        return self

    def _check_params(self) -> None:
        if not (isinstance(self.n_estimators, int) and self.n_estimators >= 1):
            raise SpecError(f"n_estimators={self.n_estimators!r} must be an integer >= 1")
        if not 0 < self.learning_rate <= 1:
            raise SpecError(f"learning_rate={self.learning_rate!r} must be in (0, 1]")
        if not (isinstance(self.max_rows_per_group, int) and self.max_rows_per_group >= 10):
            raise SpecError(f"max_rows_per_group={self.max_rows_per_group!r} must be an integer >= 10")
        if not (isinstance(self.n_folds, int) and self.n_folds >= 2):
            raise SpecError(f"n_folds={self.n_folds!r} must be an integer >= 2")

    def _subsample(self, groups: np.ndarray, keep: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = []
        for g in np.unique(groups[keep]):
            rows = np.flatnonzero(keep & (groups == g))
            if len(rows) > self.max_rows_per_group:
                rows = np.sort(rng.choice(rows, self.max_rows_per_group, replace=False))
            out.append(rows)
        return np.sort(np.concatenate(out))

    @staticmethod
    def _table_weights(groups: np.ndarray, sw: np.ndarray) -> np.ndarray:
        """Per-row weights giving every table the same total weight (times sample_weight)."""
        _, inv, counts = np.unique(groups, return_inverse=True, return_counts=True)
        w = sw / counts[inv]
        return w * (len(w) / max(w.sum(), 1e-300))

    def _fit_core(self, F: pd.DataFrame, y: np.ndarray, sw: np.ndarray, groups: np.ndarray) -> None:
        """Physics per link group, then the residual booster (no interval)."""
        import xgboost as xgb

        w = self._table_weights(groups, sw)
        # pooled: one efficiency and one latency for every link (fallback for unseen groups)
        pooled = np.column_stack([np.ones(len(F)), F["bw_intra_ms"] + F["bw_inter_ms"], F["latency_steps"]]).astype(
            float
        )
        theta_p = _robust_nnls(pooled, y, w, np.array([0.0, _MIN_INV_EFF, 0.0]))
        intra, inter, lat = _physics_groups(F)
        present = [
            g
            for g in PHYSICS_GROUPS
            if ((intra == g) & (F["bw_intra_ms"].to_numpy() > 0)).any()
            or ((inter == g) & (F["bw_inter_ms"].to_numpy() > 0)).any()
        ]
        A = _design(F, present)
        lower = np.r_[0.0, np.full(len(present), _MIN_INV_EFF), np.zeros(len(present))]
        theta = _robust_nnls(A, y, w, lower)
        self.launch_ms_ = float(theta[0])
        self.physics_ = {POOLED: (float(theta_p[1]), float(theta_p[2]))}
        for i, g in enumerate(present):
            has_lat = (lat == g).any()
            self.physics_[g] = (float(theta[1 + i]), float(theta[1 + len(present) + i] if has_lat else theta_p[2]))
        target = np.log(y) - np.log(self._physics_ms(F))
        params = {
            "objective": "reg:squarederror",
            "eta": self.learning_rate,
            "max_depth": self.max_depth,
            "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree,
            "min_child_weight": self.min_child_weight,
            "seed": self.random_state,
            "nthread": self.n_jobs,
            "tree_method": "hist",
        }
        dtrain = xgb.DMatrix(F[list(RESIDUAL_FEATURES)].to_numpy(dtype=float), label=target, weight=w)
        self.booster_ = xgb.train(params, dtrain, num_boost_round=self.n_estimators)

    def _held_out_residuals(
        self,
        F: pd.DataFrame,
        y: np.ndarray,
        sw: np.ndarray,
        groups: np.ndarray,
        gpus: np.ndarray,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray, str]:
        """Log residuals of rows predicted by a model that did not see their GPU (or fold)."""
        unique_gpus = np.unique(gpus)
        if len(unique_gpus) >= 3:
            folds = [gpus == g for g in unique_gpus]
            how = f"leave-one-GPU-out over {len(unique_gpus)} GPUs"
        else:
            assign = rng.permutation(len(F)) % self.n_folds
            folds = [assign == k for k in range(self.n_folds)]
            how = f"{self.n_folds}-fold out-of-fold rows ({len(unique_gpus)} GPU(s))"
        resid = np.empty(len(F))
        for test in folds:
            inner = CollectiveTimeRegressor(**{**self.get_params(), "calibrate": False})
            inner._fit_core(F[~test], y[~test], sw[~test], groups[~test])
            resid[test] = np.log(y[test]) - inner._predict_log(F[test])
        return resid, self._table_weights(groups, sw), how

    # ------------------------------------------------------------------ prediction

    def _physics_ms(self, F: pd.DataFrame) -> np.ndarray:
        """Fitted alpha-beta time of featurised rows, ms (pooled figures for unseen link groups)."""
        intra, inter, lat = _physics_groups(F)

        def pick(names: np.ndarray, j: int) -> np.ndarray:
            uniq, inv = np.unique(names, return_inverse=True)
            values = np.array([self.physics_.get(g, self.physics_[POOLED])[j] for g in uniq], dtype=float)
            return values[inv] if len(names) else np.zeros(0)

        t = (
            self.launch_ms_
            + F["bw_intra_ms"].to_numpy() * pick(intra, 0)
            + F["bw_inter_ms"].to_numpy() * pick(inter, 0)
            + F["latency_steps"].to_numpy() * pick(lat, 1)
        )
        return np.where(F["alpha_beta_ms"].to_numpy() > 0, np.maximum(t, 1e-9), 0.0)

    def _predict_log(self, F: pd.DataFrame) -> np.ndarray:
        """log(ms) of featurised rows: log physics + booster residual (-inf for one-rank groups)."""
        phys = self._physics_ms(F)
        if len(F) == 0:
            return np.zeros(0)
        resid = self.booster_.inplace_predict(F[list(RESIDUAL_FEATURES)].to_numpy(dtype=float))
        with np.errstate(divide="ignore"):
            return np.log(phys) + np.asarray(resid, dtype=float)

    def _out_of_domain(self, F: pd.DataFrame) -> np.ndarray:
        """Featurised rows outside the training domain (see the module docstring)."""
        domain = self.domain_
        out = np.ones(len(F), dtype=bool)
        code = F["collective_code"].to_numpy(dtype=float)
        for key, box in domain["collectives"].items():
            rows = code == float(key)
            out[rows] = (
                (F["n_ranks"].to_numpy()[rows] > _SCALE_SLACK * box["max_n_ranks"])
                | (F["nodes"].to_numpy()[rows] > _SCALE_SLACK * box["max_nodes"])
                | (F["log_bytes"].to_numpy()[rows] < box["min_log_bytes"] - _LOG_BYTES_SLACK)
                | (F["log_bytes"].to_numpy()[rows] > box["max_log_bytes"] + _LOG_BYTES_SLACK)
            )
        intra, inter, _ = _physics_groups(F)
        seen = set(domain["link_groups"])
        uses_intra = F["bw_intra_ms"].to_numpy() > 0
        uses_inter = F["bw_inter_ms"].to_numpy() > 0
        out |= uses_intra & ~np.isin(intra, list(seen))
        out |= uses_inter & ~np.isin(inter, list(seen))
        return out

    def out_of_domain(self, X: pd.DataFrame) -> np.ndarray:
        """Rows of ``X`` the model times with the catalog alpha-beta formula (module docstring)."""
        check_is_fitted(self, "booster_")
        return self._out_of_domain(featurize_collectives(X))

    def predict_physics(self, X: pd.DataFrame) -> np.ndarray:
        """The fitted alpha-beta part alone (no learned residual), ms."""
        check_is_fitted(self, "booster_")
        return self._physics_ms(featurize_collectives(X))

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Median collective time of each row, ms (0 for one-rank groups; alpha-beta out of domain)."""
        check_is_fitted(self, "booster_")
        return self._predict_routed(featurize_collectives(X))[0]

    def _predict_routed(self, F: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(median ms, out-of-domain mask) of featurised rows."""
        ood = self._out_of_domain(F)
        learned = np.exp(self._predict_log(F))
        return np.where(ood, F["alpha_beta_ms"].to_numpy(dtype=float), learned), ood

    def predict_interval(self, X: pd.DataFrame, *, coverage: float = 0.9) -> np.ndarray:
        """``(n, 2)`` array of [lo, hi] ms with ``lo <= predict(X) <= hi``.

        Raises:
            SpecError: ``coverage`` outside (0, 1).
        """
        return self.predict_with_interval(X, coverage=coverage)[1]

    def predict_with_interval(self, X: pd.DataFrame, *, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`predict` and :meth:`predict_interval` together: ``(pred, (n, 2))``, ms."""
        check_is_fitted(self, "booster_")
        check_coverage(coverage)
        pred, ood = self._predict_routed(featurize_collectives(X))
        levels = central_levels(coverage)
        in_lo, in_hi = straddle_zero(*np.interp(levels, _LEVELS, self.residual_quantiles_))
        out_lo, out_hi = straddle_zero(*np.interp(levels, _LEVELS, self.alpha_beta_quantiles_))
        return pred, log_interval(pred, np.where(ood, out_lo, in_lo), np.where(ood, out_hi, in_hi))

    @property
    def efficiency_(self) -> dict[str, float]:
        """Fitted bandwidth efficiency (achieved / catalog bandwidth) per link group."""
        check_is_fitted(self, "booster_")
        return {g: 1.0 / v[0] for g, v in self.physics_.items()}

    @property
    def step_latency_us_(self) -> dict[str, float]:
        """Fitted per-step latency per link group, microseconds."""
        check_is_fitted(self, "booster_")
        return {g: v[1] * 1e3 for g, v in self.physics_.items()}

    # ------------------------------------------------------------------ persistence

    def _save_to(self, directory: str | Path) -> dict[str, Any]:
        """Write ``collective.ubj`` into ``directory``; return the JSON-able rest of the model."""
        check_is_fitted(self, "booster_")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.booster_.save_model(str(directory / BOOSTER_FILE))
        return {
            "params": self.get_params(),
            "feature_spec_version": self.feature_spec_version_,
            "residual_features": list(RESIDUAL_FEATURES),
            "launch_ms": self.launch_ms_,
            "physics": {g: list(v) for g, v in self.physics_.items()},
            "residual_levels": _LEVELS.tolist(),
            "residual_quantiles": [float(v) for v in self.residual_quantiles_],
            "groups_seen": list(self.groups_seen_),
            "domain": self.domain_,
            "alpha_beta_quantiles": [float(v) for v in self.alpha_beta_quantiles_],
            "calibration": self.calibration_,
            "booster_file": BOOSTER_FILE,
        }

    @classmethod
    def _load_from(cls, directory: str | Path, meta: dict[str, Any]) -> CollectiveTimeRegressor:
        """Rebuild a fitted model from ``_save_to``'s directory and returned metadata.

        Raises:
            BundleError: missing file or keys, or a feature version/column mismatch.
        """
        directory = Path(directory)
        path = directory / meta.get("booster_file", BOOSTER_FILE)
        if not path.is_file():
            raise BundleError(f"collective model file {path} is missing")
        try:
            if meta["feature_spec_version"] != COLLECTIVE_FEATURES_VERSION:
                raise BundleError(
                    f"collective feature version {meta['feature_spec_version']} does not match "
                    f"this perfcast's {COLLECTIVE_FEATURES_VERSION}"
                )
            if list(meta["residual_features"]) != list(RESIDUAL_FEATURES):
                raise BundleError("collective model residual feature columns differ from this perfcast's")
            if not np.allclose(meta["residual_levels"], _LEVELS):
                raise BundleError("collective model residual quantile levels differ from this perfcast's")
            model = cls(**meta["params"])
            model.launch_ms_ = float(meta["launch_ms"])
            model.physics_ = {g: (float(v[0]), float(v[1])) for g, v in meta["physics"].items()}
            model.residual_quantiles_ = np.asarray(meta["residual_quantiles"], dtype=float)
            model.groups_seen_ = list(meta["groups_seen"])
            model.domain_ = dict(meta["domain"])
            model.alpha_beta_quantiles_ = np.asarray(meta["alpha_beta_quantiles"], dtype=float)
            model.calibration_ = str(meta["calibration"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"collective model metadata is incomplete or invalid: {exc!r}") from None
        import xgboost as xgb

        booster = xgb.Booster()
        booster.load_model(str(path))
        booster.set_param({"nthread": model.n_jobs})
        model.booster_ = booster
        model.feature_spec_version_ = COLLECTIVE_FEATURES_VERSION
        model.n_features_in_ = len(RESIDUAL_FEATURES)
        return model
