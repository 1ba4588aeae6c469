"""Workload graph: one training step of a (model, layout, cluster) config as a graph of ops.

The graph is a *template* of what one GPU on the busiest pipeline stage executes: a
dense transformer layer and (for MoE models) a mixture-of-experts layer, each with its
forward, recomputation and backward ops for one microbatch; the first-stage ops
(embedding), the last-stage ops (final norm, LM head, loss); the pipeline send/recv of
one microbatch; and the once-per-step ops (data-parallel gradient sync, optimizer).
``WorkloadGraph`` records how often each scope repeats, so a step is the template
expanded: every op is still one row with its shapes, FLOPs, bytes and dependencies.

Layout conventions follow Megatron-LM:

* Rank order is tp, cp, dp, pp (tp fastest; expert ranks fold over cp and dp), so a
  group with rank stride ``s`` and size ``n`` has ``min(n, D // s)`` ranks inside one
  NVLink domain of ``D`` GPUs (the node on HGX servers, the rack on NVL72:
  :attr:`ClusterSpec.nvlink_domain`); a collective's ``ranks_per_node`` counts those.
* Tensor parallelism splits heads and FFN columns; each layer does one collective after
  attention and one after the MLP in forward, and their conjugates in backward:
  all-reduce, or with sequence parallelism an all-gather before and a reduce-scatter
  after each block (norms and residual adds then work on ``tokens/tp`` rows).
* Context parallelism splits the sequence; ring attention exchanges K and V with the
  other ``cp - 1`` ranks (an all-gather-sized transfer) in forward and twice that in
  backward (K, V and their gradients).
* Expert parallelism places ``num_experts/ep`` experts per rank; tokens travel by
  all-to-all before and after the experts, in both passes. Routing is assumed balanced.
* Data-parallel gradients are synchronised over the ``dp*cp`` ranks (expert weights over
  ``dp*cp/ep``): an all-reduce with ZeRO 0, a reduce-scatter plus a parameter
  all-gather with ZeRO 1-2; ZeRO 3 also gathers every layer's weights in forward and
  backward. Gradients travel in 16 bits (32 for fp32 runs).
* LoRA adds rank-``r`` adapters to the attention projections (QKV and output); the base
  weights get no weight-gradient GEMMs, no gradient sync and no optimizer state.
* Recomputation ``full`` replays the layer's forward ops (collectives included) before
  its backward; ``selective`` replays the attention core.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import pandas as pd

from perfcast.data.schema import DType
from perfcast.data.tables import OP_SHAPE_COLUMNS
from perfcast.features.hardware import ClusterSpec
from perfcast.features.model import Activation, ModelSpec, NormType
from perfcast.features.ops import COLLECTIVE_OPS, GEMM_OPS, OpType, op_flops, op_memory_bytes
from perfcast.features.parallel import (
    Finetune,
    ParallelConfig,
    Recompute,
    check_layout,
    padded_vocab_size,
    pipeline_split,
)


class Scope:
    """Where a graph node repeats (the ``scope`` column)."""

    LAYER = "layer"  # once per dense layer on the stage, per microbatch
    MOE_LAYER = "moe_layer"  # once per MoE layer on the stage, per microbatch
    FIRST_STAGE = "first_stage"  # on pipeline stage 0, per microbatch
    LAST_STAGE = "last_stage"  # on the last pipeline stage, per microbatch
    STAGE = "stage"  # on every stage, per microbatch (pipeline transfers)
    STEP = "step"  # once per training step


class Phase:
    """When a node runs (the ``phase`` column)."""

    FORWARD = "fwd"
    RECOMPUTE = "recompute"
    BACKWARD = "bwd"
    STEP = "step"


class Group:
    """Which process group a collective runs in (the ``group`` column)."""

    TP = "tp"
    CP = "cp"
    EP = "ep"
    PP = "pp"
    DP = "dp"
    EXPERT_DP = "edp"
    EMBEDDING = "emb"


SHAPE_COLUMNS = OP_SHAPE_COLUMNS
NODE_COLUMNS = ("node", "name", "scope", "phase", "stream", "group", "overlap_with", "repeat", *SHAPE_COLUMNS)
_DERIVED = {"flops": op_flops, "mem_bytes": op_memory_bytes}
"""Node columns computed from the others: FLOPs and bytes moved to and from device memory."""
_NON_GEMM_SHAPE = ("batch", "rows", "cols", "scalar", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal")
"""Shape fields a vector or attention op's backward keeps from its forward."""
_CONJUGATE = {
    OpType.ALLGATHER: OpType.REDUCESCATTER,
    OpType.REDUCESCATTER: OpType.ALLGATHER,
    OpType.ALLREDUCE: OpType.ALLREDUCE,
    OpType.ALLTOALL: OpType.ALLTOALL,
    OpType.SENDRECV: OpType.SENDRECV,
}


