"""One op-table row as the profiler reads it: integer and boolean cells, the FLOPs and
elements one call moves, and the memory its tensors take.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from perfcast.data.schema import COLLECTIVE_OP_NAMES, GEMM_OP_NAMES, DType, OpType

_VECTOR_PASSES = {OpType.SOFTMAX: 3.0, OpType.LAYERNORM: 3.0, OpType.RMSNORM: 3.0}
"""Memory passes of the vector ops (read + write = 2 for plain element-wise ops)."""
_BINARY = frozenset({OpType.ADD, OpType.MUL, OpType.DIV, OpType.POW})


def _int(row: Mapping[str, Any], col: str) -> int:
    value = row.get(col)
    return 0 if value is None or pd.isna(value) else int(value)


def _flag(row: Mapping[str, Any], col: str) -> bool:
    value = row.get(col)
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return False
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "t", "y")
    return bool(value)


def _element_counts(row: Mapping[str, Any], op: OpType) -> tuple[float, float]:
    """(FLOPs, elements read + written) of one call of a row, roofline-free."""
    if op in GEMM_OP_NAMES:
        b, m, n, k = (_int(row, c) for c in ("batch", "m", "n", "k"))
        return 2.0 * b * m * n * k, float(b * (m * k + k * n + m * n))
    if op is OpType.ATTENTION:
        b, h, kv, sq, skv, d = (_int(row, c) for c in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"))
        kv = kv or h
        flops = 4.0 * b * h * sq * skv * d * (0.5 if _flag(row, "causal") else 1.0)
        elems = float(b * d * (2 * h * sq + 2 * kv * skv))
        return (flops * 2.5, elems * 2) if _flag(row, "backward") else (flops, elems)
    if op in COLLECTIVE_OP_NAMES:
        return 0.0, float(_int(row, "bytes"))
    elems = float(_int(row, "rows") * _int(row, "cols"))
    passes = _VECTOR_PASSES.get(op, 2.0 if _flag(row, "scalar") or op not in _BINARY else 3.0)
    return elems * 8.0, elems * passes * (2.0 if _flag(row, "backward") else 1.0)


def _element_size(dtype: DType) -> int:
    return max(dtype.bytes_per_element, 2) if dtype is DType.FP8 else dtype.bytes_per_element


def _footprint_bytes(row: Mapping[str, Any], op: OpType, dtype: DType) -> float:
    _, elems = _element_counts(row, op)
    if op in COLLECTIVE_OP_NAMES:
        return 2.0 * elems
    return elems * _element_size(dtype) * (3.0 if _flag(row, "backward") else 1.5)
