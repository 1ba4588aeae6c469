"""Map PyTorch ATen operator calls to op-table rows (shared by the trace and nsys readers).

A profiler sees ATen calls (``aten::addmm``) with the sizes of their inputs; the op table
(DESIGN.md, "Interfaces") speaks of ``linear`` with ``batch, m, n, k``. This module holds
that translation, plus the record assembly both profiler readers share (aggregating
repeated occurrences, summarising what was not used); no file formats.

The mapping (inputs as in the ATen schema; ``*`` means any leading dims, folded):

===========================================================  =========  ===============================
ATen name                                                    op         shape columns
===========================================================  =========  ===============================
``mm(a[M,K], b[K,N])``                                       matmul     batch=1, m=M, n=N, k=K
``bmm(a[B,M,K], b[B,K,N])``, ``baddbmm(c, a, b)``            bmm        batch=B, m=M, n=N, k=K
``matmul(a, b)`` (any ranks, numpy broadcasting)             matmul     batch = broadcast batch dims;
                                                             / bmm      ``bmm`` when batch > 1. A 2-D
                                                                        ``b`` folds ``a``'s leading dims
                                                                        into m (one GEMM, as torch runs it)
``addmm(bias, a[M,K], b[K,N])``                              linear     batch=1, m=M, n=N, k=K
``linear(x[*,K], w[N,K], bias)``                             linear     m=prod(*), n=N, k=K; ``matmul``
                                                                        when the bias is absent (no bias
                                                                        add runs)
``softmax``/``_softmax(x, dim)``, ``_softmax_backward_data``  softmax    cols = size of ``dim`` (last dim
                                                                        when unknown), rows = numel/cols
``layer_norm``/``native_layer_norm(x, shape)`` (+backward)   layernorm  cols = prod(normalized shape)
``rms_norm``/``_fused_rms_norm(x, shape)`` (+backward)       rmsnorm    (last dim when unknown)
``add, mul, div, pow`` (and ``add_ …`` in-place)             same       rows x cols of the broadcast
                                                                        output; ``scalar=True`` when an
                                                                        operand has dims ``[]``
``relu, gelu, silu, tanh`` (in-place too; ``threshold_/      same       rows x cols of the input
gelu_/silu_/tanh_backward``)
``embedding(w[V,H], idx)``, ``embedding_dense_backward``     embedding  rows = number of indices, cols=H
``scaled_dot_product_attention`` and its backends            attention  q [B,H,S,D], k [B,Hkv,Skv,D];
(``_scaled_dot_product_flash_attention[_for_cpu]``,                     causal from the is_causal input
``_scaled_dot_product_efficient_attention``,                            when known, else False
``_scaled_dot_product_cudnn_attention``) and their backward
===========================================================  =========  ===============================

``rows x cols`` of a tensor is ``prod(dims[:-1]) x dims[-1]`` (1 x numel for 1-D, 1 x 1 for
0-D). Names of the ``*_backward`` kernels mark ``backward``; a reader also marks ops that
run inside an autograd ``*Backward*`` node. Every other ATen name has no op-table
equivalent (:func:`map_aten_op` returns None).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfcast.data.records import REASON_COLUMN
from perfcast.data.schema import DType, OpType
from perfcast.data.tables import OP_COLUMNS
from perfcast.errors import SpecError

Dims = tuple[int, ...]
"""Sizes of one input tensor (``()`` for a scalar or a non-tensor input)."""

MAX_ELEMENTS = 2**62
"""Largest dimension or element count accepted; larger sizes are garbage, not tensors."""

NO_EQUIVALENT_REASON = "no op-table equivalent"
"""Reason given for ATen names the op table has no row type for."""


class AtenShapeError(ValueError):
    """A mapped ATen call whose input sizes cannot give the op's shape (message says why)."""


@dataclass(frozen=True)
class AtenCall:
    """One ATen call as a profiler records it.

    Attributes:
        name: the operator name with its namespace, e.g. ``"aten::mm"``.
        dims: sizes of each input, in schema order (``()`` for non-tensor inputs).
        concrete: the printed values of scalar inputs (torch's ``Concrete Inputs``), in schema
            order, or None when the source does not record them (then defaults apply).
    """

    name: str
    dims: tuple[Dims, ...]
    concrete: tuple[str, ...] | None = None

    def dim(self, i: int) -> Dims:
        """Sizes of input ``i`` (raise AtenShapeError when there is no such input)."""
        if i >= len(self.dims):
            raise AtenShapeError(f"{self.name}: expected at least {i + 1} inputs, got {len(self.dims)}")
        return self.dims[i]

    def concrete_at(self, i: int) -> str | None:
        """The printed value of input ``i``, or None when unknown or empty."""
        if self.concrete is None or i >= len(self.concrete):
            return None
        value = self.concrete[i].strip()
        return value or None


