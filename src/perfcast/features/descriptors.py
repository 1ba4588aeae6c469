"""Descriptor figures of an accelerator for learned features, with catalog gaps imputed from a peer."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from perfcast.features.hardware_spec import HardwareSpec, list_hardware

logger = logging.getLogger(__name__)

IMPUTED_FIGURES = ("sm_count", "l2_cache_mib", "tdp_w", "peak_fp32_tflops", "boost_clock_mhz")
"""Figures that :func:`descriptor_figures` fills from a peer when the catalog lacks them."""


@lru_cache(maxsize=64)
def descriptor_figures(hw: HardwareSpec) -> Mapping[str, float]:
    """``hw``'s :data:`IMPUTED_FIGURES` for learned features, each NaN-free where a peer allows.

    A figure the catalog lacks (no vendor source gave B200's SM count or L2 size) is taken
    from the nearest catalog entry of the same vendor that has it
    (:class:`sklearn.impute.KNNImputer`, one neighbour, NaN-aware Euclidean distance over
    the logs of the tensor peak (fp16, else bf16), memory bandwidth and these figures).
    A tree never saw a missing descriptor in training, so a NaN would send the row down
    arbitrary branches. A figure no peer of the vendor has stays NaN. The catalog entry
    itself is not changed.
    """
    own = [getattr(hw, name) for name in IMPUTED_FIGURES]
    if all(v is not None for v in own):
        return MappingProxyType({n: float(v) for n, v in zip(IMPUTED_FIGURES, own, strict=True)})
    from sklearn.impute import KNNImputer

    peers = [s for s in list_hardware() if s.vendor == hw.vendor and s.id != hw.id]
    logs = np.log(np.array([_figure_row(s) for s in (hw, *peers)], dtype=float))
    known = ~np.isnan(logs).all(axis=0)
    filled = np.full(logs.shape[1], np.nan)
    filled[known] = KNNImputer(n_neighbors=1).fit_transform(logs[:, known])[0]
    values = [round(float(np.exp(f)), 6) if v is None else float(v) for v, f in zip(own, filled[2:], strict=True)]
    imputed = [n for n, v, f in zip(IMPUTED_FIGURES, own, values, strict=True) if v is None and np.isfinite(f)]
    if imputed:
        logger.info("%s: %s imputed from the nearest %s catalog entry", hw.id, ", ".join(imputed), hw.vendor)
    return MappingProxyType(dict(zip(IMPUTED_FIGURES, values, strict=True)))


def _figure_row(hw: HardwareSpec) -> list[float]:
    """Tensor peak, memory bandwidth and :data:`IMPUTED_FIGURES` of ``hw`` (NaN where unknown)."""
    tensor = hw.peak_fp16_tflops or hw.peak_bf16_tflops
    figures = [tensor, hw.mem_bw_gbps, *(getattr(hw, name) for name in IMPUTED_FIGURES)]
    return [np.nan if v is None else float(v) for v in figures]