class WorkloadGraph:
    """The op graph of one training step (see the module docstring). Read-only.

    Attributes:
        nodes: one row per op, columns ``NODE_COLUMNS`` plus ``flops`` and ``mem_bytes``
            (bytes moved to and from device memory).
        edges: ``src``, ``dst`` node ids: ``dst`` starts after ``src`` ends.
        dense_layers_per_stage, moe_layers_per_stage: layers on the busiest stage (the
            pipeline rank holding the most layers).
        num_microbatches, pp, vpp: the pipeline schedule's parameters.
        stage_layers: ``(dense, moe)`` layers of each pipeline rank when ranks differ
            (:func:`layers_per_rank`); ``None`` when every rank holds the busiest stage's.

    ``nodes`` and ``edges`` may be given as frames, or (what :func:`build_workload_graph`
    does) as the ``NODE_COLUMNS`` (numpy arrays) and the ``(src, dst)`` pairs: the frames,
    ``flops`` and ``mem_bytes`` are then computed on first access, and :meth:`column` reads
    the arrays without building the frame.
    """

    def __init__(
        self,
        nodes: pd.DataFrame | Mapping[str, np.ndarray],
        edges: pd.DataFrame | Sequence[tuple[int, int]],
        dense_layers_per_stage: int,
        moe_layers_per_stage: int,
        num_microbatches: int,
        pp: int,
        vpp: int,
        stage_layers: tuple[tuple[int, int], ...] | None = None,
    ) -> None:
        if isinstance(nodes, pd.DataFrame):
            self._nodes: pd.DataFrame | None = nodes
            self._columns: dict[str, np.ndarray] = {}
            self.num_nodes = len(nodes)
        else:
            self._nodes, self._columns = None, dict(nodes)
            self.num_nodes = len(self._columns["node"])
        self._edges = edges
        self.dense_layers_per_stage = dense_layers_per_stage
        self.moe_layers_per_stage = moe_layers_per_stage
        self.num_microbatches = num_microbatches
        self.pp = pp
        self.vpp = vpp
        self.stage_layers = stage_layers

    @property
    def nodes(self) -> pd.DataFrame:
        """One row per op (see the class docstring)."""
        if self._nodes is None:
            self._nodes = pd.DataFrame({name: self.column(name) for name in (*NODE_COLUMNS, *_DERIVED)})
        return self._nodes

    @property
    def edges(self) -> pd.DataFrame:
        """``src``, ``dst`` node ids."""
        if not isinstance(self._edges, pd.DataFrame):
            self._edges = pd.DataFrame(self._edges, columns=["src", "dst"], dtype="int64")
        return self._edges

    def column(self, name: str) -> np.ndarray:
        """Node column ``name`` as a numpy array (strings as objects), cached: read it, do not modify it."""
        if name not in self._columns:
            if self._nodes is None and name in _DERIVED:
                self._columns[name] = _DERIVED[name](self._columns)
            else:
                self._columns[name] = self.nodes[name].to_numpy()
        return self._columns[name]

    def scope_multiplicity(self) -> dict[str, int]:
        """Executions of each scope per microbatch on one stage (step scope: per step)."""
        return {
            Scope.LAYER: self.dense_layers_per_stage,
            Scope.MOE_LAYER: self.moe_layers_per_stage,
            Scope.FIRST_STAGE: 1,
            Scope.LAST_STAGE: 1,
            Scope.STAGE: 1,
            Scope.STEP: 1,
        }

    def unique_ops(self) -> tuple[pd.DataFrame, np.ndarray]:
        """Distinct ops (identical shapes predicted once) and each node's row in them."""
        keys = self.nodes.loc[:, list(SHAPE_COLUMNS)].astype(str).agg("|".join, axis=1)
        codes, uniques = pd.factorize(keys)
        first = pd.Series(np.arange(len(codes))).groupby(codes).first().to_numpy()
        ops = self.nodes.iloc[first].loc[:, list(SHAPE_COLUMNS) + ["flops", "mem_bytes"]]
        return ops.reset_index(drop=True), codes

    def total_flops(self) -> float:
        """FLOPs executed by one GPU of the busiest stage in one step."""
        mult = self.nodes["scope"].map(self.scope_multiplicity()).to_numpy(dtype=float)
        per_mb = self.nodes["scope"].ne(Scope.STEP).to_numpy()
        steps = np.where(per_mb, self.num_microbatches, 1.0)
        return float((self.nodes["flops"] * self.nodes["repeat"] * mult * steps).sum())


