r"""Interval maths shared by perfcast's estimators: from held-out log residuals to bounds.

A learned model predicts a median time :math:`\hat t` (ms) and collects held-out log
residuals :math:`r = \log(t_\text{measured} / \hat t)` (its conformal scores). Its central
``coverage`` interval is

.. math::

    [\hat t \, e^{q_{lo}},\; \hat t \, e^{q_{hi}}], \qquad q_{lo} \le 0 \le q_{hi},

with :math:`q_{lo}, q_{hi}` read from the residuals at the two tails of ``(1 - coverage) / 2``
(:func:`central_levels`) and clipped to straddle 0 (:func:`straddle_zero`) so that
``lo <= median <= hi``; :func:`log_interval` builds the bounds. The readings differ by model:

* :func:`conformal_bounds`: split-conformal ranks of ``n`` equally weighted residuals
  (per-GPU few-shot corrections);
* :func:`weighted_conformal_bounds`: the same with weights, at the effective sample size
  of the weights (the step model);
* :func:`conformal_quantile`: the finite-sample quantile of one-sided scores such as
  ``|r| / scale`` (the GNN's normalised interval ``mean ± q * scale``);
* :func:`weighted_quantile` / :func:`weighted_quantiles` (lower, a step function) and
  :func:`interpolated_weighted_quantiles` (midpoint CDF, linear between points): weighted
  quantiles of residuals stored on a grid (the op and collective models);
* :func:`random_effect_abs_quantile`: the quantile of ``|S + E|`` for a group-level random
  shift ``S`` plus the spread ``E`` within groups (:func:`split_group_shifts` separates
  them), for intervals meant to cover a group, such as a GPU, not seen in training.

All quantities are natural logs of time ratios (dimensionless) unless a name says ``_ms``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from perfcast.errors import SpecError

__all__ = [
    "central_levels",
    "check_coverage",
    "conformal_bounds",
    "conformal_quantile",
    "interpolated_weighted_quantiles",
    "log_interval",
    "random_effect_abs_quantile",
    "split_group_shifts",
    "straddle_zero",
    "weighted_conformal_bounds",
    "weighted_quantile",
    "weighted_quantiles",
]


def check_coverage(coverage: float) -> None:
    """Refuse a ``coverage`` outside the open interval (0, 1).

    Raises:
        SpecError: ``coverage`` is not strictly between 0 and 1 (NaN included).
    """
    if not 0 < coverage < 1:
        raise SpecError(f"coverage={coverage!r} must be in (0, 1)")


def central_levels(coverage: float) -> tuple[float, float]:
    """Probability levels ``((1 - c) / 2, (1 + c) / 2)`` of a central ``coverage`` interval."""
    return (1 - coverage) / 2, (1 + coverage) / 2


def straddle_zero(q_lo: float, q_hi: float) -> tuple[float, float]:
    """Log bounds widened to contain 0, ``(min(q_lo, 0), max(q_hi, 0))``, so ``lo <= median <= hi``."""
    return min(q_lo, 0.0), max(q_hi, 0.0)


def log_interval(pred_ms: np.ndarray, q_lo: Any, q_hi: Any) -> np.ndarray:
    """``(n, 2)`` bounds ``pred_ms * exp([q_lo, q_hi])``, ms; ``q_lo``, ``q_hi`` scalars or ``(n,)``."""
    return np.column_stack([pred_ms * np.exp(q_lo), pred_ms * np.exp(q_hi)])


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, levels: Any) -> np.ndarray:
    """Lower weighted quantiles: per level ``q``, the smallest value whose cumulative weight share reaches ``q``.

    Args:
        values, weights: ``(n,)``, ``n >= 1``, weights ``>= 0`` with a positive sum.
        levels: probability levels in [0, 1], any shape.

    Returns:
        Values of ``values`` (no interpolation), shaped like ``levels``.
    """
    order = np.argsort(values, kind="stable")
    cw = np.cumsum(weights[order])
    cw = cw / cw[-1]
    idx = np.minimum(np.searchsorted(cw, levels, side="left"), len(values) - 1)
    return values[order][idx]


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The :func:`weighted_quantiles` of one level ``q``."""
    return float(weighted_quantiles(values, weights, [q])[0])


