r"""Physical bound of a predicted op time: its roofline time over a measured efficiency ceiling.

Whatever the op model's trees say, a predicted time is never below the op's roofline time,
and its efficiency ``t_roofline / t`` never above the best the training data measured for
the op's class and dtype family:

.. math::

    \hat t \ge t_\text{roofline} / \eta_{c,d}, \qquad
    \eta_{c,d} = \min\bigl(1,\; (1 + m) \max_{\text{train } c, d} t_\text{roofline} / t\bigr)

with ``m`` = :data:`EFFICIENCY_MARGIN` (+10% relative) and ``d`` the dtype family
(:func:`dtype_family`: 32-bit, 16-bit, 8-bit, 4-bit, by element size). The ceilings are
a ``{class: {dtype family: eta}}`` mapping (:func:`fit_efficiency_ceilings`); a (class,
family) without an entry uses ``eta = 1``, the roofline itself.

Inputs are op feature tables of :func:`perfcast.features.op_features.featurize_ops`
(``op_class``, ``elem_bytes``, ``roofline_ms``); times are ms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["EFFICIENCY_MARGIN", "dtype_family", "efficiency_ceilings", "fit_efficiency_ceilings", "floor_ms"]

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


def fit_efficiency_ceilings(feats: pd.DataFrame, t: np.ndarray, classes: list[str]) -> dict[str, dict[str, float]]:
    """``{class: {dtype family: min(1, (1 + margin) * best measured roofline / time)}}`` of measured ops.

    Args:
        feats: featurised training ops; t: their measured times, ms (> 0);
        classes: the op classes to fit (each needs rows in ``feats``).
    """
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


def efficiency_ceilings(ceilings: Mapping[str, Mapping[str, float]], feats: pd.DataFrame) -> np.ndarray:
    """The ceiling ``eta`` of each row's class and dtype family (shape ``(n,)``, in (0, 1]; 1 where none)."""
    families = dtype_family(feats["elem_bytes"].to_numpy(dtype=float))
    classes = feats["op_class"].to_numpy()
    out = np.ones(len(feats))
    for cls, by_family in ceilings.items():
        for family, eta in by_family.items():
            out[(classes == cls) & (families == family)] = eta
    return out


def floor_ms(ceilings: Mapping[str, Mapping[str, float]], feats: pd.DataFrame) -> np.ndarray:
    """Physical floor of each row: its roofline time over its efficiency ceiling, ms (shape ``(n,)``)."""
    return feats["roofline_ms"].to_numpy(dtype=float) / efficiency_ceilings(ceilings, feats)
