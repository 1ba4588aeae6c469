"""Domain of the op model: which op-table rows it can answer, and which lie outside what it was fitted on.

A row of an op class the model has no booster for is refused (:func:`featurize_known`).
A row is out of domain (:func:`out_of_domain`; predicted, flagged and warned about by
:func:`warn_out_of_domain`) when its GPU's catalog descriptors (:data:`DOMAIN_DESCRIPTORS`)
fall outside their range over the training GPUs (a missing figure counts as outside),
when its dtype's element size is not among the training rows' sizes, or when one of its
class's log dims (:data:`DOMAIN_DIMS`) falls outside the trained range. Inputs are op
feature tables of :func:`perfcast.features.op_features.featurize_ops`.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from perfcast.errors import OutOfDomainWarning, SpecError
from perfcast.features.hardware import HardwareSpec
from perfcast.features.op_features import featurize_ops
from perfcast.features.ops import OpClass

__all__ = [
    "DOMAIN_DESCRIPTORS",
    "DOMAIN_DIMS",
    "LEGACY_ELEM_BYTES",
    "dim_domain",
    "featurize_known",
    "gpu_domain",
    "out_of_domain",
    "rows_hint",
    "warn_out_of_domain",
]

DOMAIN_DESCRIPTORS = ("sm_count", "mem_bw_gbps", "l2_cache_mib", "peak_fp32_tflops")
"""GPU catalog fields whose training range bounds the domain."""
DOMAIN_DIMS = {
    OpClass.GEMM.value: ("l_b", "l_m", "l_n", "l_k"),
    OpClass.VECTOR.value: ("l_rows", "l_cols"),
    OpClass.ATTENTION.value: ("l_b", "l_heads", "l_seq_q", "l_seq_kv", "l_head_dim"),
}
"""Log-dim feature columns of each op class whose training range bounds the domain."""
_DOMAIN_TOL = 1e-9
LEGACY_ELEM_BYTES = (1.0, 2.0, 4.0)
"""Element sizes (fp8, 16-bit, 32-bit) assumed for a bundle that does not record its training
dtypes: every dtype that existed before the block-scaled ones. A row whose dtype's size
(``elem_bytes``) is not among the training sizes is out of domain: its correction comes from
other formats' efficiency over its own roofline."""


def gpu_domain(gpu_ids: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Range of each :data:`DOMAIN_DESCRIPTORS` figure over the training GPUs (known figures only)."""
    specs = [HardwareSpec.from_name(g) for g in gpu_ids]
    out = {}
    for name in DOMAIN_DESCRIPTORS:
        values = [float(getattr(s, name)) for s in specs if getattr(s, name) is not None]
        if values:
            out[name] = (min(values), max(values))
    return out


def dim_domain(feats: pd.DataFrame, classes: Sequence[str]) -> dict[str, dict[str, tuple[float, float]]]:
    """``{class: {log dim column: (min, max)}}`` over the training rows of each class."""
    return {
        cls: {
            col: (float(feats.loc[feats["op_class"] == cls, col].min()),
                  float(feats.loc[feats["op_class"] == cls, col].max()))
            for col in DOMAIN_DIMS[cls]
        }
        for cls in classes
    }  # fmt: skip


def out_of_domain(
    feats: pd.DataFrame,
    gpus: Mapping[str, tuple[float, float]],
    dims: Mapping[str, Mapping[str, tuple[float, float]]],
    elem_sizes: Sequence[float],
) -> np.ndarray:
    """Boolean per row: outside the GPU ranges ``gpus``, the element sizes ``elem_sizes`` or the dim ranges ``dims``."""
    flags = np.zeros(len(feats), dtype=bool)
    gpu_ids = feats["gpu_id"].to_numpy()
    for gpu in pd.unique(gpu_ids):
        hw = HardwareSpec.from_name(gpu)
        for name, (lo, hi) in gpus.items():
            value = getattr(hw, name)
            if value is None or not (lo - _DOMAIN_TOL <= value <= hi + _DOMAIN_TOL):
                flags[gpu_ids == gpu] = True
                break
    sizes = np.asarray(elem_sizes, dtype=float)
    elem = feats["elem_bytes"].to_numpy(dtype=float)
    seen = np.isclose(elem[:, None], sizes[None, :], rtol=0.0, atol=1e-6).any(axis=1)
    flags |= ~np.isnan(elem) & ~seen
    for cls, ranges in dims.items():
        m = (feats["op_class"] == cls).to_numpy()
        for col, (lo, hi) in ranges.items():
            v = feats[col].to_numpy()
            flags |= m & ((v < lo - _DOMAIN_TOL) | (v > hi + _DOMAIN_TOL))
    return flags


def warn_out_of_domain(ood: np.ndarray, stacklevel: int = 3) -> None:
    """Warn (:class:`OutOfDomainWarning`) when any ``ood`` flag is set (``stacklevel`` as in :func:`warnings.warn`)."""
    n = int(ood.sum())
    if n:
        warnings.warn(
            f"{n} of {len(ood)} op rows lie outside the training domain (GPU descriptors outside the "
            f"training GPUs' range, or dims outside the trained range): their predictions extrapolate",
            OutOfDomainWarning,
            stacklevel=stacklevel,
        )


def rows_hint(index: pd.Index, limit: int = 5) -> str:
    """``"rows a, b, c and N more"``: the first ``limit`` labels of ``index``, for error messages."""
    shown = ", ".join(map(str, list(index[:limit])))
    more = f" and {len(index) - limit} more" if len(index) > limit else ""
    return f"rows {shown}{more}"


def featurize_known(X: Any, classes: Collection[str]) -> pd.DataFrame:
    """Op features of the op-table rows ``X`` (:func:`~perfcast.features.op_features.featurize_ops`).

    Raises:
        SpecError: ``X`` is not a DataFrame, or has rows of an op class not in ``classes``
            (the classes the model was trained on).
    """
    if not isinstance(X, pd.DataFrame):
        raise SpecError(f"X must be an op-table DataFrame, got {type(X).__name__}")
    feats = featurize_ops(X)
    unknown = ~feats["op_class"].isin(list(classes)).to_numpy()
    if unknown.any():
        ops = ", ".join(sorted(pd.unique(X["op"].astype(str)[unknown])))
        found = ", ".join(sorted(pd.unique(feats["op_class"][unknown])))
        raise SpecError(
            f"no model for op class {found} (ops {ops}, {rows_hint(X.index[unknown])}); "
            f"this model was trained on: {', '.join(classes)}"
        )
    return feats
