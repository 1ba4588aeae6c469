"""Efficiency factors of the composed step's parts: one time multiplier per component.

The composed step adds parts whose op times come from kernels measured one at a time. A
training stack runs some parts at another speed than those kernels: attention kernels
differ between releases and no op table times their backward, and communication that
overlaps compute contends with it. A factor ``k_c`` multiplies component ``c``'s share
of the composed step (its breakdown fractions, :data:`COMPONENTS`):

.. math::

    t = t_{composed} \\cdot \\Big(1 + \\sum_c (k_c - 1)\\, \\mathrm{frac}_c\\Big)

A factor of 2 on ``attention`` says the stack's attention takes twice the time the op
model gives its kernels; a component absent from a run (``frac_c = 0``) leaves it alone.

Fit (:meth:`ComponentFactors.fit`): weighted least squares of ``log(measured / composed)``
on the log of that multiplier, with a Gaussian prior on each ``log k_c`` centred on 0 (no
correction) of strength ``prior``: the penalty ``prior * (log k_c)^2`` is added to the
weighted mean squared log error (weights normalised to sum to 1). A component the rows do
not exercise stays at 1, and each factor lies in :data:`FACTOR_RANGE`. (A user's few runs
refine a predictor's factors through :mod:`perfcast.models.step_calibration`.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfcast.errors import SpecError
from perfcast.features.run_features import COMM_GROUPS

__all__ = ["COMPONENTS", "COMPONENT_PARTS", "FACTOR_RANGE", "ComponentFactors", "breakdown_shares", "component_shares"]

COMPONENT_PARTS: dict[str, tuple[str, ...]] = {
    "attention": ("attention",),
    "compute": ("compute", "bubble", "optimizer"),
    "communication": ("dp_sync", *(f"comm_{g}" for g in COMM_GROUPS)),
}
"""Component name -> the parts of the step breakdown it scales (breakdown column ``<part>_ms``,
run feature ``frac_<part>``). The bubble is idle time proportional to the stage's compute,
so it scales with ``compute``."""
COMPONENTS: dict[str, tuple[str, ...]] = {
    name: tuple(f"frac_{part}" for part in parts) for name, parts in COMPONENT_PARTS.items()
}
"""Component name -> the run-feature fractions of the composed step it scales."""
FACTOR_RANGE = (0.25, 8.0)
"""Smallest and largest factor a fit may return (time multipliers)."""


def component_shares(X: pd.DataFrame, names: Sequence[str]) -> np.ndarray:
    """``(n, len(names))``: each component's share of the composed step per row of run features ``X``."""
    unknown = [n for n in names if n not in COMPONENTS]
    if unknown:
        raise SpecError(f"components {unknown} unknown; allowed: {', '.join(COMPONENTS)}")
    missing = sorted({c for n in names for c in COMPONENTS[n]} - set(X.columns))
    if missing:
        raise SpecError(f"run features lack the breakdown fractions {missing}")
    if not names:
        return np.zeros((len(X), 0))
    return np.column_stack([X.loc[:, list(COMPONENTS[n])].to_numpy(dtype=float).sum(axis=1) for n in names])


def breakdown_shares(frame: pd.DataFrame, names: Sequence[str]) -> np.ndarray:
    """``(n, len(names))``: each component's share of the step per row of a prediction frame
    with breakdown columns ``<part>_ms`` (absent or empty parts count 0; shares of the
    parts' sum, 0 for a row whose parts sum to 0)."""
    unknown = [n for n in names if n not in COMPONENT_PARTS]
    if unknown:
        raise SpecError(f"components {unknown} unknown; allowed: {', '.join(COMPONENT_PARTS)}")

    def part_sum(parts: Sequence[str]) -> np.ndarray:
        cols = [f"{p}_ms" for p in parts if f"{p}_ms" in frame]
        return frame[cols].apply(pd.to_numeric, errors="coerce").fillna(0.0).to_numpy(float).sum(axis=1)

    total = part_sum([p for parts in COMPONENT_PARTS.values() for p in parts])
    shares = np.column_stack([part_sum(COMPONENT_PARTS[n]) for n in names]) if names else np.zeros((len(frame), 0))
    return np.divide(shares, total[:, None], out=np.zeros_like(shares), where=total[:, None] > 0)


