"""Operator vocabulary of the op table, and the FLOPs and memory traffic of each op.

All functions are vectorised over an op table (a ``pandas.DataFrame`` with the op-table
columns of DESIGN.md, or those columns as a mapping of equal-length numpy arrays); missing
shape columns count as absent. Counting conventions:

* GEMM-like ops (``matmul``, ``bmm``, ``linear``): output ``batch x m x n``, reduction
  ``k``; FLOPs ``2*batch*m*n*k`` (``linear`` adds ``batch*m*n`` for the bias). Memory
  traffic: read both operands, write the output, once each.
* ``attention`` (fused, FlashAttention-style): forward FLOPs ``4*batch*heads*seq_q*seq_kv*head_dim``
  (scores and context), halved when ``causal`` (the average over a load-balanced
  context-parallel split too). Backward does 2.5x the forward FLOPs (five GEMMs against
  two, the scores being recomputed). Traffic: Q, K, V and O once (backward: those plus
  dO, dQ, dK, dV).
* Vector ops: ``rows x cols`` elements; traffic counts inputs read and outputs written.
  Backward rows (``backward=True``) read the output gradient and the saved input and
  write the input gradient. ``swiglu`` reads its two halves and writes ``rows x cols``
  (backward: reads the output gradient and both halves, writes both halves' gradients).
* ``optimizer``: an Adam update over ``cols`` parameters (fp32 master weights, two
  moments, fp32 gradient read; master, moments and 16-bit weight written: 30 bytes per
  parameter).
* Collectives carry their message size in ``bytes``; they have no FLOPs and their time
  comes from :mod:`perfcast.features.collectives`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

import numpy as np
import pandas as pd

from perfcast.data.schema import COLLECTIVE_OP_NAMES, GEMM_OP_NAMES, TRUE_WORDS, DType, OpType
from perfcast.errors import SpecError


class OpClass(str, Enum):
    """Coarse family of an op: what bounds it and which predictor times it."""

    GEMM = "gemm"
    ATTENTION = "attention"
    VECTOR = "vector"
    COLLECTIVE = "collective"


GEMM_OPS = GEMM_OP_NAMES
COLLECTIVE_OPS = COLLECTIVE_OP_NAMES
BINARY_OPS = frozenset({OpType.ADD, OpType.MUL, OpType.DIV, OpType.POW})

# FLOPs per element of the forward vector ops (rough, they are memory-bound everywhere).
_VECTOR_FLOPS_PER_ELEMENT = {
    OpType.SOFTMAX: 5.0,
    OpType.LAYERNORM: 8.0,
    OpType.RMSNORM: 4.0,
    OpType.ADD: 1.0,
    OpType.MUL: 1.0,
    OpType.DIV: 1.0,
    OpType.POW: 1.0,
    OpType.RELU: 1.0,
    OpType.GELU: 8.0,
    OpType.SILU: 4.0,
    OpType.TANH: 4.0,
    OpType.SWIGLU: 5.0,
    OpType.EMBEDDING: 0.0,
    OpType.OPTIMIZER: 12.0,
}
ADAM_BYTES_PER_PARAM = 30.0
ATTENTION_BACKWARD_FLOP_RATIO = 2.5


def op_class(op: OpType) -> OpClass:
    """Family of ``op``."""
    if op in GEMM_OPS:
        return OpClass.GEMM
    if op is OpType.ATTENTION:
        return OpClass.ATTENTION
    if op in COLLECTIVE_OPS:
        return OpClass.COLLECTIVE
    return OpClass.VECTOR


def parse_op(value: object) -> OpType:
    """Read an ``op`` cell; raises SpecError naming the value and the allowed ops."""
    try:
        return OpType(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(o.value for o in OpType)
        raise SpecError(f"op={value!r} is not a known op; allowed: {allowed}") from None


def _map_unique(values: Any, fn: Callable[[Any], Any], dtype: Any) -> np.ndarray:
    """``fn`` of every element of ``values``, calling ``fn`` once per distinct value."""
    codes, uniques = pd.factorize(values, use_na_sentinel=False)
    return np.array([fn(u) for u in uniques], dtype=dtype)[codes]


OpColumns = pd.DataFrame | Mapping[str, np.ndarray]
"""An op table: a frame, or its columns as equal-length numpy arrays (the workload graph's fast path)."""


def _n_rows(ops: OpColumns) -> int:
    return len(ops) if isinstance(ops, pd.DataFrame) else len(ops["op"])


def op_kinds(ops: OpColumns) -> np.ndarray:
    """The ``op`` column as canonical op names (str array); SpecError on an unknown op."""
    if not _n_rows(ops):
        return np.array([], dtype=str)
    return _map_unique(np.asarray(ops["op"]), lambda raw: parse_op(raw).value, str)


def op_classes(kinds: np.ndarray) -> np.ndarray:
    """``OpClass`` value of each canonical op name."""
    if not len(kinds):
        return np.array([], dtype=str)
    return _map_unique(np.ravel(kinds), lambda k: op_class(OpType(k)).value, str).reshape(np.shape(kinds))


def _col(ops: OpColumns, name: str, default: float = 0.0) -> np.ndarray:
    if name not in ops:
        return np.full(_n_rows(ops), default, dtype=float)
    column = ops[name]
    dtype = column.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "biuf":  # fast path, same values as the coercion below
        values = np.asarray(column, dtype=float)
        return np.where(np.isnan(values), default, values) if dtype.kind == "f" else values
    return pd.to_numeric(pd.Series(column), errors="coerce").fillna(default).to_numpy(dtype=float)


def flag_column(ops: OpColumns, name: str) -> np.ndarray:
    """An optional boolean column as bools: booleans, numbers and the strings true/yes/1 (any
    case) are True; missing columns, empty cells and NaN are False."""
    if name not in ops:
        return np.zeros(_n_rows(ops), dtype=bool)
    column = ops[name]
    if column.dtype == bool:
        return np.asarray(column)
    return pd.Series(column).map(_truthy).to_numpy(dtype=bool)


def _truthy(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in TRUE_WORDS
    if value is None or pd.isna(value):
        return False
    return bool(value)


def element_bytes(dtypes: pd.Series | np.ndarray, *, activations: bool) -> np.ndarray:
    """Bytes per element of each row's tensors.

    With ``activations=True`` fp8 rows count 2 bytes (activations between fp8 GEMMs
    stay 16-bit); otherwise fp8 GEMM operands count 1 byte.
    """
    if not len(dtypes):
        return np.array([], dtype=float)
    sizes = _map_unique(np.asarray(dtypes), lambda d: DType.parse(d).bytes_per_element, float)
    if activations:
        sizes = np.maximum(sizes, 2.0)
    return sizes


def vector_elements(ops: OpColumns) -> np.ndarray:
    """``rows x cols`` of each row, the elements a vector op touches (``rows`` 1 and ``cols`` 0
    where absent or empty)."""
    return _col(ops, "rows", 1.0) * _col(ops, "cols")


def op_flops(ops: OpColumns) -> np.ndarray:
    """Floating-point operations of each row (see the module docstring)."""
    kind = op_kinds(ops)
    backward = flag_column(ops, "backward")
    batch = _col(ops, "batch", 1.0)
    m, n, k = _col(ops, "m"), _col(ops, "n"), _col(ops, "k")
    gemm = 2.0 * batch * m * n * k + np.where(kind == OpType.LINEAR.value, batch * m * n, 0.0)

    attn = 4.0 * batch * _col(ops, "heads") * _col(ops, "seq_q") * _col(ops, "seq_kv") * _col(ops, "head_dim")
    attn = attn * np.where(flag_column(ops, "causal"), 0.5, 1.0)
    attn = attn * np.where(backward, ATTENTION_BACKWARD_FLOP_RATIO, 1.0)

    per_elem = (
        _map_unique(kind, lambda o: _VECTOR_FLOPS_PER_ELEMENT.get(OpType(o), 0.0), float)
        if len(kind)
        else np.array([], dtype=float)
    )
    vector = per_elem * vector_elements(ops) * np.where(backward, 2.0, 1.0)

    cls = op_classes(kind)
    return np.select(
        [cls == OpClass.GEMM.value, cls == OpClass.ATTENTION.value, cls == OpClass.VECTOR.value],
        [gemm, attn, vector],
        default=0.0,
    )


def op_memory_bytes(ops: OpColumns) -> np.ndarray:
    """Bytes each row moves to and from device memory (collectives: their message size)."""
    kind = op_kinds(ops)
    backward = flag_column(ops, "backward")
    dtypes = ops["dtype"] if "dtype" in ops else np.full(_n_rows(ops), DType.BF16.value, dtype=object)
    operand = element_bytes(dtypes, activations=False)
    act = element_bytes(dtypes, activations=True)

    batch = _col(ops, "batch", 1.0)
    m, n, k = _col(ops, "m"), _col(ops, "n"), _col(ops, "k")
    gemm = batch * (m * k + k * n) * operand + batch * m * n * act

    heads, kv_heads = _col(ops, "heads"), _col(ops, "kv_heads")
    kv_heads = np.where(kv_heads > 0, kv_heads, heads)
    d, sq, skv = _col(ops, "head_dim"), _col(ops, "seq_q"), _col(ops, "seq_kv")
    qo = 2.0 * batch * heads * sq * d
    kv = 2.0 * batch * kv_heads * skv * d
    attn = (qo + kv) * act * np.where(backward, 2.0, 1.0)

    elems = vector_elements(ops)
    binary = np.isin(kind, [o.value for o in BINARY_OPS]) & ~flag_column(ops, "scalar")
    vector = elems * act * np.where(backward, 3.0, np.where(binary, 3.0, 2.0))
    vector = np.where(kind == OpType.SWIGLU.value, elems * act * np.where(backward, 5.0, 3.0), vector)
    vector = np.where(kind == OpType.OPTIMIZER.value, elems * ADAM_BYTES_PER_PARAM, vector)

    cls = op_classes(kind)
    return np.select(
        [cls == OpClass.GEMM.value, cls == OpClass.ATTENTION.value, cls == OpClass.VECTOR.value],
        [gemm, attn, vector],
        default=_col(ops, "bytes"),
    )