def interpolated_weighted_quantiles(values: np.ndarray, weights: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Weighted quantiles interpolated linearly between points placed at their midpoint CDF.

    Value ``i`` (sorted) sits at probability ``(W_i - w_i / 2) / W``, ``W_i`` the cumulative
    weight; a level below the first or above the last point takes the extreme value.
    """
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cdf = (np.cumsum(w) - 0.5 * w) / w.sum()
    return np.interp(levels, cdf, v)


def conformal_bounds(residuals: np.ndarray, coverage: float) -> tuple[float, float]:
    """Split-conformal ``(lo, hi)`` of ``n`` held-out log residuals for a central ``coverage`` interval.

    Each tail gets ``(1 - coverage) / 2``: ``hi`` is the ``ceil((n + 1)(1 + c) / 2)``-th smallest
    residual and ``lo`` the ``floor((n + 1)(1 - c) / 2)``-th (the extremes when ``n`` is too
    small for the level), the finite-sample rank that keeps the coverage of a new draw from
    the same distribution at ``coverage`` or above; plain quantiles of 20 residuals under-cover.
    """
    r = np.sort(np.asarray(residuals, dtype=float))
    n = len(r)
    k_hi = min(int(np.ceil((n + 1) * (1 + coverage) / 2)), n)
    k_lo = max(int(np.floor((n + 1) * (1 - coverage) / 2)), 1)
    return float(r[k_lo - 1]), float(r[k_hi - 1])


def weighted_conformal_bounds(r: np.ndarray, w: np.ndarray, coverage: float) -> tuple[float, float]:
    """Weighted split-conformal ``(lo, hi)`` of sorted held-out log residuals, unclipped.

    Args:
        r: ``(n,)`` residuals sorted ascending.
        w: ``(n,)`` their weights, summing to 1.
        coverage: central coverage in (0, 1).

    With the effective sample size ``n_eff = 1 / sum(w^2)`` and tails ``a = (1 - c) / 2``, the
    levels ``max(0, (a (n_eff + 1) - 1) / n_eff)`` and ``min(1, (1 - a)(n_eff + 1) / n_eff)`` are
    read as lower weighted quantiles of ``r``; with equal weights this is the split-conformal
    finite-sample correction, and the bounds widen monotonically with ``coverage``.
    """
    n_eff = 1.0 / float(np.sum(w**2))
    tail = (1.0 - coverage) / 2.0
    lo_level = max(0.0, (tail * (n_eff + 1.0) - 1.0) / n_eff)
    hi_level = min(1.0, (1.0 - tail) * (n_eff + 1.0) / n_eff)
    cdf = np.cumsum(w)
    pick = np.searchsorted(cdf, [lo_level, hi_level], side="left").clip(0, len(r) - 1)
    lo, hi = r[pick]
    return float(lo), float(hi)


def conformal_quantile(scores: np.ndarray, coverage: float) -> float:
    """Split-conformal quantile of ``n`` one-sided scores (e.g. ``|r| / scale``) at ``coverage``.

    The finite-sample level ``ceil((n + 1) * coverage) / n``, capped at 1 (the largest score),
    read with :func:`numpy.quantile`'s ``method="higher"`` (never below the level).
    """
    level = min(1.0, math.ceil((len(scores) + 1) * coverage) / len(scores))
    return float(np.quantile(scores, level, method="higher"))


def split_group_shifts(res: np.ndarray, w: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each group's shift (its weighted median residual) and the residuals minus their group's shift.

    Returns:
        ``(centred, shifts)``: ``(n,)`` residuals and one shift per distinct group, in sorted group order.
    """
    centred = np.asarray(res, dtype=float).copy()
    shifts = []
    for group in sorted(pd.unique(groups)):
        m = groups == group
        shift = weighted_quantile(centred[m], w[m], 0.5)
        centred[m] -= shift
        shifts.append(shift)
    return centred, np.asarray(shifts)


def random_effect_abs_quantile(shifts: np.ndarray, spread: np.ndarray, weights: np.ndarray, coverage: float) -> float:
    """The ``coverage`` quantile of ``|S + E|``: ``S`` a new group's shift, ``E`` the spread within groups.

    .. math::

        S = \\bar s + s_s \\sqrt{1 + 1/n}\\; t_{n-1}, \\qquad E \\sim \\{e\\},

    the Student-t predictive over the ``n >= 2`` observed ``shifts`` (mean :math:`\\bar s`,
    sample deviation :math:`s_s`) and the weighted empirical ``spread``. ``P(|S + E| <= q)``
    is the weighted mean over ``E`` of the shifted t CDF between ``-q`` and ``q``, inverted by
    bisection (to 1e-6 in log time); with identical shifts, the weighted quantile of ``|S + E|``.
    The interval it gives, ``(-q, q)``, is symmetric around the median.
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