def _numel(dims: Sequence[int]) -> int:
    n = math.prod(dims)
    if n > MAX_ELEMENTS:
        raise AtenShapeError(f"element count {n} is implausibly large")
    return n


def _rows_cols(dims: Dims, cols: int | None = None) -> dict[str, int]:
    """Rows x cols view of a tensor: cols = last dim (or the given size), rows = numel / cols."""
    numel = _numel(dims) if dims else 1
    if cols is None:
        cols = dims[-1] if dims else 1
    if cols <= 0 or numel <= 0 or numel % cols:
        raise AtenShapeError(f"cannot view sizes {list(dims)} as rows x {cols}")
    return {"rows": numel // cols, "cols": cols}


def _need_rank(call: AtenCall, i: int, low: int, high: int | None = None) -> Dims:
    dims = call.dim(i)
    if len(dims) < low or (high is not None and len(dims) > high):
        want = f"{low}" if high == low else (f"{low}..{high}" if high is not None else f">= {low}")
        raise AtenShapeError(f"{call.name}: input {i} has sizes {list(dims)}, expected rank {want}")
    return dims


def _gemm(op: OpType, batch: int, m: int, n: int, k: int) -> dict[str, object]:
    return {"op": op.value, "batch": batch, "m": m, "n": n, "k": k}


def _broadcast(a: Dims, b: Dims, name: str) -> Dims:
    out = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + a), reversed((1,) * (len(a) - len(b)) + b), strict=True):
        if x != y and 1 not in (x, y):
            raise AtenShapeError(f"{name}: sizes {list(a)} and {list(b)} do not broadcast")
        out.append(max(x, y))
    return tuple(reversed(out))


def _mm(call: AtenCall) -> dict[str, object]:
    a, b = _need_rank(call, 0, 2, 2), _need_rank(call, 1, 2, 2)
    if a[1] != b[0]:
        raise AtenShapeError(f"{call.name}: inner sizes differ in {list(a)} x {list(b)}")
    return _gemm(OpType.MATMUL, 1, a[0], b[1], a[1])


def _bmm_at(call: AtenCall, i: int) -> dict[str, object]:
    a, b = _need_rank(call, i, 3, 3), _need_rank(call, i + 1, 3, 3)
    if a[2] != b[1] or a[0] != b[0]:
        raise AtenShapeError(f"{call.name}: sizes {list(a)} x {list(b)} do not form a batched GEMM")
    return _gemm(OpType.BMM, a[0], a[1], b[2], a[2])


def _addmm(call: AtenCall) -> dict[str, object]:
    a, b = _need_rank(call, 1, 2, 2), _need_rank(call, 2, 2, 2)
    if a[1] != b[0]:
        raise AtenShapeError(f"{call.name}: inner sizes differ in {list(a)} x {list(b)}")
    return _gemm(OpType.LINEAR, 1, a[0], b[1], a[1])


def _linear(call: AtenCall) -> dict[str, object]:
    x, w = _need_rank(call, 0, 1), _need_rank(call, 1, 2, 2)
    if x[-1] != w[1]:
        raise AtenShapeError(f"{call.name}: input {list(x)} does not match weight {list(w)}")
    has_bias = len(call.dims) > 2 and len(call.dims[2]) > 0
    op = OpType.LINEAR if has_bias else OpType.MATMUL
    return _gemm(op, 1, _numel(x[:-1]) if len(x) > 1 else 1, w[0], w[1])


def _matmul(call: AtenCall) -> dict[str, object]:
    a, b = _need_rank(call, 0, 1), _need_rank(call, 1, 1)
    if a[-1] != (b[0] if len(b) == 1 else b[-2]):
        raise AtenShapeError(f"{call.name}: inner sizes differ in {list(a)} x {list(b)}")
    k = a[-1]
    if len(b) <= 2:  # one GEMM: a's leading dims fold into m
        m = _numel(a[:-1]) if len(a) > 1 else 1
        n = b[-1] if len(b) == 2 else 1
        return _gemm(OpType.MATMUL, 1, m, n, k)
    m = a[-2] if len(a) >= 2 else 1
    n = b[-1]
    batch = _numel(_broadcast(a[:-2], b[:-2], call.name)) if len(a) >= 2 else _numel(b[:-2])
    return _gemm(OpType.BMM if batch > 1 else OpType.MATMUL, batch, m, n, k)


