"""The workload graph's node builder: appends op rows in execution order, chains them with edges
and fixes each node's stream and dtype.

:mod:`perfcast.features.workload` assembles a step's graph with it and
:mod:`perfcast.features.layer_ops` adds a layer's forward ops; this module holds what both
need: :class:`NodeBuilder`, the per-microbatch tensor sizes (:class:`MicrobatchSizes`), the
model's op kinds (norm, activation, GEMM) and the tensor-parallel collective of a block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from perfcast.data.schema import DType
from perfcast.features.graph import NODE_COLUMNS, Phase
from perfcast.features.model import Activation, NormType, TransformerSpec
from perfcast.features.ops import COLLECTIVE_OPS, GEMM_OPS, OpType
from perfcast.features.parallel import ParallelConfig
from perfcast.features.placement import Group

QUANTIZED_GEMMS = frozenset({
    "attn.qkv", "attn.out", "mlp.up", "mlp.down", "moe.up", "moe.down", "attn.q", "attn.q_down", "attn.q_up",
    "attn.kv_down", "attn.kv_up", "moe.shared_up", "moe.shared_down", "mtp.proj",
})  # fmt: skip
"""GEMMs (with their dgrad, wgrad and recompute) that run in a low-precision run's dtype (fp8, mxfp8,
nvfp4, mxfp4): the transformer layers' linear projections. The attention core, LM head, MoE router
and LoRA adapters stay bf16, as in Transformer Engine and torchao float8 training."""


def _quantized_gemm(name: str) -> bool:
    """Whether GEMM node ``name`` is (derived from) one of :data:`QUANTIZED_GEMMS`."""
    return ".".join(name.split(".")[:2]) in QUANTIZED_GEMMS and ".lora_" not in name


class NodeBuilder:
    """Appends nodes in execution order and chains them with edges.

    ``rows`` holds one dict per node (its ``NODE_COLUMNS`` fields), ``edges`` the
    ``(src, dst)`` pairs, ``last`` the id of the node the next chained one follows.
    """

    def __init__(self, dtype: DType) -> None:
        self.rows: list[dict[str, Any]] = []
        self.edges: list[tuple[int, int]] = []
        self.low_precision = dtype.is_low_precision
        vector_dtype = DType.BF16 if self.low_precision else (DType.FP32 if dtype is DType.TF32 else dtype)
        self.dtype_name, self.vector_dtype_name = dtype.value, vector_dtype.value
        self.last: int | None = None

    def add(self, name: str, scope: str, phase: str, op: OpType, *, chain: bool = True, **fields: Any) -> int:
        """Append node ``name`` (its shape and group given as ``fields``) and return its id.

        GEMMs and attention run in the run's dtype, other ops in the vector dtype; in a
        low-precision run only :data:`QUANTIZED_GEMMS` keep it (and get a ``.quantize`` node
        first). With ``chain`` the node follows the last chained node by an edge.
        """
        op_name, stream, tensor = _OP_INFO[op]
        if not tensor:
            dtype = self.vector_dtype_name
        elif not self.low_precision:
            dtype = self.dtype_name
        elif op in GEMM_OPS and _quantized_gemm(name):
            dtype = self.dtype_name
            if phase != Phase.RECOMPUTE and not name.endswith(".wgrad"):  # a replay copies its quantize node
                self._add_quantize(name, scope, phase, chain, fields)
        else:
            dtype = self.vector_dtype_name  # attention, LM head, router, attention-core BMMs, LoRA: bf16
        node = len(self.rows)
        row: dict[str, Any] = {**_ROW_DEFAULTS, **fields, "node": node, "name": name, "scope": scope, "phase": phase,
                               "stream": stream, "op": op_name, "dtype": dtype}  # fmt: skip
        self.rows.append(row)
        if chain and self.last is not None:
            self.edges.append((self.last, node))
        if chain:
            self.last = node
        return node

    def _add_quantize(self, gemm: str, scope: str, phase: str, chain: bool, shape: Mapping[str, Any]) -> None:
        """The cast of a low-precision GEMM's bf16 inputs, as one tensor-scalar ``mul`` pass (``<gemm>.quantize``).

        Forward: the activation (``batch*m x k``) and the weight (``batch x n x k``), so
        ``rows = batch*(m + n)``, ``cols = k``; ``dgrad``: the output gradient (``batch*m x k``
        in the dgrad's own dims); ``wgrad`` reuses both. A bf16 tensor-scalar pass reads 2 and
        writes 2 bytes per element: the bf16 read plus the row- and column-wise low-precision
        copies (with their amax) that the forward and backward GEMMs consume.
        """
        batch, m, n, k = (int(shape.get(c, 0)) for c in ("batch", "m", "n", "k"))
        rows = batch * m if phase == Phase.BACKWARD else batch * (m + n)
        self.add(f"{gemm}.quantize", scope, phase, OpType.MUL, chain=chain, rows=rows, cols=k, scalar=True)

    def columns(self) -> dict[str, np.ndarray]:
        """The ``NODE_COLUMNS`` as arrays, strings as objects."""
        table = zip(*map(_NODE_FIELDS, self.rows), strict=True)
        return {
            name: np.array(values, dtype=_COLUMN_DTYPES[name]) for name, values in zip(NODE_COLUMNS, table, strict=True)
        }


_STRING_COLUMNS = frozenset(("name", "scope", "phase", "stream", "group", "op", "dtype"))
_FLAG_COLUMNS = frozenset(("scalar", "causal", "backward"))
_COLUMN_DTYPES = {
    name: object if name in _STRING_COLUMNS else (bool if name in _FLAG_COLUMNS else np.int64) for name in NODE_COLUMNS
} | {"repeat": float}
"""Node column types: strings, flags, whole numbers (shapes, ids, counts), and ``repeat``, a node's
occurrences per layer (fractional for a replay that runs on some layers only: ``op-sac``)."""
_ROW_DEFAULTS: dict[str, Any] = {
    **{name: 0 for name, dtype in _COLUMN_DTYPES.items() if dtype in (np.int64, float)},
    **{name: False for name in _FLAG_COLUMNS},
    "group": "",
    "overlap_with": -1,
    "repeat": 1,
}
"""Fields of a node that ``NodeBuilder.add`` is not given: shapes a node does not have are 0, flags False."""
_NODE_FIELDS = itemgetter(*NODE_COLUMNS)
_OP_INFO = {
    op: (op.value, "comm" if op in COLLECTIVE_OPS else "compute", op in GEMM_OPS or op is OpType.ATTENTION)
    for op in OpType
}
"""Per op: its name, its stream, and whether it runs in the config's dtype (GEMMs, attention) or the vector dtype."""
OP_BY_NAME = {op.value: op for op in OpType}
"""A node's ``op`` column value -> its :class:`OpType`."""


@dataclass(frozen=True)
class MicrobatchSizes:
    """Per-rank tensor sizes of one microbatch."""

    tokens: int  # tokens per rank per microbatch (micro_batch * seq_len / cp)
    hidden: int  # model width
    vec_rows: int  # rows of norms and residual adds (tokens / tp with sequence parallelism)
    act_bytes: int  # bytes per activation element
    tp: int
    sp: bool
    tp_rpn: int


def norm_op(model: TransformerSpec) -> OpType:
    """The model's normalisation op."""
    return OpType.RMSNORM if model.norm is NormType.RMSNORM else OpType.LAYERNORM


def activation_op(model: TransformerSpec) -> OpType:
    """The model's MLP activation op."""
    return {Activation.GELU: OpType.GELU, Activation.SILU: OpType.SILU, Activation.RELU: OpType.RELU}[model.activation]


def gemm_op(model: TransformerSpec, batch: int = 1) -> OpType:
    """The op of a weight GEMM: ``bmm`` over ``batch > 1`` weights, else ``linear`` with a bias or ``matmul``."""
    if batch > 1:
        return OpType.BMM
    return OpType.LINEAR if model.bias else OpType.MATMUL


def grad_bytes(parallel: ParallelConfig) -> int:
    """Bytes per gradient (and gathered weight) element on the wire: 4 for fp32 and tf32 runs, else 2."""
    return 4 if parallel.dtype in (DType.FP32, DType.TF32) else 2


def add_tp_collective(b: NodeBuilder, name: str, scope: str, ctx: MicrobatchSizes, op: OpType) -> None:
    """Forward tensor-parallel collective ``op`` over the microbatch's activations (none when ``tp = 1``)."""
    if ctx.tp > 1:
        b.add(
            name,
            scope,
            Phase.FORWARD,
            op,
            group=Group.TP,
            bytes=ctx.tokens * ctx.hidden * ctx.act_bytes,
            n_ranks=ctx.tp,
            ranks_per_node=ctx.tp_rpn,
        )
