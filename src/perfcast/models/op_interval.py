r"""Interval of the op model: out-of-GPU log residuals, their GPU shifts and the quantiles read from them.

The interval answers "how wrong is the model on a GPU it has not seen". An inner
leave-one-GPU-out loop over the ``n`` training GPUs collects out-of-GPU log residuals
(:func:`fit_residuals`). They split into a shift per GPU (the median residual of its ops,
``s_g``) and the spread of the ops around it (``e``, each GPU with equal total weight).
Since the shifts dominate and come from a handful of GPUs, the interval treats the shift of
a new GPU as a draw of a random effect, a Student-t predictive over the ``n`` observed shifts,

.. math::

    r = S + E, \qquad S \sim \bar s + s_s \sqrt{1 + 1/n}\; t_{n-1}, \qquad E \sim \{e\},

and the interval is ``pred * exp([-q, q])`` with ``q`` the ``c`` quantile of ``|r|``
(:func:`residual_quantiles`, through
:func:`~perfcast.models.intervals.random_effect_abs_quantile`): the absolute-residual
score of split conformal, symmetric in log time around the median. It widens with the
disagreement between GPUs rather than being set by the ops of the GPUs seen, so a GPU
unlike the rest keeps most of its coverage. It is symmetric because the skew of a handful
of calibration GPUs' residuals does not carry to the next GPU (the comparison with the
skewed quantile interval: ``benchmarks/results/docstring_notes.md``).

An op the training GPUs rarely share is predicted from fewer GPUs than the interval's
residuals assume: the inner loop measures an op seen on eight other GPUs, while a held-out
GPU's fused kernel or 16-bit norm was seen on one. Each op key (:func:`op_keys`: the op and
its element size) lists the training GPUs that ran it (:func:`key_gpus`). The inner
residuals of the keys seen on fewer than :data:`RARE_OP_GPUS` *other* training GPUs are kept
apart (:func:`rare_op_residuals`, the absolute residual, each GPU weighing equally), and a
query on a GPU that did not run its key, a key fewer than :data:`RARE_OP_GPUS` training GPUs
ran (:func:`rare_rows`), gets at least their ``c`` quantile (:func:`rare_op_quantile`): the
error of an op learned from that few GPUs.

With fewer than :data:`MIN_CALIBRATION_GPUS` GPUs the residuals are :data:`N_ROW_FOLDS`-fold
out-of-fold residuals over rows (a within-GPU interval), unless the class borrows the GPU
shifts of its :data:`SHIFT_DONORS` class (:func:`borrow_gpu_shifts`). Residuals are natural
logs of ``t / pred``; weights give each GPU an equal total.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, MutableMapping

import numpy as np
import pandas as pd

from perfcast.data.tables import distinct_rows
from perfcast.features.ops import OpClass
from perfcast.models.intervals import (
    central_levels,
    random_effect_abs_quantile,
    straddle_zero,
    weighted_quantile,
    weighted_quantiles,
)

__all__ = [
    "INNER_ROWS_FRACTION",
    "INNER_TREES_FRACTION",
    "MIN_CALIBRATION_GPUS",
    "N_ROW_FOLDS",
    "RARE_OP_GPUS",
    "RESIDUAL_LEVELS",
    "SHIFT_DONORS",
    "borrow_gpu_shifts",
    "fit_residuals",
    "gpu_equal_weights",
    "key_gpus",
    "op_keys",
    "rare_op_quantile",
    "rare_op_residuals",
    "rare_rows",
    "residual_quantiles",
]

logger = logging.getLogger(__name__)

INNER_ROWS_FRACTION = 0.5  # the inner LOGO loop fits on half the rows ...
INNER_TREES_FRACTION = 0.75  # ... and 3/4 of the trees (research: 20k rows / 300 trees)
MIN_CALIBRATION_GPUS = 3
N_ROW_FOLDS = 5

SHIFT_DONORS = {OpClass.ATTENTION.value: OpClass.GEMM.value}
"""A class fitted on fewer than MIN_CALIBRATION_GPUS GPUs borrows the GPU shifts of this class:
fused attention is matmul-bound, and the shipped default learns it from one GPU (H200)."""

RARE_OP_GPUS = 2
"""An op key run by fewer training GPUs than this is rare (module docstring)."""

RESIDUAL_LEVELS = np.linspace(0.0, 1.0, 1001)
"""Levels of the equal-weight points kept of each class's residual distribution (steps of 0.1%)."""

InSample = Callable[[np.ndarray], np.ndarray]
"""``predict(rows)``: the fitted model's prediction of the rows of a boolean mask, ms."""
OutOfFold = Callable[[np.ndarray, np.random.Generator], np.ndarray]
"""``predict(held, rng)``: the prediction of the ``held`` rows by a model fitted on the others, ms."""


def fit_residuals(
    cls: str,
    gpus: np.ndarray,
    t: np.ndarray,
    w: np.ndarray,
    *,
    calibrate: bool,
    seed: int,
    in_sample: InSample,
    out_of_fold: OutOfFold,
) -> tuple[tuple[np.ndarray, np.ndarray], str]:
    """Log residuals ``log(t / pred)`` of one class's rows, their weights and the interval kind.

    Args:
        cls: the op class (for messages); gpus: each row's GPU id; t: measured times, ms;
            w: row weights.
        calibrate: ``False`` gives in-sample residuals (kind ``"in-sample"``).
        seed: seeds the row folds and the inner fits.
        in_sample, out_of_fold: the predictions (:data:`InSample`, :data:`OutOfFold`).

    Returns:
        ``((residuals, weights), kind)``, kind ``"gpu"`` (one fold per GPU, with at least
        :data:`MIN_CALIBRATION_GPUS`), ``"row"`` (row folds) or ``"in-sample"`` (no fold
        could be held out).
    """
    distinct = sorted(pd.unique(gpus))
    if not calibrate:
        return (np.log(t / in_sample(np.ones(len(t), dtype=bool))), gpu_equal_weights(gpus, w)), "in-sample"
    rng = np.random.default_rng(seed)
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
        res[held] = np.log(t[held] / out_of_fold(held, rng))
    if np.isnan(res).any():  # too few rows to hold any out: in-sample
        miss = np.isnan(res)
        res[miss] = np.log(t[miss] / in_sample(miss))
        kind = "in-sample" if miss.all() else kind
    return (res, gpu_equal_weights(gpus, w)), kind