def _parse_int_list(text: str | None) -> tuple[int, ...] | None:
    """``"[64]"`` or ``"[4, 64]"`` or ``"-1"`` -> ints, None when not that form."""
    if text is None:
        return None
    body = text.strip().removeprefix("[").removesuffix("]").strip()
    if not body:
        return None
    try:
        return tuple(int(part) for part in body.split(","))
    except ValueError:
        return None


def _norm(op: OpType, shape_input: int) -> Callable[[AtenCall], dict[str, object]]:
    """layer_norm / rms_norm: cols = prod(normalized_shape) when printed, else the last dim."""

    def mapper(call: AtenCall) -> dict[str, object]:
        x = _need_rank(call, 0, 1)
        shape = _parse_int_list(call.concrete_at(shape_input))
        cols = None
        if shape and all(s > 0 for s in shape) and tuple(x[-len(shape) :]) == shape:
            cols = _numel(shape)
        return {"op": op.value, **_rows_cols(x, cols)}

    return mapper


def _softmax(dim_input: int) -> Callable[[AtenCall], dict[str, object]]:
    def mapper(call: AtenCall) -> dict[str, object]:
        x = _need_rank(call, 0, 0)
        dim = _parse_int_list(call.concrete_at(dim_input))
        cols = None
        if x and dim is not None and len(dim) == 1 and -len(x) <= dim[0] < len(x):
            cols = x[dim[0]]
        return {"op": OpType.SOFTMAX.value, **_rows_cols(x, cols)}

    return mapper


def _unary(op: OpType) -> Callable[[AtenCall], dict[str, object]]:
    def mapper(call: AtenCall) -> dict[str, object]:
        return {"op": op.value, **_rows_cols(call.dim(0))}

    return mapper


def _binary(op: OpType) -> Callable[[AtenCall], dict[str, object]]:
    def mapper(call: AtenCall) -> dict[str, object]:
        a = call.dim(0)
        b = call.dims[1] if len(call.dims) > 1 else ()
        scalar = len(a) == 0 or len(b) == 0
        return {"op": op.value, **_rows_cols(_broadcast(a, b, call.name)), "scalar": scalar}

    return mapper


def _embedding(indices_input: int, table_input: int, hidden_last: bool) -> Callable[[AtenCall], dict[str, object]]:
    """rows = number of looked-up indices, cols = embedding width."""

    def mapper(call: AtenCall) -> dict[str, object]:
        table = _need_rank(call, table_input, 1 if hidden_last else 2, None if hidden_last else 2)
        idx = call.dim(indices_input)
        cols = table[-1] if hidden_last else table[1]
        return {"op": OpType.EMBEDDING.value, "rows": _numel(idx) if idx else 1, "cols": cols}

    return mapper


def _attention(q_input: int, causal_input: int | None) -> Callable[[AtenCall], dict[str, object]]:
    """SDPA family: q [*, H, S, D] and k [*, Hkv, Skv, D]; 3-D inputs mean one head."""

    def mapper(call: AtenCall) -> dict[str, object]:
        q, k = _need_rank(call, q_input, 3), _need_rank(call, q_input + 1, 3)
        if len(q) != len(k) or q[-1] != k[-1]:
            raise AtenShapeError(f"{call.name}: query {list(q)} and key {list(k)} do not match")
        four_d = len(q) >= 4
        causal_text = call.concrete_at(causal_input) if causal_input is not None else None
        return {
            "op": OpType.ATTENTION.value,
            "batch": _numel(q[:-3]) if four_d else q[0],
            "heads": q[-3] if four_d else 1,
            "kv_heads": k[-3] if four_d else 1,
            "seq_q": q[-2],
            "seq_kv": k[-2],
            "head_dim": q[-1],
            "causal": (causal_text or "").lower() in ("true", "1"),
        }

    return mapper


_BINARY = {"add": OpType.ADD, "mul": OpType.MUL, "div": OpType.DIV, "pow": OpType.POW}
_UNARY = {"relu": OpType.RELU, "gelu": OpType.GELU, "silu": OpType.SILU, "tanh": OpType.TANH}