@dataclass(frozen=True)
class ComponentFactors:
    """Fitted time multipliers per component of the composed step (see the module docstring).

    Attributes:
        factors: component name (a key of :data:`COMPONENTS`) -> multiplier, > 0.
    """

    factors: Mapping[str, float]

    @property
    def names(self) -> tuple[str, ...]:
        """The components, in order."""
        return tuple(self.factors)

    def log_scale_of(self, shares: np.ndarray) -> np.ndarray:
        """``log(1 + sum_c (k_c - 1) * shares[:, c])`` per row; ``shares`` as :func:`component_shares`."""
        k = np.array([self.factors[n] for n in self.names], dtype=float)
        if not len(k):
            return np.zeros(len(shares))
        return np.log1p(np.asarray(shares, dtype=float) @ (k - 1.0))

    def log_scale(self, X: pd.DataFrame) -> np.ndarray:
        """The log multiplier of the composed step per row of run features ``X``."""
        return self.log_scale_of(component_shares(X, self.names))

    @classmethod
    def fit(
        cls,
        shares: np.ndarray,
        log_ratio: np.ndarray,
        *,
        names: Sequence[str],
        weights: np.ndarray | None = None,
        prior: float = 0.01,
    ) -> ComponentFactors:
        """Factors that best explain ``log_ratio = log(measured / composed)`` (see the module docstring).

        Args:
            shares: ``(n, len(names))`` component shares (:func:`component_shares`).
            log_ratio: per row, ``log(measured / composed)``.
            names: the components, in the columns' order.
            weights: non-negative weight per row (default equal), normalised to sum to 1.
            prior: strength of the pull of each ``log k`` toward 0, >= 0.

        Raises:
            SpecError: mismatched shapes, negative weights or prior.
        """
        from scipy.optimize import least_squares

        shares = np.asarray(shares, dtype=float)
        target = np.asarray(log_ratio, dtype=float)
        if shares.shape != (len(target), len(names)):
            raise SpecError(f"shares has shape {shares.shape}, expected {(len(target), len(names))}")
        w = np.ones(len(target)) if weights is None else np.asarray(weights, dtype=float)
        if w.shape != target.shape or (w < 0).any():
            raise SpecError(f"weights must be {len(target)} non-negative numbers")
        if prior < 0:
            raise SpecError(f"prior={prior!r} must be >= 0")
        lo, hi = np.log(FACTOR_RANGE)
        start = np.zeros(len(names))
        if not len(names):
            return cls({})
        total = w.sum()
        if total <= 0:
            return cls(dict.fromkeys(names, 1.0))
        root_w = np.sqrt(w / total)
        root_prior = np.sqrt(prior)

        def residuals(theta: np.ndarray) -> np.ndarray:
            scale = np.log1p(shares @ (np.exp(theta) - 1.0))
            return np.concatenate([root_w * (scale - target), root_prior * (theta - start)])

        theta = least_squares(residuals, start, bounds=(lo, hi)).x
        return cls(dict(zip(names, np.exp(theta).tolist(), strict=True)))

    def part_factors(self) -> dict[str, float]:
        """Breakdown part (``attention``, ``comm_tp`` …) -> the factor of its component."""
        return {part: factor for name, factor in self.factors.items() for part in COMPONENT_PARTS[name]}

    def to_dict(self) -> dict[str, float]:
        """JSON-able form (:meth:`from_dict` reverses it)."""
        return {n: float(v) for n, v in self.factors.items()}

    @classmethod
    def from_dict(cls, data: Any) -> ComponentFactors:
        """Rebuild from :meth:`to_dict`; raises ValueError on unknown components or factors outside the range."""
        if not isinstance(data, Mapping):
            raise ValueError(f"component factors must be a mapping, got {type(data).__name__}")
        out = {}
        for name, value in data.items():
            if name not in COMPONENTS:
                raise ValueError(f"component {name!r} unknown")
            v = float(value)
            if not FACTOR_RANGE[0] <= v <= FACTOR_RANGE[1]:
                raise ValueError(f"factor {name}={v} outside {FACTOR_RANGE}")
            out[name] = v
        return cls(out)
