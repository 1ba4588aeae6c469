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

Training stacks: how far a stack's attention runs from the op table's kernels depends on
its kernels (Transformer Engine's fused attention in NeMo / Megatron-Core runs near the
table, the FlashAttention-2 kernels of the FSDP and torchtitan stacks well below it on A100
and H100 alike), so one global factor fitted mostly on some stacks is wrong for the
others. With ``stacks`` (a training-stack label per row, :data:`STACK_COLUMN`) and
``stack_components``, :meth:`ComponentFactors.fit` fits a hierarchy: each listed
component's factor of stack ``s`` is ``k_{c,s} = k_c \\cdot \\exp(\\delta_{c,s})``, the
global ``k_c`` under the prior above and each departure ``\\delta_{c,s}`` under a Gaussian
prior centred on 0 of strength ``stack_prior`` (penalty ``stack_prior * delta^2``, in the
same units as ``prior``). A stack with few rows or little share of the component stays near
the global factor. The global factor is fitted on the rows without a stack (those that state
no framework, as a query that states none) and, through its prior and the departures'
priors, pulled toward the labelled stacks. A row whose stack is unknown (no label, or one no
training row had) gets the global factors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from perfcast.errors import SpecError
from perfcast.features.run_features import COMM_GROUPS

__all__ = [
    "COMPONENTS",
    "COMPONENT_PARTS",
    "FACTOR_RANGE",
    "STACK_COLUMN",
    "ComponentFactors",
    "breakdown_shares",
    "component_shares",
    "stack_labels",
]

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
STACK_COLUMN = "stack"
"""Column of a run-feature frame with each row's training-stack label
(:func:`~perfcast.features.frameworks.attention_stack`: the attention kernels its framework
runs, ``transformer-engine`` or ``flash-attention-2``, else the framework; None where unknown).
Not a run feature (:data:`~perfcast.features.run_features.RUN_FEATURE_SPEC`): only the factors read it."""


def stack_labels(X: pd.DataFrame) -> np.ndarray:
    """Object array of each row's training-stack label (:data:`STACK_COLUMN`; None where absent or empty)."""
    if STACK_COLUMN not in X:
        return np.full(len(X), None, dtype=object)
    return np.array([_as_stack(v) for v in X[STACK_COLUMN]], dtype=object)


