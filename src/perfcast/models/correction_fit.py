"""The per-class op-time correction of one GPU: shift, trend + GP residual and residual trees.

How :func:`~perfcast.models.calibration.fit_correction` fits each op class's log correction
from measured log residuals ``r = log(measured / predicted)`` (:func:`fit_class`), and how
a fitted one is evaluated on new rows (:func:`class_log_factor`). The model (shrunk shift,
trend slopes, Gaussian-process residual, boosted trees) and its maths are described in
:mod:`perfcast.models.calibration`; its fitted parts have a JSON form stored in a
:class:`~perfcast.models.calibration.GpuCorrection`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from perfcast.features.ops import op_flops, op_memory_bytes

SHRINK_OPS = 2.0
"""Shrinkage of the shift: ``k`` ops give ``median * k / (k + SHRINK_OPS)``."""
RESIDUAL_DIMS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "gemm": ("batch", "m", "n", "k"),
        "vector": ("rows", "cols"),
        "attention": ("batch", "heads", "seq_q", "seq_kv", "head_dim"),
        "collective": ("bytes", "n_ranks"),
    }
)
"""Op-table columns whose natural logs place an op in the residual model's space (a missing
column counts as 1: ``batch`` of a plain matmul)."""
LENGTH_SCALE = 2.5
"""Kernel length in natural-log units of the dims: ops within a factor ~10 in every dim share
most of their residual."""
PRIOR_VAR = 0.1
"""Prior variance of the shape-dependent log residual (a ~30% spread around the shift)."""
NOISE_VAR = 0.05
"""Variance of a single measured op's log residual around the smooth residual: timing noise
and shape effects finer than the kernel. LENGTH_SCALE, PRIOR_VAR, NOISE_VAR, the GP inputs and
the trend terms are one global choice from a grid (3 lengths x 3 variance pairs x 4 input sets x 3
trend sets) scored on the leave-one-GPU-out few-shot curve of NeuSight fp32 (median over GPUs,
k = 20, spread and random picks), never per GPU."""
SLOPE_TERMS = ("log_flops", "log_intensity")
"""Trend inputs: natural logs of the op's FLOPs and of FLOPs per byte (both floored at 1)."""
SLOPE_PRIOR_VAR = 0.01
"""Prior variance of each trend slope (log residual per natural-log unit)."""
MIN_OPS_FOR_SLOPES = 10
"""Fewer measured ops of a class fit no trend: the slopes over-fit a handful of ops."""
GP_INPUTS = ("dims", "log_intensity")
"""What places an op in the GP's space: its log dims, then its log intensity."""
MIN_OPS_FOR_TREES = 100
"""Measured ops of a class from which boosted trees model what the GP leaves (fewer ops over-fit)."""
TREE_PARAMS: Mapping[str, Any] = MappingProxyType(
    {"max_depth": 4, "eta": 0.1, "min_child_weight": 3, "subsample": 0.8, "seed": 0, "nthread": 2, "verbosity": 0}
)
MAX_TREES = 300
"""Trees of the residual booster: one per measured op up to this many."""
SPREAD_FOLDS = 5
GP_CHUNK_ROWS = 8192
"""Rows whose GP mean is computed at once (8192 x 700 measured ops: 46 MB of kernel)."""


