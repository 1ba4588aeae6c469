r"""Physics base of the op model: a launch term plus the roofline time, per vendor and op class.

.. math::

    t_\text{base} = L_{v,c} + \max(t_\text{roofline}, t_\text{issue})

``t_issue`` is the featuriser's ``issue_ms``: the instruction-issue time of an embedding
forward, whose gather runs far below the bandwidth roofline on fast-memory GPUs (0 for other
ops; :data:`perfcast.features.op_features.GATHER_CYCLES_PER_ELEMENT`). It is part of the base
the trees correct, not of the physical floor (:mod:`perfcast.models.op_bounds`): a vectorised
gather may beat it.

``L_{v,c}`` is the launch/host constant of vendor ``v`` and op class ``c``: the
:data:`LAUNCH_QUANTILE` quantile of the measured times of the training ops whose roofline is
under :data:`LAUNCH_ROOFLINE_MS` (:func:`fit_launch`). A vendor with fewer than
:data:`MIN_LAUNCH_ROWS` such ops takes the class's pooled value (key ``(POOLED, class)``),
and a class with fewer than that takes :data:`DEFAULT_LAUNCH_MS`. Inputs are op feature
tables of :func:`perfcast.features.op_features.featurize_ops` (``vendor``, ``roofline_ms``);
times are ms.

A timing-aware model passes each row's timing method (:class:`perfcast.data.schema.OpTiming`
values) and gets one term per ``(vendor, class, timing)``, pooled per ``(class, timing)``:
a launch-inclusive CUDA-event time and a kernel-only time of the same tiny op differ 10x
(``benchmarks/results/op_vector_timing.md``). A timing the training set lacks takes
:func:`default_launch_ms` of that timing. Without timings the keys are ``(vendor, class)``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import pandas as pd

from perfcast.data.schema import OpTiming

__all__ = [
    "DEFAULT_LAUNCH_MS",
    "LAUNCH_QUANTILE",
    "LAUNCH_ROOFLINE_MS",
    "MIN_LAUNCH_ROWS",
    "POOLED",
    "DEFAULT_KERNEL_LAUNCH_MS",
    "base_ms",
    "default_launch_ms",
    "fit_launch",
]

logger = logging.getLogger(__name__)

DEFAULT_LAUNCH_MS = 0.02
"""Launch term when the training set has too few tiny ops to measure it: 20 us, a typical
PyTorch eager op's launch plus host overhead on a discrete GPU (NeuSight's fastest ops run
in 5-20 us)."""
DEFAULT_KERNEL_LAUNCH_MS = 0.002
"""Floor of a kernel-only time (no launch in it) when the training set has too few tiny ops of
that timing: 2 us, the shortest kernels of Vidur's A100 and A40 tables (1-5 us)."""
LAUNCH_ROOFLINE_MS = 1e-3  # ops whose roofline is under 1 us measure the launch term
LAUNCH_QUANTILE = 0.05
MIN_LAUNCH_ROWS = 50  # tiny ops needed per (vendor, class); else the class's pooled value
POOLED = "*"  # vendor key of a class's pooled launch term


def default_launch_ms(timing: str | None) -> float:
    """Launch term of a timing with too few tiny training ops, ms (``None``: the timing-blind default)."""
    if timing is None or OpTiming(timing).includes_launch:
        return DEFAULT_LAUNCH_MS
    return DEFAULT_KERNEL_LAUNCH_MS


def fit_launch(
    cls: str, feats: pd.DataFrame, t: np.ndarray, timing: np.ndarray | None = None
) -> dict[tuple[str, ...], float]:
    """Launch term per vendor of one class, ms: ``{(vendor, cls): ms}`` plus ``(POOLED, cls)``.

    Args:
        cls: the op class; feats: its featurised training rows; t: their measured times, ms.
        timing: each row's timing method; given, the keys are ``(vendor, cls, timing)`` and
            ``(POOLED, cls, timing)``, one set per timing present.
    """
    if timing is None:
        return _fit_launch(cls, feats, t, (), np.ones(len(t), dtype=bool), None)
    out: dict[tuple[str, ...], float] = {}
    for value in sorted(pd.unique(timing)):
        out.update(_fit_launch(cls, feats, t, (str(value),), timing == value, str(value)))
    return out


def _fit_launch(
    cls: str, feats: pd.DataFrame, t: np.ndarray, suffix: tuple[str, ...], rows: np.ndarray, timing: str | None
) -> dict[tuple[str, ...], float]:
    """:func:`fit_launch` over the rows ``rows`` (one timing, or all), keys ending in ``suffix``."""
    small = (feats["roofline_ms"].to_numpy() < LAUNCH_ROOFLINE_MS) & rows
    vendors = feats["vendor"].to_numpy()
    if small.sum() >= MIN_LAUNCH_ROWS:
        pooled = float(np.quantile(t[small], LAUNCH_QUANTILE))
    else:
        pooled = default_launch_ms(timing)
        logger.info(
            "%s%s: %d training ops with roofline < 1 us; launch term defaults to %.3f ms",
            cls, f" ({timing})" if timing else "", int(small.sum()), pooled,
        )  # fmt: skip
    out = {(POOLED, cls, *suffix): pooled}
    for vendor in pd.unique(vendors[rows]):
        m = small & (vendors == vendor)
        value = float(np.quantile(t[m], LAUNCH_QUANTILE)) if m.sum() >= MIN_LAUNCH_ROWS else pooled
        out[(str(vendor), cls, *suffix)] = value
    return out


def base_ms(
    feats: pd.DataFrame,
    launch: Mapping[tuple[str, ...], float],
    cls: str,
    timing: np.ndarray | None = None,
) -> np.ndarray:
    """``t_base`` of rows of class ``cls``, ms: their launch term plus the roofline (or the issue time, if longer).

    The launch term is the row's ``(vendor, cls)`` entry, else ``(POOLED, cls)``; with
    ``timing``, the ``(vendor, cls, timing)`` entry, else ``(POOLED, cls, timing)``, else
    :func:`default_launch_ms` of the timing.

    Raises:
        KeyError: ``launch`` has no term of ``cls`` (for any timing, when ``timing`` is given).
    """
    vendors = feats["vendor"].to_numpy()
    roof = feats["roofline_ms"].to_numpy(dtype=float)
    if "issue_ms" in feats:
        roof = np.fmax(roof, feats["issue_ms"].to_numpy(dtype=float))
    if timing is None:
        pooled = launch[(POOLED, cls)]
        lmap = {v: launch.get((str(v), cls), pooled) for v in pd.unique(vendors)}
        return np.array([lmap[v] for v in vendors], dtype=float) + roof
    if not any(len(key) == 3 and key[1] == cls for key in launch):
        raise KeyError(f"no launch term of class {cls!r} for any timing")
    vendor_code, vendor_names = pd.factorize(vendors)
    timing_code, timing_names = pd.factorize(np.asarray(timing, dtype=object))
    terms = np.empty((len(vendor_names), len(timing_names)))
    for j, value in enumerate(map(str, timing_names)):
        pooled = launch.get((POOLED, cls, value), default_launch_ms(value))
        for i, vendor in enumerate(map(str, vendor_names)):
            terms[i, j] = launch.get((vendor, cls, value), pooled)
    return terms[vendor_code, timing_code] + roof