_MAPPERS: dict[str, Callable[[AtenCall], dict[str, object]]] = {
    "aten::mm": _mm,
    "aten::bmm": lambda call: _bmm_at(call, 0),
    "aten::baddbmm": lambda call: _bmm_at(call, 1),
    "aten::matmul": _matmul,
    "aten::addmm": _addmm,
    "aten::linear": _linear,
    "aten::softmax": _softmax(1),
    "aten::_softmax": _softmax(1),
    "aten::_softmax_backward_data": _softmax(2),
    "aten::layer_norm": _norm(OpType.LAYERNORM, 1),
    "aten::native_layer_norm": _norm(OpType.LAYERNORM, 1),
    "aten::native_layer_norm_backward": _norm(OpType.LAYERNORM, 2),
    "aten::rms_norm": _norm(OpType.RMSNORM, 1),
    "aten::_fused_rms_norm": _norm(OpType.RMSNORM, 1),
    "aten::_fused_rms_norm_backward": _norm(OpType.RMSNORM, 2),
    "aten::threshold_backward": _unary(OpType.RELU),
    "aten::gelu_backward": _unary(OpType.GELU),
    "aten::silu_backward": _unary(OpType.SILU),
    "aten::tanh_backward": _unary(OpType.TANH),
    "aten::embedding": _embedding(1, 0, hidden_last=False),
    "aten::embedding_backward": _embedding(1, 0, hidden_last=True),
    "aten::embedding_dense_backward": _embedding(1, 0, hidden_last=True),
    # SDPA: (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    "aten::scaled_dot_product_attention": _attention(0, 5),
    "aten::_scaled_dot_product_flash_attention": _attention(0, 4),
    "aten::_scaled_dot_product_flash_attention_for_cpu": _attention(0, 4),
    "aten::_scaled_dot_product_efficient_attention": _attention(0, 6),
    "aten::_scaled_dot_product_cudnn_attention": _attention(0, 6),
    "aten::_scaled_dot_product_flash_attention_backward": _attention(1, 11),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _attention(1, 7),
    "aten::_scaled_dot_product_efficient_attention_backward": _attention(1, 11),
    "aten::_scaled_dot_product_cudnn_attention_backward": _attention(1, 14),
}
for _name, _op in _BINARY.items():
    _MAPPERS[f"aten::{_name}"] = _binary(_op)
    _MAPPERS[f"aten::{_name}_"] = _binary(_op)
for _name, _op in _UNARY.items():
    _MAPPERS[f"aten::{_name}"] = _unary(_op)
    _MAPPERS[f"aten::{_name}_"] = _unary(_op)

MAPPED_ATEN_OPS: frozenset[str] = frozenset(_MAPPERS)
"""Every ATen name :func:`map_aten_op` maps to an op-table row."""


def is_mapped_aten_op(name: str) -> bool:
    """Whether ``name`` (e.g. ``"aten::addmm"``) has an op-table equivalent."""
    return name in _MAPPERS


def is_backward_name(name: str) -> bool:
    """Whether an op or autograd-node name denotes backward work.

    True for autograd nodes (``MmBackward0``, ``autograd::engine::evaluate_function:
    MmBackward0``) and for ATen backward kernels (``aten::gelu_backward``).
    """
    return "Backward" in name or name.endswith("_backward") or "_backward_" in name


def map_aten_op(call: AtenCall) -> dict[str, object] | None:
    """The op-table row of an ATen call: ``op`` and its shape columns (no dtype, no time).

    Returns:
        None when the name has no op-table equivalent, else a dict with ``op`` and the
        shape columns of that op (``batch, m, n, k``; ``rows, cols[, scalar]``; attention's
        ``batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal``), plus ``backward=True``
        for ATen backward kernels.

    Raises:
        AtenShapeError: the op maps but its input sizes are missing or inconsistent.
    """
    mapper = _MAPPERS.get(call.name)
    if mapper is None:
        return None
    row = mapper(call)
    for key, value in row.items():
        if isinstance(value, int) and not isinstance(value, bool) and not 0 < value <= MAX_ELEMENTS:
            raise AtenShapeError(f"{call.name}: {key}={value} is not a positive size")
    if is_backward_name(call.name):
        row["backward"] = True
    return row


_TYPE_ALIASES = {"c10::bfloat16": "bf16", "c10::half": "fp16", "float": "fp32", "half": "fp16"}


def dtype_from_input_type(type_name: object) -> str | None:
    """The op-table dtype of a torch ``Input type`` string, or None when it has none.

    ``"float"`` -> ``fp32``, ``"c10::BFloat16"`` -> ``bf16``, ``"c10::Half"`` -> ``fp16``,
    ``"c10::Float8_e4m3fn"`` and the other float8 formats -> ``fp8``. Doubles, integers,
    booleans and complex types have no op-table dtype.
    """
    if not isinstance(type_name, str):
        return None
    key = type_name.strip().lower()
    if key in _TYPE_ALIASES:
        return _TYPE_ALIASES[key]
    key = key.removeprefix("c10::")
    if key.startswith("float8"):
        return DType.FP8.value
    try:
        return DType.parse(key).value
    except SpecError:
        return None