def group_ranks_per_node(stride: int, size: int, gpus_per_node: int) -> int:
    """Ranks of a process group (rank stride ``stride``, ``size`` ranks) inside one NVLink
    domain of ``gpus_per_node`` GPUs: the most that fit, rounded down to a divisor of
    ``size`` so every domain holds the same share (a 32-rank group over 72-GPU racks at
    stride 4 keeps 16 per rack, as a launcher placing whole groups would)."""
    if size <= 1:
        return 1
    fit = max(1, min(size, gpus_per_node // max(stride, 1)))
    return max(d for d in range(1, fit + 1) if size % d == 0)


def group_placement(parallel: ParallelConfig, nvlink_domain: int) -> dict[str, tuple[int, int]]:
    """Each process group's (ranks, ranks inside one NVLink domain) under Megatron's rank
    order (tp innermost, then cp, dp with expert ranks folded over it, pp outermost).

    ``pp`` and ``emb`` are point-to-point pairs (neighbouring stages; first and last
    stage), inside one domain when the ranks between them fit in it.
    """
    p, d = parallel, nvlink_domain
    dp_ranks = p.dp * p.cp
    edp_ranks = max(1, dp_ranks // p.ep)
    return {
        Group.TP: (p.tp, group_ranks_per_node(1, p.tp, d)),
        Group.CP: (p.cp, group_ranks_per_node(p.tp, p.cp, d)),
        Group.EP: (p.ep, group_ranks_per_node(p.tp * p.cp, p.ep, d)),
        Group.DP: (dp_ranks, group_ranks_per_node(p.tp, dp_ranks, d)),
        Group.EXPERT_DP: (edp_ranks, group_ranks_per_node(p.tp * p.ep, edp_ranks, d)),
        Group.PP: (2 if p.pp > 1 else 1, 2 if p.tp * p.cp * p.dp < d else 1),
        Group.EMBEDDING: (2 if p.pp > 1 else 1, 2 if p.tp * p.cp * p.dp * (p.pp - 1) < d else 1),
    }


def fabric_level(n_ranks: int, ranks_in_domain: int, fabric: str | None) -> str:
    """The links a collective of ``n_ranks`` crosses: ``nvlink`` inside one domain, the
    scale-out ``fabric`` id when each domain holds one rank, both joined by ``+`` otherwise;
    "" for a group of one rank (no communication)."""
    if n_ranks <= 1:
        return ""
    if ranks_in_domain >= n_ranks:
        return "nvlink"
    outside = fabric or "scale-out"
    return outside if ranks_in_domain <= 1 else f"nvlink+{outside}"


class _Builder:
    """Appends nodes in execution order and chains them with edges."""

    def __init__(self, dtype: DType) -> None:
        self.rows: list[dict[str, Any]] = []
        self.edges: list[tuple[int, int]] = []
        self.low_precision = dtype.is_low_precision
        vector_dtype = DType.BF16 if self.low_precision else (DType.FP32 if dtype is DType.TF32 else dtype)
        self.dtype_name, self.vector_dtype_name = dtype.value, vector_dtype.value
        self.last: int | None = None

    def add(self, name: str, scope: str, phase: str, op: OpType, *, chain: bool = True, **fields: Any) -> int:
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
}
"""Node column types: strings, flags, and whole numbers (shapes, ids, counts)."""
_ROW_DEFAULTS: dict[str, Any] = {
    **{name: 0 for name, dtype in _COLUMN_DTYPES.items() if dtype is np.int64},
    **{name: False for name in _FLAG_COLUMNS},
    "group": "",
    "overlap_with": -1,
    "repeat": 1,
}
"""Fields of a node that ``_Builder.add`` is not given: shapes a node does not have are 0, flags False."""
_NODE_FIELDS = itemgetter(*NODE_COLUMNS)
_OP_INFO = {
    op: (op.value, "comm" if op in COLLECTIVE_OPS else "compute", op in GEMM_OPS or op is OpType.ATTENTION)
    for op in OpType
}
"""Per op: its name, its stream, and whether it runs in the config's dtype (GEMMs, attention) or the vector dtype."""
_OP_BY_NAME = {op.value: op for op in OpType}
QUANTIZED_GEMMS = frozenset({"attn.qkv", "attn.out", "mlp.up", "mlp.down", "moe.up", "moe.down"})
"""GEMMs (with their dgrad, wgrad and recompute) that run in a low-precision run's dtype (fp8, mxfp8,
nvfp4, mxfp4): the transformer layers' linear projections. The attention core, LM head, MoE router
and LoRA adapters stay bf16, as in Transformer Engine and torchao float8 training."""


def _quantized_gemm(name: str) -> bool:
    """Whether GEMM node ``name`` is (derived from) one of :data:`QUANTIZED_GEMMS`."""
    return ".".join(name.split(".")[:2]) in QUANTIZED_GEMMS and ".lora_" not in name


@dataclass(frozen=True)
class _Ctx:
    """Per-rank tensor sizes of one microbatch."""

    tokens: int  # tokens per rank per microbatch (micro_batch * seq_len / cp)
    hidden: int  # model width
    vec_rows: int  # rows of norms and residual adds (tokens / tp with sequence parallelism)
    act_bytes: int  # bytes per activation element
    tp: int
    sp: bool
    tp_rpn: int


def build_workload_graph(model: ModelSpec, parallel: ParallelConfig, cluster: ClusterSpec) -> WorkloadGraph:
    """Expand a config into the op graph of one training step.

    Raises:
        SpecError: the layout does not fit the model or cluster (see ``check_layout``).
    """
    check_layout(model, parallel, cluster)
    p, g = parallel, cluster.nvlink_domain
    sp = p.sequence_parallel and p.tp > 1
    tokens = p.micro_batch * model.seq_len // p.cp
    ctx = _Ctx(
        tokens=tokens,
        hidden=model.hidden_size,
        vec_rows=tokens // p.tp if sp else tokens,
        act_bytes=max(p.dtype.bytes_per_element, 2),
        tp=p.tp,
        sp=sp,
        tp_rpn=group_placement(p, g)[Group.TP][1],
    )
    b = _Builder(p.dtype)

    ranks = layers_per_rank(model, p)
    dense_layers, moe_layers = busiest_rank_layers(ranks)
    even = len(set(ranks)) == 1
    _add_embedding_forward(b, model, p, ctx)
    dense_fwd = _add_layer_forward(b, model, p, ctx, g, moe=False) if any(d for d, _ in ranks) else []
    moe_fwd = _add_layer_forward(b, model, p, ctx, g, moe=True) if any(m for _, m in ranks) else []
    head_fwd = _add_head_forward(b, model, p, ctx)
    _add_pipeline_transfer(b, p, ctx, g, Phase.FORWARD)
    _add_backward(b, head_fwd, p)
    if ctx.tp > 1 and not ctx.sp:  # the LM head's input copy (Megatron's f): identity forward, all-reduce backward
        b.add(
            "head.tp_copy.bwd",
            Scope.LAST_STAGE,
            Phase.BACKWARD,
            OpType.ALLREDUCE,
            group=Group.TP,
            bytes=ctx.tokens * ctx.hidden * ctx.act_bytes,
            n_ranks=ctx.tp,
            ranks_per_node=ctx.tp_rpn,
        )
    for fwd in (moe_fwd, dense_fwd):
        if fwd:
            _add_recompute(b, fwd, p)
            _add_backward(b, fwd, p)
    _add_pipeline_transfer(b, p, ctx, g, Phase.BACKWARD)
    _add_embedding_backward(b, model, p, ctx)
    _add_step_ops(b, model, p, cluster)

    return WorkloadGraph(
        nodes=b.columns(),
        edges=b.edges,
        dense_layers_per_stage=dense_layers,
        moe_layers_per_stage=moe_layers,
        num_microbatches=p.num_microbatches,
        pp=p.pp,
        vpp=p.vpp,
        stage_layers=None if even else ranks,
    )


def layers_per_rank(model: ModelSpec, parallel: ParallelConfig) -> tuple[tuple[int, int], ...]:
    """``(dense, moe)`` transformer layers of each pipeline rank, rank 0 first.

    A rank holds the layers :func:`~perfcast.features.parallel.pipeline_split` gives it,
    ``n`` in all; of those, ``ceil(n * num_moe_layers / num_layers)`` are MoE layers (the
    model's MoE share, rounded up: the busier case), the rest dense.

    Raises:
        SpecError: the layout's pipeline split does not fit the model.
    """
    moe, total = model.num_moe_layers if model.is_moe else 0, model.num_layers
    return tuple((n - -(-n * moe // total), -(-n * moe // total)) for n in pipeline_split(total, parallel).rank_layers)


def busiest_rank_layers(ranks: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The ``(dense, moe)`` layers of the rank holding the most layers (the first of equals)."""
    return max(ranks, key=sum)


def body_structure_key(parallel: ParallelConfig, gpus_per_node: int) -> tuple[Any, ...]:
    """What a graph's per-microbatch nodes (all but the ``step`` scope) depend on besides the
    model, apart from ``vpp`` and ``recompute`` (:func:`body_variant` applies those): configs
    of one model with equal keys, ``vpp`` and ``recompute`` have identical such nodes, layer
    counts and ``pp``.

    The data-parallel degree, ZeRO stage, global batch and GPU type only change the
    once-per-step nodes (:func:`build_step_ops`) and the number of microbatches, except
    where they reach the layers: ZeRO-3's per-layer weight gathers and whether a pipeline
    transfer stays inside a node.
    """
    p = parallel
    zero3_ranks = p.dp * p.cp if p.zero_stage == 3 and p.dp * p.cp > 1 else 0
    same_node = p.pp > 1 and group_placement(p, gpus_per_node)[Group.PP][1] == 2
    return (p.tp, p.pp, p.cp, p.ep, p.micro_batch, p.sequence_parallel, p.finetune, p.lora_rank, p.dtype,
            p.flash_attention, gpus_per_node, zero3_ranks, same_node, *pipeline_split_key(p))  # fmt: skip


def pipeline_split_key(parallel: ParallelConfig) -> tuple[Any, ...]:
    """The stated uneven-pipeline switches: with the model, ``pp`` and ``vpp`` they fix the
    layers of each stage (:func:`~perfcast.features.parallel.pipeline_split`)."""
    p = parallel
    return (p.account_for_embedding_in_pipeline_split, p.account_for_loss_in_pipeline_split, p.first_stage_layers,
            p.last_stage_layers)  # fmt: skip


def replayed_nodes(nodes: Mapping[str, np.ndarray], recompute: Recompute) -> np.ndarray:
    """Rows of ``nodes`` (a graph's nodes, built without recomputation) that ``recompute``
    replays before each layer's backward (see :func:`_add_recompute`)."""
    if recompute is Recompute.NONE:
        return np.zeros(0, dtype=np.int64)
    replay = (nodes["phase"] == Phase.FORWARD) & np.isin(nodes["scope"], [Scope.LAYER, Scope.MOE_LAYER])
    names = nodes["name"]
    replay &= (names != "zero3.param_gather") & (nodes["group"] != Group.CP)  # still at hand
    if recompute is Recompute.SELECTIVE:
        replay &= np.array([name.startswith("attn.core") for name in names], dtype=bool)
    return np.flatnonzero(replay)


def body_variant(
    nodes: Mapping[str, np.ndarray], vpp: int, replayed: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The per-microbatch nodes of the same config with ``vpp`` and the recomputation that
    replays rows ``replayed`` (:func:`replayed_nodes`), as rows of ``nodes`` and the columns
    that differ from those rows.

    ``nodes`` are the non-step nodes of a graph built with ``recompute="none"`` (any
    ``vpp``). ``vpp`` only sets how often each pipeline transfer repeats; the replayed
    nodes (which :func:`build_workload_graph` puts before each layer's backward) are
    appended at the end: the same nodes, in another order.

    Returns:
        ``source``: the variant's nodes as rows of ``nodes`` (all of them, then the
        replayed ones); and its ``repeat``, ``phase`` and ``overlap_with`` columns. Other
        columns are those of ``source`` (replayed names aside, which gain ``.recompute``).
    """
    n, k = len(nodes["node"]), len(replayed)
    repeat = np.where(nodes["group"] == Group.PP, vpp, nodes["repeat"])
    return np.concatenate([np.arange(n), replayed]), {
        "repeat": np.concatenate([repeat, repeat[replayed]]),
        "phase": np.concatenate([nodes["phase"], np.full(k, Phase.RECOMPUTE, dtype=object)]),
        "overlap_with": np.concatenate([nodes["overlap_with"], np.full(k, -1, dtype=np.int64)]),
    }


def step_ops_key(parallel: ParallelConfig, gpus_per_node: int) -> tuple[Any, ...]:
    """What :func:`build_step_ops` depends on besides the model: configs of one model with
    equal keys have identical step nodes."""
    p = parallel
    return (p.tp, p.pp, p.cp, p.ep, p.dp, p.zero_stage, p.dtype, p.finetune, p.lora_rank, gpus_per_node, p.vpp,
            *pipeline_split_key(p))  # fmt: skip


def build_step_ops(model: ModelSpec, parallel: ParallelConfig, cluster: ClusterSpec) -> dict[str, np.ndarray]:
    """The once-per-step nodes of the config's graph (gradient sync, optimizer), as ``NODE_COLUMNS`` arrays.

    They equal the ``step``-scope rows that :func:`build_workload_graph` appends last,
    numbered from 0 (no step node overlaps another node).
    """
    b = _Builder(parallel.dtype)
    _add_step_ops(b, model, parallel, cluster)
    return b.columns()


def _norm_op(model: ModelSpec) -> OpType:
    return OpType.RMSNORM if model.norm is NormType.RMSNORM else OpType.LAYERNORM


def _activation_op(model: ModelSpec) -> OpType:
    return {Activation.GELU: OpType.GELU, Activation.SILU: OpType.SILU, Activation.RELU: OpType.RELU}[model.activation]


def _gemm_op(model: ModelSpec, batch: int = 1) -> OpType:
    if batch > 1:
        return OpType.BMM
    return OpType.LINEAR if model.bias else OpType.MATMUL


def _tp_collective(b: _Builder, name: str, scope: str, ctx: _Ctx, op: OpType) -> None:
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


def _add_embedding_forward(b: _Builder, model: ModelSpec, p: ParallelConfig, ctx: _Ctx) -> None:
    b.add("embedding", Scope.FIRST_STAGE, Phase.FORWARD, OpType.EMBEDDING, rows=ctx.tokens, cols=model.hidden_size)
    _tp_collective(b, "embedding.tp", Scope.FIRST_STAGE, ctx, OpType.REDUCESCATTER if ctx.sp else OpType.ALLREDUCE)


def _add_layer_forward(
    b: _Builder, model: ModelSpec, p: ParallelConfig, ctx: _Ctx, gpus_per_node: int, *, moe: bool
) -> list[int]:
    """Forward ops of one layer; returns their node ids in order."""
    scope = Scope.MOE_LAYER if moe else Scope.LAYER
    h, t, tp = model.hidden_size, ctx.tokens, p.tp
    heads, kv = model.num_heads // tp, max(1, model.kv_heads // tp)
    hd = model.head_size
    first = len(b.rows)
    gemm = _gemm_op(model)

    b.add("attn.norm", scope, Phase.FORWARD, _norm_op(model), rows=ctx.vec_rows, cols=h)
    if ctx.sp:
        _tp_collective(b, "attn.tp_gather", scope, ctx, OpType.ALLGATHER)
    if p.zero_stage == 3 and p.dp * p.cp > 1:
        layer_params = model.attention_params_per_layer + (
            model.moe_params_per_layer if moe else model.mlp_params_per_layer
        )
        b.add(
            "zero3.param_gather",
            scope,
            Phase.FORWARD,
            OpType.ALLGATHER,
            group=Group.DP,
            bytes=layer_params // tp * _grad_bytes(p),
            n_ranks=p.dp * p.cp,
            ranks_per_node=group_placement(p, gpus_per_node)[Group.DP][1],
        )
    qkv = b.add("attn.qkv", scope, Phase.FORWARD, gemm, batch=1, m=t, k=h, n=(heads + 2 * kv) * hd)
    if p.finetune is Finetune.LORA:
        _add_lora(b, scope, "attn.qkv", t, h, (heads + 2 * kv) * hd, p.lora_rank)
    attn_id = len(b.rows) + (1 if p.cp > 1 else 0)
    if p.cp > 1:
        kv_bytes = 2 * p.micro_batch * (model.seq_len // p.cp) * kv * hd * ctx.act_bytes
        b.add(
            "attn.cp_exchange",
            scope,
            Phase.FORWARD,
            OpType.ALLGATHER,
            chain=False,
            group=Group.CP,
            overlap_with=attn_id,
            bytes=kv_bytes * p.cp,
            n_ranks=p.cp,
            ranks_per_node=group_placement(p, gpus_per_node)[Group.CP][1],
        )
        b.edges.append((qkv, len(b.rows) - 1))
        b.edges.append((len(b.rows) - 1, attn_id))
    _add_attention_core(b, scope, model, p, heads, kv)
    b.add("attn.out", scope, Phase.FORWARD, gemm, batch=1, m=t, k=heads * hd, n=h)
    if p.finetune is Finetune.LORA:
        _add_lora(b, scope, "attn.out", t, heads * hd, h, p.lora_rank)
    _tp_collective(b, "attn.tp_reduce", scope, ctx, OpType.REDUCESCATTER if ctx.sp else OpType.ALLREDUCE)
    b.add("attn.residual", scope, Phase.FORWARD, OpType.ADD, rows=ctx.vec_rows, cols=h)
    b.add("mlp.norm", scope, Phase.FORWARD, _norm_op(model), rows=ctx.vec_rows, cols=h)
    if ctx.sp:
        _tp_collective(b, "mlp.tp_gather", scope, ctx, OpType.ALLGATHER)
    if moe:
        _add_experts(b, model, p, ctx, gpus_per_node)
    else:
        f = model.ffn_size // tp
        b.add("mlp.up", scope, Phase.FORWARD, gemm, batch=1, m=t, k=h, n=f * (2 if model.gated_mlp else 1))
        b.add("mlp.act", scope, Phase.FORWARD, _activation_op(model), rows=t, cols=f)
        if model.gated_mlp:
            b.add("mlp.gate_mul", scope, Phase.FORWARD, OpType.MUL, rows=t, cols=f)
        b.add("mlp.down", scope, Phase.FORWARD, gemm, batch=1, m=t, k=f, n=h)
    _tp_collective(b, "mlp.tp_reduce", scope, ctx, OpType.REDUCESCATTER if ctx.sp else OpType.ALLREDUCE)
    b.add("mlp.residual", scope, Phase.FORWARD, OpType.ADD, rows=ctx.vec_rows, cols=h)
    return list(range(first, len(b.rows)))


def _add_attention_core(b: _Builder, scope: str, model: ModelSpec, p: ParallelConfig, heads: int, kv: int) -> None:
    """Scores, softmax and context of one layer: one fused op, or three unfused ones.

    Unfused (``flash_attention=False``), K and V are broadcast to every query head and
    the full score matrix is computed and normalised in memory, causal mask or not.
    """
    s_q, s_kv, hd = model.seq_len // p.cp, model.seq_len, model.head_size
    if p.flash_attention:
        b.add(
            "attn.core",
            scope,
            Phase.FORWARD,
            OpType.ATTENTION,
            batch=p.micro_batch,
            heads=heads,
            kv_heads=kv,
            seq_q=s_q,
            seq_kv=s_kv,
            head_dim=hd,
            causal=True,
        )
        return
    batch = p.micro_batch * heads
    b.add("attn.core.scores", scope, Phase.FORWARD, OpType.BMM, batch=batch, m=s_q, k=hd, n=s_kv)
    b.add("attn.core.softmax", scope, Phase.FORWARD, OpType.SOFTMAX, rows=batch * s_q, cols=s_kv)
    b.add("attn.core.context", scope, Phase.FORWARD, OpType.BMM, batch=batch, m=s_q, k=s_kv, n=hd)


def _add_lora(b: _Builder, scope: str, base: str, tokens: int, d_in: int, d_out: int, rank: int) -> None:
    b.add(f"{base}.lora_a", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=tokens, k=d_in, n=rank)
    b.add(f"{base}.lora_b", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=tokens, k=rank, n=d_out)


def _add_experts(b: _Builder, model: ModelSpec, p: ParallelConfig, ctx: _Ctx, gpus_per_node: int) -> None:
    scope, h, t = Scope.MOE_LAYER, model.hidden_size, ctx.tokens
    local = model.num_experts // p.ep
    routed = t * model.top_k  # token copies this rank processes after dispatch (balanced routing)
    per_expert = -(-routed // local)
    f = model.expert_ffn_size // p.tp
    ep_rpn = group_placement(p, gpus_per_node)[Group.EP][1]

    def alltoall(name: str) -> None:
        """Token exchange with the other expert-parallel ranks (dispatch or combine)."""
        if p.ep > 1:
            b.add(name, scope, Phase.FORWARD, OpType.ALLTOALL, group=Group.EP, bytes=routed * h * ctx.act_bytes,
                  n_ranks=p.ep, ranks_per_node=ep_rpn)  # fmt: skip

    b.add("moe.router", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=t, k=h, n=model.num_experts)
    b.add("moe.router_softmax", scope, Phase.FORWARD, OpType.SOFTMAX, rows=t, cols=model.num_experts)
    alltoall("moe.dispatch")
    gemm = _gemm_op(model, local)
    b.add("moe.up", scope, Phase.FORWARD, gemm, batch=local, m=per_expert, k=h, n=f * (2 if model.gated_mlp else 1))
    b.add("moe.act", scope, Phase.FORWARD, _activation_op(model), rows=routed, cols=f)
    if model.gated_mlp:
        b.add("moe.gate_mul", scope, Phase.FORWARD, OpType.MUL, rows=routed, cols=f)
    b.add("moe.down", scope, Phase.FORWARD, gemm, batch=local, m=per_expert, k=f, n=h)
    alltoall("moe.combine")


def _add_head_forward(b: _Builder, model: ModelSpec, p: ParallelConfig, ctx: _Ctx) -> list[int]:
    first = len(b.rows)
    scope, h, t = Scope.LAST_STAGE, model.hidden_size, ctx.tokens
    vocab = padded_vocab_size(model, p.tp) // p.tp
    b.add("head.norm", scope, Phase.FORWARD, _norm_op(model), rows=ctx.vec_rows, cols=h)
    if ctx.sp:
        _tp_collective(b, "head.tp_gather", scope, ctx, OpType.ALLGATHER)
    b.add("head.logits", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=t, k=h, n=vocab)
    b.add("head.loss", scope, Phase.FORWARD, OpType.SOFTMAX, rows=t, cols=vocab)
    return list(range(first, len(b.rows)))


def _add_pipeline_transfer(b: _Builder, p: ParallelConfig, ctx: _Ctx, gpus_per_node: int, phase: str) -> None:
    if p.pp == 1:
        return
    same_node = group_placement(p, gpus_per_node)[Group.PP][1] == 2
    b.add(
        f"pp.{phase}_send",
        Scope.STAGE,
        phase,
        OpType.SENDRECV,
        group=Group.PP,
        repeat=p.vpp,
        bytes=ctx.vec_rows * ctx.hidden * ctx.act_bytes,
        n_ranks=2,
        ranks_per_node=2 if same_node else 1,
    )


def _add_backward(b: _Builder, fwd_ids: list[int], p: ParallelConfig) -> None:
    """Append the backward ops of ``fwd_ids`` in reverse order."""
    bwd_of: dict[int, int] = {}
    for node in reversed(fwd_ids):
        row = b.rows[node]
        op = _OP_BY_NAME[row["op"]]
        name, scope = row["name"], row["scope"]
        if name.endswith(".quantize"):  # a cast has no backward; the dgrad quantizes its own input
            continue
        bwd_of[node] = len(b.rows)
        if op in GEMM_OPS:
            batch, m, n, k = row["batch"], row["m"], row["n"], row["k"]
            plain = OpType.BMM if batch > 1 else OpType.MATMUL
            b.add(f"{name}.dgrad", scope, Phase.BACKWARD, plain, batch=batch, m=m, n=k, k=n)
            # Under LoRA only the adapters learn; the unfused attention-core GEMMs have no
            # weights, their second gradient is dK or dV.
            frozen = p.finetune is Finetune.LORA and ".lora_" not in name and not name.startswith("attn.core")
            if not frozen:
                b.add(f"{name}.wgrad", scope, Phase.BACKWARD, plain, batch=batch, m=k, n=n, k=m)
        elif op in COLLECTIVE_OPS:
            comm = {k: row[k] for k in ("group", "n_ranks", "ranks_per_node")}
            if row["group"] == Group.CP:  # K/V and their gradients travel beside the attention backward
                b.add(
                    f"{name}.bwd",
                    scope,
                    Phase.BACKWARD,
                    op,
                    chain=False,
                    bytes=2 * row["bytes"],
                    overlap_with=bwd_of[row["overlap_with"]],
                    **comm,
                )
                b.edges.append((b.last, len(b.rows) - 1))
            elif name == "zero3.param_gather":  # weights are gathered again for the backward
                b.add(f"{name}.bwd", scope, Phase.BACKWARD, op, bytes=row["bytes"], **comm)
            else:
                b.add(f"{name}.bwd", scope, Phase.BACKWARD, _CONJUGATE[op], bytes=row["bytes"], **comm)
        else:
            shape = {k: row[k] for k in _NON_GEMM_SHAPE if k in row}
            b.add(f"{name}.bwd", scope, Phase.BACKWARD, op, backward=True, **shape)


def _add_recompute(b: _Builder, fwd_ids: list[int], p: ParallelConfig) -> None:
    if p.recompute is Recompute.NONE:
        return
    for node in fwd_ids:
        row = dict(b.rows[node])
        if p.recompute is Recompute.SELECTIVE and not row["name"].startswith("attn.core"):
            continue
        if row["name"] == "zero3.param_gather" or row["group"] == Group.CP:
            continue  # weights and K/V of the forward are still at hand
        fields = {k: v for k, v in row.items() if k not in ("node", "name", "scope", "phase", "stream", "op", "dtype")}
        fields["overlap_with"] = -1
        b.add(f"{row['name']}.recompute", row["scope"], Phase.RECOMPUTE, _OP_BY_NAME[row["op"]], **fields)


def _add_embedding_backward(b: _Builder, model: ModelSpec, p: ParallelConfig, ctx: _Ctx) -> None:
    scope = Scope.FIRST_STAGE
    if ctx.sp:  # the reduce-scatter after the lookup turns into an all-gather
        b.add(
            "embedding.tp.bwd",
            scope,
            Phase.BACKWARD,
            OpType.ALLGATHER,
            group=Group.TP,
            bytes=ctx.tokens * model.hidden_size * ctx.act_bytes,
            n_ranks=ctx.tp,
            ranks_per_node=ctx.tp_rpn,
        )
    if p.finetune.trains_all_weights:
        b.add(
            "embedding.bwd",
            scope,
            Phase.BACKWARD,
            OpType.EMBEDDING,
            backward=True,
            rows=ctx.tokens,
            cols=model.hidden_size,
        )


def _grad_bytes(p: ParallelConfig) -> int:
    return 4 if p.dtype in (DType.FP32, DType.TF32) else 2


def trainable_params_per_rank(
    model: ModelSpec, p: ParallelConfig, *, finetune: Finetune | None = None, rank: int | None = None
) -> tuple[int, int]:
    """(non-expert, expert) trainable parameters one GPU of a pipeline stage holds.

    ``rank=None`` is the busiest stage. When every rank holds the same layers, that is
    the first stage with the input embedding (also the last when ``pp == 1``); with
    untied embeddings and ``pp > 1`` the last stage's LM head is usually as large, and the
    maximum of the two is taken. When ranks differ (:func:`layers_per_rank`) it is the
    rank with the most parameters, its own embedding or LM head included. ``rank`` picks
    pipeline rank ``rank`` instead. ``finetune`` overrides the layout's
    (``Finetune.FULL``: all parameters of the rank).
    """
    ranks = layers_per_rank(model, p)
    if rank is None and len(set(ranks)) > 1:
        per_rank = [trainable_params_per_rank(model, p, finetune=finetune, rank=r) for r in range(p.pp)]
        return max(per_rank, key=sum)
    dense_layers, moe_layers = ranks[rank] if rank is not None else ranks[0]
    if (finetune or p.finetune) is Finetune.LORA:
        qkv_out = model.head_size * (model.num_heads + 2 * model.kv_heads)
        per_layer = p.lora_rank * (model.hidden_size + qkv_out) + p.lora_rank * (
            model.head_size * model.num_heads + model.hidden_size
        )
        return per_layer * (dense_layers + moe_layers) // p.tp, 0
    dense = dense_layers * (model.attention_params_per_layer + model.mlp_params_per_layer + model.norm_params_per_layer)
    moe_shared = moe_layers * (model.attention_params_per_layer + model.norm_params_per_layer)
    experts = moe_layers * model.moe_params_per_layer
    vocab_rows = padded_vocab_size(model, p.tp) * model.hidden_size
    first = model.embedding_params - model.vocab_size * model.hidden_size + vocab_rows
    last = 0 if model.tied_embeddings and p.pp == 1 else vocab_rows
    if rank is None:
        ends = first + last if p.pp == 1 else max(first, last)
    else:
        ends = (first if rank == 0 else 0) + (last if rank == p.pp - 1 else 0)
    return (dense + moe_shared + ends) // p.tp, experts // (p.tp * p.ep)


def _add_step_ops(b: _Builder, model: ModelSpec, p: ParallelConfig, cluster: ClusterSpec) -> None:
    g = cluster.nvlink_domain
    dense, expert = trainable_params_per_rank(model, p)
    gb = _grad_bytes(p)
    dp_ranks = p.dp * p.cp
    edp_ranks = dp_ranks // p.ep
    placement = group_placement(p, g)
    groups = [(Group.DP, dense, dp_ranks, placement[Group.DP][1])]
    if expert:
        groups.append((Group.EXPERT_DP, expert, edp_ranks, placement[Group.EXPERT_DP][1]))
    for group, params, ranks, rpn in groups:
        if ranks <= 1 or params == 0:
            continue
        if p.zero_stage == 0:
            syncs = [("grad_allreduce", OpType.ALLREDUCE)]
        else:  # sharded gradients; below ZeRO-3 the updated parameter shards are gathered back
            syncs = [("grad_reducescatter", OpType.REDUCESCATTER)]
            syncs += [("param_allgather", OpType.ALLGATHER)] if p.zero_stage < 3 else []
        for name, op in syncs:
            b.add(f"{group}.{name}", Scope.STEP, Phase.STEP, op, group=group, bytes=params * gb, n_ranks=ranks,
                  ranks_per_node=rpn)  # fmt: skip
    if model.tied_embeddings and p.pp > 1 and p.finetune.trains_all_weights:
        rpn = placement[Group.EMBEDDING][1]
        b.add(
            "embedding.grad_sync",
            Scope.STEP,
            Phase.STEP,
            OpType.ALLREDUCE,
            group=Group.EMBEDDING,
            bytes=padded_vocab_size(model, p.tp) // p.tp * model.hidden_size * gb,
            n_ranks=2,
            ranks_per_node=rpn,
        )
    shards = dp_ranks if p.zero_stage >= 1 else 1
    owned = dense // shards + (expert // max(1, edp_ranks if p.zero_stage >= 1 else 1))
    b.add("optimizer", Scope.STEP, Phase.STEP, OpType.OPTIMIZER, rows=1, cols=owned)