def log_dims(ops: pd.DataFrame, cls: str) -> np.ndarray:
    """(n, d) natural logs of the class's :data:`RESIDUAL_DIMS` (NaN where a dim is missing or <= 0)."""
    cols = []
    for name in RESIDUAL_DIMS.get(cls, ()):
        if name in ops:
            v = pd.to_numeric(ops[name], errors="coerce").to_numpy(dtype=float)
            v = np.where(np.isnan(v) & (name == "batch"), 1.0, v)
        else:
            v = np.full(len(ops), 1.0 if name == "batch" else np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            cols.append(np.where(v > 0, np.log(np.where(v > 0, v, 1.0)), np.nan))
    return np.column_stack(cols) if cols else np.empty((len(ops), 0))


def _op_logs(ops: pd.DataFrame) -> dict[str, np.ndarray]:
    """Natural logs of each row's FLOPs and of its FLOPs per byte (both counts floored at 1)."""
    log_flops = np.log(np.maximum(op_flops(ops), 1.0))
    return {"log_flops": log_flops, "log_intensity": log_flops - np.log(np.maximum(op_memory_bytes(ops), 1.0))}


def gp_inputs(ops: pd.DataFrame, cls: str, inputs: tuple[str, ...] = GP_INPUTS) -> np.ndarray:
    """(n, d) coordinates of the rows in the GP's space: ``"dims"`` (:func:`log_dims`) and/or log terms."""
    logs = _op_logs(ops) if set(inputs) - {"dims"} else {}
    cols = [log_dims(ops, cls) if name == "dims" else logs[name][:, None] for name in inputs]
    return np.column_stack(cols) if cols else np.empty((len(ops), 0))


def _trend_inputs(ops: pd.DataFrame, terms: tuple[str, ...]) -> np.ndarray:
    logs = _op_logs(ops)
    return np.column_stack([logs[t] for t in terms]) if terms else np.empty((len(ops), 0))


def _kernel(xa: np.ndarray, ka: np.ndarray, xb: np.ndarray, kb: np.ndarray, length_scale: float) -> np.ndarray:
    """Squared-exponential kernel over log dims, zero between ops of different kinds: (len(xa), len(xb)).

    Squared distances as ``|a|^2 + |b|^2 - 2 a.b`` (one matrix product, no (na, nb, d) temporary).
    """
    d2 = (xa**2).sum(1)[:, None] + (xb**2).sum(1)[None, :] - 2.0 * xa @ xb.T
    return np.exp(-np.maximum(d2, 0.0) / (2 * length_scale**2)) * (ka[:, None] == kb[None, :])


def _gp_mean(gp: Mapping[str, Any], ops: pd.DataFrame, cls: str, kinds: np.ndarray) -> np.ndarray:
    """The residual model's log correction over the shift: trend plus GP (0 where an input is NaN).

    ``gp`` is the JSON form of :func:`fit_gp`; one written by schema version 2 has no
    ``inputs`` (log dims only) and no trend.
    """
    x = gp_inputs(ops, cls, tuple(gp.get("inputs", ("dims",))))
    points = np.asarray(gp["x"], dtype=float).reshape(-1, x.shape[1])
    alpha = np.asarray(gp["alpha"], dtype=float)
    ok = np.isfinite(x).all(axis=1)
    out = np.zeros(len(x))
    if ok.any() and len(alpha):
        rows, point_kinds = np.flatnonzero(ok), np.asarray(gp["kinds"], dtype=str)
        for start in range(0, len(rows), GP_CHUNK_ROWS):  # bounded memory: chunk x points kernel
            part = rows[start : start + GP_CHUNK_ROWS]
            k = _kernel(x[part], kinds[part], points, point_kinds, float(gp["length_scale"]))
            out[part] = float(gp["prior_var"]) * k @ alpha
    terms = tuple(gp.get("trend_terms", ()))
    if terms:
        u = np.clip(_trend_inputs(ops, terms), gp["trend_lo"], gp["trend_hi"])  # held flat outside
        u = u - np.asarray(gp["trend_centre"], dtype=float)
        out[ok] += u[ok] @ np.asarray(gp["trend_slopes"], dtype=float)
    return out


def fit_gp(x: np.ndarray, kinds: np.ndarray, r: np.ndarray, u: np.ndarray | None) -> tuple[dict[str, Any], np.ndarray]:
    """Trend and GP of the log residuals ``r`` (shift removed) at ``x``.

    ``u`` (n, t) holds the trend inputs (:data:`SLOPE_TERMS`), ``None`` for no trend. Returns
    the JSON form and the leave-one-out residuals of the GP part (the slopes held fixed).
    """
    a = PRIOR_VAR * _kernel(x, kinds, x, kinds, LENGTH_SCALE) + NOISE_VAR * np.eye(len(r))
    inv = np.linalg.inv(a)
    gp: dict[str, Any] = {}
    if u is not None:
        centre = u.mean(axis=0)
        uc = u - centre
        slopes = np.linalg.solve(uc.T @ inv @ uc + np.eye(u.shape[1]) / SLOPE_PRIOR_VAR, uc.T @ inv @ r)
        r = r - uc @ slopes
        gp = {
            "trend_terms": list(SLOPE_TERMS),
            "trend_centre": centre.tolist(),
            "trend_slopes": slopes.tolist(),
            "trend_lo": u.min(axis=0).tolist(),
            "trend_hi": u.max(axis=0).tolist(),
        }
    alpha = inv @ r
    gp |= {
        "inputs": list(GP_INPUTS),
        "kinds": kinds.tolist(),
        "x": x.tolist(),
        "alpha": alpha.tolist(),
        "length_scale": LENGTH_SCALE,
        "prior_var": PRIOR_VAR,
    }
    return gp, alpha / np.diag(inv)


def shrunk_shift(log_residuals: np.ndarray) -> float:
    """The correction of one class from ``k`` log residuals: their median, shrunk by ``k/(k+SHRINK_OPS)``."""
    k = len(log_residuals)
    return float(np.median(log_residuals) * k / (k + SHRINK_OPS)) if k else 0.0


def tree_inputs(ops: pd.DataFrame, cls: str, kinds: np.ndarray, kind_names: list[str]) -> np.ndarray:
    """(n, d) inputs of the residual trees: the GP's inputs, log FLOPs and the kind's index in ``kind_names``."""
    code = pd.Series(kinds).map({k: i for i, k in enumerate(kind_names)}).to_numpy(dtype=float)
    return np.column_stack([gp_inputs(ops, cls), _op_logs(ops)["log_flops"], code]).astype(np.float32)


@lru_cache(maxsize=64)
def load_booster(text: str) -> Any:
    """An XGBoost booster from its JSON text (cached: corrections are applied on every prediction)."""
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(bytearray(text.encode()))
    return booster


def fit_trees(ops: pd.DataFrame, cls: str, kinds: np.ndarray, r: np.ndarray) -> dict[str, Any]:
    """The residual booster of ``r`` (log residuals left by shift, trend and GP) in JSON form."""
    import xgboost as xgb

    names = sorted(set(kinds.tolist()))
    booster = xgb.train(dict(TREE_PARAMS), xgb.DMatrix(tree_inputs(ops, cls, kinds, names), r), min(MAX_TREES, len(r)))
    return {"kinds": names, "booster": bytes(booster.save_raw("json")).decode()}


def class_log_factor(
    shift: float,
    gp: Mapping[str, Any] | None,
    trees: Mapping[str, Any] | None,
    ops: pd.DataFrame,
    cls: str,
    kinds: np.ndarray,
) -> np.ndarray:
    """Log correction of rows of one class: shift, plus trend and GP, plus the residual trees."""
    import xgboost as xgb

    out = np.full(len(ops), float(shift))
    if gp:
        out += _gp_mean(gp, ops, cls, kinds)
    if trees:
        x = tree_inputs(ops, cls, kinds, list(trees["kinds"]))
        out += load_booster(trees["booster"]).predict(xgb.DMatrix(x))
    return out


def fit_class(
    ops: pd.DataFrame, cls: str, kinds: np.ndarray, r: np.ndarray
) -> tuple[float, dict[str, Any], dict[str, Any], np.ndarray]:
    """Shift, trend + GP, residual trees (empty below :data:`MIN_OPS_FOR_TREES`) of one class.

    Also returns the leave-one-out residuals of shift + GP (the trees' own are cross-fitted
    by the caller).
    """
    shift = shrunk_shift(r)
    loo = r - shift
    gp: dict[str, Any] = {}
    x = gp_inputs(ops, cls)
    has_dims = np.isfinite(x).all(axis=1) if x.shape[1] else np.zeros(len(r), dtype=bool)
    if has_dims.any():
        u = _trend_inputs(ops[has_dims], SLOPE_TERMS) if has_dims.sum() >= MIN_OPS_FOR_SLOPES else None
        gp, loo_dims = fit_gp(x[has_dims], kinds[has_dims], r[has_dims] - shift, u)
        loo[has_dims] = loo_dims
    trees: dict[str, Any] = {}
    if len(r) >= MIN_OPS_FOR_TREES:
        left = r - class_log_factor(shift, gp, None, ops, cls, kinds)
        trees = fit_trees(ops, cls, kinds, left)
    return shift, gp, trees, loo


def cross_fitted_residuals(ops: pd.DataFrame, cls: str, kinds: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Residuals of the whole correction on each op, fitted without that op's fold (:data:`SPREAD_FOLDS`)."""
    fold = np.random.default_rng(0).permutation(len(r)) % SPREAD_FOLDS
    out = np.empty(len(r))
    for f in range(SPREAD_FOLDS):
        held = fold == f
        shift, gp, trees, _ = fit_class(ops[~held], cls, kinds[~held], r[~held])
        out[held] = r[held] - class_log_factor(shift, gp, trees, ops[held], cls, kinds[held])
    return out