def borrow_gpu_shifts(interval_kind: MutableMapping[str, str], gpu_shifts: MutableMapping[str, np.ndarray]) -> None:
    """Give a class fitted on too few GPUs the GPU shifts of its :data:`SHIFT_DONORS` class, in place.

    Its interval then adds the donor's spread between GPUs to its own within-GPU spread
    (``interval_kind`` ``"borrowed:<donor>"``) instead of covering only the GPUs it saw.
    """
    for cls, donor in SHIFT_DONORS.items():
        if (
            interval_kind.get(cls, "gpu") != "gpu"
            and interval_kind.get(donor) == "gpu"
            and len(gpu_shifts[donor]) >= MIN_CALIBRATION_GPUS
        ):
            gpu_shifts[cls] = gpu_shifts[donor].copy()
            interval_kind[cls] = f"borrowed:{donor}"
            logger.warning(
                "%s: instead of that within-GPU interval, the %s class's shifts between %d GPUs are added to "
                "its spread (a GPU-level interval borrowed from %s)",
                cls, donor, len(gpu_shifts[donor]), donor,
            )  # fmt: skip


def residual_quantiles(
    values: np.ndarray, weights: np.ndarray, shifts: np.ndarray, coverage: float
) -> tuple[float, float]:
    """The log-residual quantiles ``(q_lo <= 0 <= q_hi)`` of a class's ``coverage`` interval.

    With at least :data:`MIN_CALIBRATION_GPUS` GPU ``shifts``, ``(-q, q)`` for ``q`` the
    ``coverage`` quantile of the random-effect ``|S + E|`` (module docstring); otherwise the
    ``(1-c)/2`` and ``(1+c)/2`` quantiles of the weighted residuals ``values``.
    """
    if len(shifts) >= MIN_CALIBRATION_GPUS:
        q = random_effect_abs_quantile(shifts, values, weights, coverage)
        q_lo, q_hi = -q, q
    else:
        q_lo, q_hi = (weighted_quantile(values, weights, level) for level in central_levels(coverage))
    return straddle_zero(q_lo, q_hi)


def gpu_equal_weights(gpus: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``w`` rescaled so every GPU's rows sum to the same total; mean 1."""
    out = np.asarray(w, dtype=float).copy()
    for gpu in pd.unique(gpus):
        m = gpus == gpu
        out[m] = out[m] / out[m].sum()
    return out / out.mean()


def op_keys(feats: pd.DataFrame) -> np.ndarray:
    """The op key of each featurised row: ``"<op code>:<element bytes>"`` (vector rows carry an
    op code; the other classes key on the element size alone)."""
    code = feats["op_code"].to_numpy(dtype=float) if "op_code" in feats else np.full(len(feats), np.nan)
    code = np.where(np.isnan(code), -1.0, code)
    elem = feats["elem_bytes"].to_numpy(dtype=float)
    inverse, first = distinct_rows([code, elem])
    return np.array([f"{int(code[i])}:{elem[i]:g}" for i in first], dtype=object)[inverse]


def key_gpus(keys: np.ndarray, gpus: np.ndarray) -> dict[str, tuple[str, ...]]:
    """``{op key: the distinct GPUs with rows of it, sorted}``."""
    pairs = pd.DataFrame({"key": keys, "gpu": gpus}).drop_duplicates()
    return {str(k): tuple(sorted(map(str, g))) for k, g in pairs.groupby("key")["gpu"]}


def rare_rows(keys: np.ndarray, gpus: np.ndarray, ran: Mapping[str, tuple[str, ...]]) -> np.ndarray:
    """Boolean per query row: its GPU did not run its key, and fewer than :data:`RARE_OP_GPUS`
    training GPUs did (``ran``: :func:`key_gpus` of the training rows)."""
    inverse, first = distinct_rows([keys, gpus])
    runs = [(ran.get(str(keys[i]), ()), str(gpus[i])) for i in first]
    return np.array([len(r) < RARE_OP_GPUS and g not in r for r, g in runs], dtype=bool)[inverse]


def rare_op_residuals(
    residuals: np.ndarray, gpus: np.ndarray, keys: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """Absolute out-of-GPU residuals of the rows whose key fewer than :data:`RARE_OP_GPUS` other
    GPUs ran, as equal-weight points at :data:`RESIDUAL_LEVELS` (each GPU weighing equally);
    ``None`` where no row is rare."""
    ran = key_gpus(keys, gpus)
    others = np.array([len(ran[str(k)]) - 1 for k in keys])
    rare = others < RARE_OP_GPUS
    if not rare.any():
        return None
    grid = weighted_quantiles(np.abs(residuals[rare]), gpu_equal_weights(gpus[rare], weights[rare]), RESIDUAL_LEVELS)
    return grid, np.ones_like(grid)


def rare_op_quantile(rare: tuple[np.ndarray, np.ndarray] | None, coverage: float) -> float:
    """The ``coverage`` quantile of :func:`rare_op_residuals`'s points (0 where there are none)."""
    if rare is None:
        return 0.0
    return weighted_quantile(rare[0], rare[1], coverage)
