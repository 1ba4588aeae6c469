r"""Physics base of the op model: a launch term plus the roofline time, per vendor and op class.

.. math::

    t_\text{base} = L_{v,c} + t_\text{roofline}

``L_{v,c}`` is the launch/host constant of vendor ``v`` and op class ``c``: the
:data:`LAUNCH_QUANTILE` quantile of the measured times of the training ops whose roofline is
under :data:`LAUNCH_ROOFLINE_MS` (:func:`fit_launch`). A vendor with fewer than
:data:`MIN_LAUNCH_ROWS` such ops takes the class's pooled value (key ``(POOLED, class)``),
and a class with fewer than that takes :data:`DEFAULT_LAUNCH_MS`. Inputs are op feature
tables of :func:`perfcast.features.op_features.featurize_ops` (``vendor``, ``roofline_ms``);
times are ms.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import pandas as pd

__all__ = [
    "DEFAULT_LAUNCH_MS",
    "LAUNCH_QUANTILE",
    "LAUNCH_ROOFLINE_MS",
    "MIN_LAUNCH_ROWS",
    "POOLED",
    "base_ms",
    "fit_launch",
]

logger = logging.getLogger(__name__)

DEFAULT_LAUNCH_MS = 0.02
"""Launch term when the training set has too few tiny ops to measure it: 20 us, a typical
PyTorch eager op's launch plus host overhead on a discrete GPU (NeuSight's fastest ops run
in 5-20 us)."""
LAUNCH_ROOFLINE_MS = 1e-3  # ops whose roofline is under 1 us measure the launch term
LAUNCH_QUANTILE = 0.05
MIN_LAUNCH_ROWS = 50  # tiny ops needed per (vendor, class); else the class's pooled value
POOLED = "*"  # vendor key of a class's pooled launch term


def fit_launch(cls: str, feats: pd.DataFrame, t: np.ndarray) -> dict[tuple[str, str], float]:
    """Launch term per vendor of one class, ms: ``{(vendor, cls): ms}`` plus ``(POOLED, cls)``.

    Args:
        cls: the op class; feats: its featurised training rows; t: their measured times, ms.
    """
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


def base_ms(feats: pd.DataFrame, launch: Mapping[tuple[str, str], float], cls: str) -> np.ndarray:
    """``t_base`` of rows of class ``cls``, ms: their vendor's launch term (else the pooled one) plus the roofline."""
    pooled = launch[(POOLED, cls)]
    vendors = feats["vendor"].to_numpy()
    lmap = {v: launch.get((str(v), cls), pooled) for v in pd.unique(vendors)}
    return np.array([lmap[v] for v in vendors], dtype=float) + feats["roofline_ms"].to_numpy(dtype=float)
