"""Accuracy, interval and ranking metrics of time predictions (DESIGN.md, decision 6).

All functions are vectorised over 1-D or n-D arrays of equal shape. Predicted and true
values are times in any one unit (ms throughout perfcast); percentage errors are in
percent, coverage is a fraction in [0, 1], widths are relative (unitless).
Inputs are checked at the boundary: mismatched shapes, empty or non-finite input and
non-positive true values raise :class:`~perfcast.errors.SpecError`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from perfcast.errors import SpecError

ArrayLike = npt.ArrayLike


def _as_arrays(**named: ArrayLike) -> list[np.ndarray]:
    """Convert named inputs to float arrays of one shape; raise SpecError otherwise."""
    arrays = {name: np.asarray(value, dtype=np.float64) for name, value in named.items()}
    shapes = {name: a.shape for name, a in arrays.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise SpecError(f"shape mismatch: {listed}")
    for name, a in arrays.items():
        if a.size == 0:
            raise SpecError(f"{name} is empty: need at least one value")
        if not np.isfinite(a).all():
            raise SpecError(f"{name} has {int((~np.isfinite(a)).sum())} non-finite values (NaN or inf)")
    return list(arrays.values())


def _check_positive(name: str, values: np.ndarray) -> None:
    """Raise SpecError if any value is <= 0 (needed for relative measures)."""
    bad = values <= 0
    if bad.any():
        raise SpecError(f"{name} must be positive: {int(bad.sum())} values <= 0 (min {values.min():g})")


def ape(pred: ArrayLike, true: ArrayLike) -> np.ndarray:
    """Absolute percentage error per element, percent: ``100 * |pred - true| / true``.

    Args:
        pred: predicted times (same unit as ``true``).
        true: measured times, all positive.

    Returns:
        Array of the common shape, percent.
    """
    pred_a, true_a = _as_arrays(pred=pred, true=true)
    _check_positive("true", true_a)
    return 100.0 * np.abs(pred_a - true_a) / true_a


def mape(pred: ArrayLike, true: ArrayLike) -> float:
    """Mean absolute percentage error, percent."""
    return float(np.mean(ape(pred, true)))


def median_ape(pred: ArrayLike, true: ArrayLike) -> float:
    """Median absolute percentage error, percent."""
    return float(np.median(ape(pred, true)))


def p90_ape(pred: ArrayLike, true: ArrayLike) -> float:
    """90th percentile of the absolute percentage error (linear interpolation), percent."""
    return float(np.percentile(ape(pred, true), 90.0))


def interval_coverage(lo: ArrayLike, hi: ArrayLike, true: ArrayLike) -> float:
    """Fraction of true values inside their closed interval ``[lo, hi]``, in [0, 1].

    Raises:
        SpecError: on a shape mismatch, non-finite values or any ``lo > hi``.
    """
    lo_a, hi_a, true_a = _as_arrays(lo=lo, hi=hi, true=true)
    _check_ordered(lo_a, hi_a)
    return float(np.mean((lo_a <= true_a) & (true_a <= hi_a)))


def mean_relative_width(lo: ArrayLike, hi: ArrayLike, pred: ArrayLike) -> float:
    """Mean relative interval width ``mean((hi - lo) / pred)``, unitless (0.2 = 20 %).

    Raises:
        SpecError: on a shape mismatch, non-finite values, ``lo > hi`` or ``pred <= 0``.
    """
    lo_a, hi_a, pred_a = _as_arrays(lo=lo, hi=hi, pred=pred)
    _check_ordered(lo_a, hi_a)
    _check_positive("pred", pred_a)
    return float(np.mean((hi_a - lo_a) / pred_a))


def _check_ordered(lo: np.ndarray, hi: np.ndarray) -> None:
    """Raise SpecError if any interval has ``lo > hi``."""
    crossed = lo > hi
    if crossed.any():
        raise SpecError(f"interval bounds cross: {int(crossed.sum())} rows have lo > hi")


def spearman(pred: ArrayLike, true: ArrayLike) -> float:
    """Spearman rank correlation of predictions and truths, in [-1, 1].

    Pearson correlation of the ranks (ties get their average rank), computed with
    pandas ``rank`` and numpy, so scipy is not needed.

    Returns:
        The correlation; NaN when either input is constant (the correlation is undefined).

    Raises:
        SpecError: on a shape mismatch, non-finite values or fewer than two values.
    """
    pred_a, true_a = _as_arrays(pred=pred, true=true)
    if pred_a.size < 2:
        raise SpecError(f"spearman needs at least 2 values, got {pred_a.size}")
    pred_r = pd.Series(pred_a.ravel()).rank(method="average").to_numpy()
    true_r = pd.Series(true_a.ravel()).rank(method="average").to_numpy()
    if np.ptp(pred_r) == 0 or np.ptp(true_r) == 0:
        return float("nan")
    return float(np.corrcoef(pred_r, true_r)[0, 1])


def summarize(
    pred: ArrayLike,
    true: ArrayLike,
    lo: ArrayLike | None = None,
    hi: ArrayLike | None = None,
) -> dict[str, float]:
    """The standard evaluation summary of a set of predictions.

    Args:
        pred: predicted times, same unit as ``true``.
        true: measured times, all positive.
        lo, hi: interval bounds, both or neither.

    Returns:
        ``n`` (count), ``mape``, ``median_ape``, ``p90_ape`` (percent) and, with
        ``lo``/``hi``, ``coverage`` (fraction 0..1) and ``rel_width`` (mean (hi-lo)/pred).

    Raises:
        SpecError: bad inputs (see the individual metrics), or only one of ``lo``/``hi``.
    """
    errors = ape(pred, true)
    out: dict[str, float] = {
        "n": float(errors.size),
        "mape": float(np.mean(errors)),
        "median_ape": float(np.median(errors)),
        "p90_ape": float(np.percentile(errors, 90.0)),
    }
    if (lo is None) != (hi is None):
        raise SpecError("give both lo and hi for interval metrics, or neither")
    if lo is not None and hi is not None:
        out["coverage"] = interval_coverage(lo, hi, true)
        out["rel_width"] = mean_relative_width(lo, hi, pred)
    return out