def _as_stack(value: Any) -> str | None:
    """A training-stack label, or None for a missing, empty or non-string one (NaN)."""
    return value if isinstance(value, str) and value else None


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
        factors: component name (a key of :data:`COMPONENTS`) -> multiplier, > 0: the global
            factors, those of a row whose training stack is unknown.
        by_stack: training-stack label -> {component -> multiplier} for the stacks that depart
            from the global factors (a hierarchical fit); components absent there take the global one.
    """

    factors: Mapping[str, float]
    by_stack: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        """The components, in order."""
        return tuple(self.factors)

    def of_stack(self, stack: str | None = None) -> dict[str, float]:
        """Component -> factor of a row of training stack ``stack`` (the global factors for None or an unknown one)."""
        return {**self.factors, **self.by_stack.get(stack, {})} if stack is not None else dict(self.factors)

    def log_scale_of(
        self,
        shares: np.ndarray,
        stacks: Sequence[str | None] | None = None,
        distance: np.ndarray | None = None,
        shrunk: Sequence[str] = (),
    ) -> np.ndarray:
        """``log(1 + sum_c (k_c - 1) * shares[:, c])`` per row; ``shares`` as :func:`component_shares`,
        ``k`` each row's factors (:meth:`row_factors` of ``stacks``, ``distance`` and ``shrunk``)."""
        shares = np.asarray(shares, dtype=float)
        if not self.names:
            return np.zeros(len(shares))
        return np.log1p(np.einsum("ij,ij->i", shares, self.row_factors(stacks, len(shares), distance, shrunk) - 1.0))

    def row_factors(
        self,
        stacks: Sequence[str | None] | None,
        n: int,
        distance: np.ndarray | None = None,
        shrunk: Sequence[str] = (),
    ) -> np.ndarray:
        """``(n, len(names))``: each row's component factors, those of its stack (``stacks``; None:
        the global factors for every row), each distinct stack's looked up once; a component in
        ``shrunk`` is shrunk toward 1 by the row's extrapolation ``distance`` ``d``:
        ``k ** (1 / (1 + d))``, as the step model shrinks its learned correction."""
        if stacks is None:
            k = np.tile([self.factors[c] for c in self.names], (n, 1)).reshape(n, len(self.names))
        else:
            unique, row_of = np.unique(np.array([s or "" for s in stacks], dtype=object), return_inverse=True)
            table = np.array([[self.of_stack(s or None)[c] for c in self.names] for s in unique], dtype=float)
            k = table.reshape(len(unique), len(self.names))[row_of.reshape(-1)]
        columns = [i for i, c in enumerate(self.names) if c in shrunk]
        if distance is not None and columns:
            k = k.copy()
            k[:, columns] = k[:, columns] ** (1.0 / (1.0 + np.asarray(distance, dtype=float)))[:, None]
        return k

    def log_scale(self, X: pd.DataFrame, distance: np.ndarray | None = None, shrunk: Sequence[str] = ()) -> np.ndarray:
        """The log multiplier of the composed step per row of run features ``X`` (stacks from
        :data:`STACK_COLUMN`; ``distance`` and ``shrunk`` as :meth:`row_factors`)."""
        return self.log_scale_of(component_shares(X, self.names), stack_labels(X), distance, shrunk)

    @classmethod
    def fit(
        cls,
        shares: np.ndarray,
        log_ratio: np.ndarray,
        *,
        names: Sequence[str],
        weights: np.ndarray | None = None,
        prior: float = 0.01,
        stacks: Sequence[str | None] | None = None,
        stack_components: Sequence[str] = (),
        stack_prior: float = 0.01,
    ) -> ComponentFactors:
        """Factors that best explain ``log_ratio = log(measured / composed)`` (see the module docstring).

        Args:
            shares: ``(n, len(names))`` component shares (:func:`component_shares`).
            log_ratio: per row, ``log(measured / composed)``.
            names: the components, in the columns' order.
            weights: non-negative weight per row (default equal), normalised to sum to 1.
            prior: strength of the pull of each ``log k`` toward 0, >= 0.
            stacks: training-stack label per row (None for unknown); with ``stack_components``,
                each labelled stack gets its own departure from the global factors.
            stack_components: components of ``names`` whose factor departs per stack.
            stack_prior: strength of the pull of each stack's log departure toward 0 (toward
                the global factor), > 0.

        Raises:
            SpecError: mismatched shapes, negative weights or priors, stack components not in ``names``.
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
        if stack_components and not stack_prior > 0:
            raise SpecError(f"stack_prior={stack_prior!r} must be > 0")
        stray = [c for c in stack_components if c not in names]
        if stray:
            raise SpecError(f"stack_components {stray} are not among the fitted components {list(names)}")
        lo, hi = np.log(FACTOR_RANGE)
        if not len(names):
            return cls({})
        total = w.sum()
        if total <= 0:
            return cls(dict.fromkeys(names, 1.0))
        labels = np.array([_as_stack(v) for v in ([None] * len(target) if stacks is None else stacks)], dtype=object)
        if labels.shape != target.shape:
            raise SpecError(f"stacks has {labels.shape[0]} entries for {len(target)} rows")
        known = sorted({s for s in labels if s is not None}) if stack_components else []
        cols = [names.index(c) for c in stack_components]
        # departure design: row i, stack departure j -> its column of shares (0 for other stacks or unknown)
        row_stack = np.array([known.index(s) if s in known else -1 for s in labels])
        n_global, n_dep = len(names), len(known) * len(cols)
        root_w = np.sqrt(w / total)

        def log_k(params: np.ndarray) -> np.ndarray:
            k = np.tile(params[:n_global], (len(target), 1))
            if n_dep:
                dep = np.vstack([params[n_global:].reshape(len(known), len(cols)), np.zeros((1, len(cols)))])
                k[:, cols] += dep[row_stack]
            return k

        def residuals(params: np.ndarray) -> np.ndarray:
            scale = np.log1p(np.einsum("ij,ij->i", shares, np.exp(log_k(params)) - 1.0))
            pulls = np.r_[np.sqrt(prior) * params[:n_global], np.sqrt(stack_prior) * params[n_global:]]
            return np.concatenate([root_w * (scale - target), pulls])

        bounds = (np.r_[np.full(n_global, lo), np.full(n_dep, lo - hi)],
                  np.r_[np.full(n_global, hi), np.full(n_dep, hi - lo)])  # fmt: skip
        params = least_squares(residuals, np.zeros(n_global + n_dep), bounds=bounds).x
        glob = np.exp(params[:n_global])
        dep = params[n_global:].reshape(len(known), len(cols))
        by_stack = {
            s: {names[c]: float(np.clip(glob[c] * np.exp(d), *FACTOR_RANGE)) for c, d in zip(cols, dep[j], strict=True)}
            for j, s in enumerate(known)
        }
        return cls(dict(zip(names, glob.tolist(), strict=True)), by_stack)

    def part_factors(self, stack: str | None = None) -> dict[str, float]:
        """Breakdown part (``attention``, ``comm_tp`` …) -> the factor of its component, for training
        stack ``stack`` (the global factors for None or an unknown stack)."""
        return {part: factor for name, factor in self.of_stack(stack).items() for part in COMPONENT_PARTS[name]}

    def scale_parts(
        self,
        breakdown: pd.DataFrame,
        stacks: Sequence[str | None],
        distance: np.ndarray | None = None,
        shrunk: Sequence[str] = (),
    ) -> pd.DataFrame:
        """A copy of ``breakdown`` (columns ``<part>_ms``, one row per run) with each part the
        factors scale multiplied by the factor of its component for the row (:meth:`row_factors`
        of ``stacks``, aligned with the rows, ``distance`` and ``shrunk``). Other columns unchanged."""
        out = breakdown.copy()
        k = self.row_factors(stacks, len(out), distance, shrunk)
        for i, name in enumerate(self.names):
            for part in COMPONENT_PARTS[name]:
                if f"{part}_ms" in out:
                    out[f"{part}_ms"] = out[f"{part}_ms"].to_numpy() * k[:, i]
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (:meth:`from_dict` reverses it): component -> factor, plus ``by_stack``
        (stack -> component -> factor) for a hierarchical fit."""
        out: dict[str, Any] = {n: float(v) for n, v in self.factors.items()}
        if self.by_stack:
            out["by_stack"] = {s: {n: float(v) for n, v in f.items()} for s, f in self.by_stack.items()}
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ComponentFactors:
        """Rebuild from :meth:`to_dict`; raises ValueError on unknown components or factors outside the range."""
        if not isinstance(data, Mapping):
            raise ValueError(f"component factors must be a mapping, got {type(data).__name__}")

        def checked(factors: Mapping[str, Any]) -> dict[str, float]:
            out = {}
            for name, value in factors.items():
                if name not in COMPONENTS:
                    raise ValueError(f"component {name!r} unknown")
                v = float(value)
                if not FACTOR_RANGE[0] <= v <= FACTOR_RANGE[1]:
                    raise ValueError(f"factor {name}={v} outside {FACTOR_RANGE}")
                out[name] = v
            return out

        by_stack = data.get("by_stack", {})
        if not isinstance(by_stack, Mapping) or not all(isinstance(f, Mapping) for f in by_stack.values()):
            raise ValueError("by_stack must map stack labels to component factors")
        factors = checked({k: v for k, v in data.items() if k != "by_stack"})
        stray = sorted({n for f in by_stack.values() for n in f} - set(factors))
        if stray:
            raise ValueError(f"by_stack components {stray} have no global factor")
        return cls(factors, {str(s): checked(f) for s, f in by_stack.items()})