def parse_dims(value: object) -> tuple[Dims, ...] | None:
    """Validate a profiler's ``Input Dims`` value: a list of lists of non-negative ints.

    Returns None when ``value`` is not of that form (booleans and floats are refused, as are
    sizes above :data:`MAX_ELEMENTS`).
    """
    if not isinstance(value, list):
        return None
    out: list[Dims] = []
    for entry in value:
        if not isinstance(entry, list):
            return None
        if not all(type(d) is int and 0 <= d <= MAX_ELEMENTS for d in entry):
            return None
        out.append(tuple(entry))
    return tuple(out)


# --------------------------------------------------------------------------- shared record assembly

RECORD_COLUMNS: tuple[str, ...] = (
    *OP_COLUMNS,
    "backward",
    "measured_ms",
    "measured_min_ms",
    "measured_max_ms",
    "n_repeats",
    "timing",
    "aten_op",
    "framework",
    "source",
)
"""Columns of the op records the profiler readers return, in order."""

REJECTED_COLUMNS: tuple[str, ...] = ("name", "count", "self_ms", "input_dims", REASON_COLUMN)
"""Columns of the profiler readers' rejected summary (one row per name and reason)."""

_GROUP_COLUMNS = (*OP_COLUMNS, "backward", "timing")
_SHAPE_INT_COLUMNS = ("batch", "m", "n", "k", "rows", "cols", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim")


@dataclass
class OccurrenceSummary:
    """Counts calls a profiler reader did not turn into records, by (name, reason).

    ``self_ms`` sums the time spent in the calls themselves (not in their children), ms;
    ``input_dims`` keeps the sizes of the first such call, as an example.
    """

    rows: dict[tuple[str, str], list] = field(default_factory=dict)

    def add(self, name: str, reason: str, self_ms: float = 0.0, dims: str = "") -> None:
        """Count one call of ``name`` not used for ``reason``."""
        entry = self.rows.setdefault((name, reason), [0, 0.0, dims])
        entry[0] += 1
        entry[1] += self_ms

    def frame(self) -> pd.DataFrame:
        """The summary as a frame with :data:`REJECTED_COLUMNS`, most frequent first."""
        data = [
            {"name": name, "count": c, "self_ms": ms, "input_dims": dims, REASON_COLUMN: reason}
            for (name, reason), (c, ms, dims) in self.rows.items()
        ]
        df = pd.DataFrame(data, columns=list(REJECTED_COLUMNS))
        return df.sort_values(["count", "name"], ascending=[False, True], ignore_index=True)


def aggregate_occurrences(rows: list[dict], *, source: str, framework: str = "pytorch") -> pd.DataFrame:
    """Aggregate op occurrences into one record per (op, shapes, dtype, gpu, backward, timing).

    Args:
        rows: one dict per occurrence: the :func:`map_aten_op` row plus ``dtype``, ``gpu``,
            ``backward``, ``timing``, ``time_ms`` (positive) and ``aten_op``.
        source: the ``source`` column's value.
        framework: the ``framework`` column's value.

    Returns:
        :data:`RECORD_COLUMNS`: ``measured_ms`` is the median of the occurrences' times, with
        their min, max and count (``n_repeats``); ``aten_op`` lists the ATen names seen.
    """
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in RECORD_COLUMNS})
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[tuple(row.get(c) for c in _GROUP_COLUMNS)].append(row)
    out = []
    for key, members in groups.items():
        times = np.array([m["time_ms"] for m in members], dtype=float)
        rec = dict(zip(_GROUP_COLUMNS, key, strict=True))
        rec.update(
            measured_ms=float(np.median(times)),
            measured_min_ms=float(times.min()),
            measured_max_ms=float(times.max()),
            n_repeats=len(members),
            aten_op=",".join(sorted({m["aten_op"] for m in members})),
            framework=framework,
            source=source,
        )
        out.append(rec)
    df = pd.DataFrame(out)
    for col in RECORD_COLUMNS:
        if col not in df:
            df[col] = None
    for col in (*_SHAPE_INT_COLUMNS, "bytes", "n_ranks", "ranks_per_node"):
        df[col] = pd.array([None if v is None or v != v else int(v) for v in df[col]], dtype="Int64")
    for col in ("scalar", "causal"):
        df[col] = df[col].astype(object).where(df[col].notna(), None)
    df["backward"] = df["backward"].astype(bool)
    df["n_repeats"] = df["n_repeats"].astype("int64")
    return df[list(RECORD_COLUMNS)].sort_values(["op", "backward"], kind="stable", ignore_index=True)
