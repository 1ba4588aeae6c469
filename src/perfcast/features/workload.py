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
  backward (a rank's own routed experts over the expert-data-parallel ranks only).
  Gradients travel in 16 bits (32 for fp32 runs).
* LoRA adds rank-``r`` adapters to the attention projections (QKV and output); the base
  weights get no weight-gradient GEMMs, no gradient sync and no optimizer state.
* Recomputation ``full`` replays the layer's forward ops (collectives included) before
  its backward; ``selective`` replays the attention core.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from perfcast.data.schema import DType
from perfcast.features.cluster import ClusterSpec
from perfcast.features.graph import (  # noqa: F401 (re-exported)
    NODE_COLUMNS,
    SHAPE_COLUMNS,
    Phase,
    Scope,
    WorkloadGraph,
)
from perfcast.features.model import Activation, ModelSpec, NormType
from perfcast.features.ops import COLLECTIVE_OPS, GEMM_OPS, OpType
from perfcast.features.parallel import Finetune, ParallelConfig, Recompute, check_layout, padded_vocab_size
from perfcast.features.placement import (  # noqa: F401 (re-exported: the graph's group names and placement)
    EXPERT_TP,
    Group,
    fabric_level,
    group_placement,
    group_ranks_per_node,
)
from perfcast.features.stage_layers import (  # noqa: F401 (re-exported)
    busiest_rank_layers,
    layers_per_rank,
    trainable_params_per_rank,
)

OVERLAP_PREVIOUS_LAYER = -2
"""``overlap_with`` of a prefetched ZeRO-3 weight gather (``fsdp_prefetch``): it runs beside the
compute of the previous layer of its scope in its pass, and only the first layer's is exposed
whole (the rule is in :mod:`perfcast.features.schedule`). Other nodes hold -1 (exposed) or the
id of the node that hides them."""
TP_OVERLAP_GEMMS = {"attn.tp_gather": "attn.qkv", "attn.tp_reduce": "attn.out", "mlp.tp_gather": "mlp.up",
                    "mlp.tp_reduce": "mlp.down"}  # fmt: skip
"""Under ``tp_comm_overlap`` (sequence parallelism), the GEMM of a dense layer each tensor-parallel
collective overlaps in forward: an all-gather the column-parallel GEMM it feeds, a reduce-scatter
the row-parallel GEMM it follows. In backward the conjugate of an all-gather (the reduce-scatter
of the dgrad output) overlaps that GEMM's wgrad (its dgrad where the weight is frozen), the
conjugate of a reduce-scatter its dgrad; a replay under recomputation overlaps the replayed
GEMM. The MoE block, the LM head and the embedding keep their collectives exposed."""
_NON_GEMM_SHAPE = ("batch", "rows", "cols", "scalar", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal")
"""Shape fields a vector or attention op's backward keeps from its forward."""
_CONJUGATE = {
    OpType.ALLGATHER: OpType.REDUCESCATTER,
    OpType.REDUCESCATTER: OpType.ALLGATHER,
    OpType.ALLREDUCE: OpType.ALLREDUCE,
    OpType.ALLTOALL: OpType.ALLTOALL,
    OpType.SENDRECV: OpType.SENDRECV,
}


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


def body_structure_key(parallel: ParallelConfig, gpus_per_node: int) -> tuple[Any, ...]:
    """What a graph's per-microbatch nodes (all but the ``step`` scope) depend on besides the
    model, apart from ``vpp`` and ``recompute`` (:func:`body_variant` applies those): configs
    of one model with equal keys, ``vpp`` and ``recompute`` have identical such nodes, layer
    counts and ``pp``.

    The data-parallel degree, ZeRO stage, global batch and GPU type only change the
    once-per-step nodes (:func:`build_step_ops`) and the number of microbatches, except
    where they reach the layers: ZeRO-3's per-layer weight gathers and whether a pipeline
    transfer stays inside a node. The framework switches that set ``overlap_with``
    (``tp_comm_overlap`` with sequence parallelism, ``fsdp_prefetch`` under ZeRO-3) are
    part of the key.
    """
    p = parallel
    zero3_ranks = p.dp * p.cp if p.zero_stage == 3 and p.dp * p.cp > 1 else 0
    same_node = p.pp > 1 and group_placement(p, gpus_per_node)[Group.PP][1] == 2
    overlaps = (p.tp_comm_overlap and p.sequence_parallel and p.tp > 1, p.fsdp_prefetch and zero3_ranks > 0)
    return (p.tp, p.pp, p.cp, p.ep, p.etp, p.micro_batch, p.sequence_parallel, p.finetune, p.lora_rank, p.dtype,
            p.flash_attention, gpus_per_node, zero3_ranks, same_node, *pipeline_split_key(p), *overlaps)  # fmt: skip


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
    replay_of = np.full(n, -1, dtype=np.int64)  # a replayed node's overlap partner is its partner's replay
    replay_of[replayed] = n + np.arange(k)
    target = nodes["overlap_with"][replayed].astype(np.int64)
    return np.concatenate([np.arange(n), replayed]), {
        "repeat": np.concatenate([repeat, repeat[replayed]]),
        "phase": np.concatenate([nodes["phase"], np.full(k, Phase.RECOMPUTE, dtype=object)]),
        "overlap_with": np.concatenate([nodes["overlap_with"], np.where(target >= 0, replay_of[target], -1)]),
    }


def step_ops_key(parallel: ParallelConfig, gpus_per_node: int) -> tuple[Any, ...]:
    """What :func:`build_step_ops` depends on besides the model: configs of one model with
    equal keys have identical step nodes."""
    p = parallel
    return (p.tp, p.pp, p.cp, p.ep, p.etp, p.dp, p.zero_stage, p.dtype, p.finetune, p.lora_rank, gpus_per_node,
            p.vpp, *pipeline_split_key(p))  # fmt: skip


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
        b.add(
            "zero3.param_gather",
            scope,
            Phase.FORWARD,
            OpType.ALLGATHER,
            overlap_with=OVERLAP_PREVIOUS_LAYER if p.fsdp_prefetch else -1,
            group=Group.DP,
            bytes=round(_zero3_gather_params(model, p, moe=moe)) * _grad_bytes(p),
            n_ranks=p.dp * p.cp,
            ranks_per_node=group_placement(p, gpus_per_node)[Group.DP][1],
        )
    if model.mla is None:
        qkv = b.add("attn.qkv", scope, Phase.FORWARD, gemm, batch=1, m=t, k=h, n=(heads + 2 * kv) * hd)
    else:
        qkv = _add_latent_qkv(b, model, scope, t, heads)
    if p.finetune is Finetune.LORA:
        _add_lora(b, scope, "attn.qkv", t, h, (heads + 2 * kv) * hd, p.lora_rank)
    attn_id = len(b.rows) + (1 if p.cp > 1 else 0)
    if p.cp > 1:
        kv_width = kv * (model.qk_head_size + model.v_head_size)  # K and V of the rank's heads
        kv_bytes = p.micro_batch * (model.seq_len // p.cp) * kv_width * ctx.act_bytes
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
    b.add("attn.out", scope, Phase.FORWARD, gemm, batch=1, m=t, k=heads * model.v_head_size, n=h)
    if p.finetune is Finetune.LORA:
        _add_lora(b, scope, "attn.out", t, heads * hd, h, p.lora_rank)
    _tp_collective(b, "attn.tp_reduce", scope, ctx, OpType.REDUCESCATTER if ctx.sp else OpType.ALLREDUCE)
    b.add("attn.residual", scope, Phase.FORWARD, OpType.ADD, rows=ctx.vec_rows, cols=h)
    b.add("mlp.norm", scope, Phase.FORWARD, _norm_op(model), rows=ctx.vec_rows, cols=h)
    # With etp != tp the routed experts take the rank's 1/tp share of the tokens (Megatron-Core
    # runs MoE layers sequence-parallel); the layer's tp collectives then serve the shared
    # experts, or rebuild the replicated activations without sequence parallelism.
    mlp_tp = not moe or p.etp == p.tp or not ctx.sp or model.num_shared_experts > 0
    if ctx.sp and mlp_tp:
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
    if mlp_tp:
        _tp_collective(b, "mlp.tp_reduce", scope, ctx, OpType.REDUCESCATTER if ctx.sp else OpType.ALLREDUCE)
    b.add("mlp.residual", scope, Phase.FORWARD, OpType.ADD, rows=ctx.vec_rows, cols=h)
    ids = list(range(first, len(b.rows)))
    if p.tp_comm_overlap and ctx.sp:
        _overlap_tp_forward(b, ids)
    return ids


def _add_attention_core(b: _Builder, scope: str, model: ModelSpec, p: ParallelConfig, heads: int, kv: int) -> None:
    """Scores, softmax and context of one layer: one fused op, or three unfused ones.

    Unfused (``flash_attention=False``), K and V are broadcast to every query head and
    the full score matrix is computed and normalised in memory, causal mask or not.
    """
    s_q, s_kv = model.seq_len // p.cp, model.seq_len
    hd = (model.qk_head_size + model.v_head_size) // 2  # MLA: the FLOP-equal mean of the Q/K and V head sizes
    for name, n_heads, n_kv, keys, causal in _attention_parts(model, heads, kv, s_kv):
        if p.flash_attention:
            b.add(name, scope, Phase.FORWARD, OpType.ATTENTION, batch=p.micro_batch, heads=n_heads, kv_heads=n_kv,
                  seq_q=s_q, seq_kv=keys, head_dim=hd, causal=causal)  # fmt: skip
            continue
        batch = p.micro_batch * n_heads
        b.add(f"{name}.scores", scope, Phase.FORWARD, OpType.BMM, batch=batch, m=s_q, k=hd, n=keys)
        b.add(f"{name}.softmax", scope, Phase.FORWARD, OpType.SOFTMAX, rows=batch * s_q, cols=keys)
        b.add(f"{name}.context", scope, Phase.FORWARD, OpType.BMM, batch=batch, m=s_q, k=keys, n=hd)


def _attention_parts(model: ModelSpec, heads: int, kv: int, s_kv: int) -> list[tuple[str, int, int, int, bool]]:
    """(name, heads, kv heads, keys, causal) of a layer template's attention cores.

    One causal core over ``s_kv`` keys; when ``sliding_window_layers`` of the layers use a
    window, the template stands for their average: that share of the heads (whole KV
    groups where there are several KV heads) attends non-causally to ``min(window, s_kv)``
    keys in ``attn.core_window`` (the cost of a causal sliding window once the sequence
    is longer than it), the rest to all ``s_kv``.
    """
    share = model.num_window_layers / model.num_layers
    full = ("attn.core", heads, kv, s_kv, True)
    if not share:
        return [full]
    window = min(model.sliding_window or s_kv, s_kv)
    if kv > 1:
        kv_w = round(kv * share)
        heads_w, kv_w, kv_f = kv_w * (heads // kv), kv_w, kv - kv_w
    else:
        heads_w = round(heads * share)
        kv_w = kv_f = kv
    if heads_w <= 0:
        return [full]
    if heads_w >= heads:
        return [("attn.core_window", heads, kv, window, False)]
    return [("attn.core", heads - heads_w, kv_f, s_kv, True), ("attn.core_window", heads_w, kv_w, window, False)]


def _add_latent_qkv(b: _Builder, model: ModelSpec, scope: str, t: int, heads: int) -> int:
    """Multi-head latent attention's Q and K/V projections (``heads`` per rank); returns the last node.

    The down projections to the latents are replicated over tp ranks (as in Megatron-Core's
    MLA), the up projections split by heads.
    """
    m, h, gemm = model.mla, model.hidden_size, _gemm_op(model)
    if m.q_lora_rank is None:
        b.add("attn.q", scope, Phase.FORWARD, gemm, batch=1, m=t, k=h, n=heads * m.qk_head_dim)
    else:
        b.add("attn.q_down", scope, Phase.FORWARD, gemm, batch=1, m=t, k=h, n=m.q_lora_rank)
        b.add("attn.q_norm", scope, Phase.FORWARD, _norm_op(model), rows=t, cols=m.q_lora_rank)
        b.add("attn.q_up", scope, Phase.FORWARD, gemm, batch=1, m=t, k=m.q_lora_rank, n=heads * m.qk_head_dim)
    b.add("attn.kv_down", scope, Phase.FORWARD, gemm, batch=1, m=t, k=h, n=m.kv_lora_rank + m.qk_rope_head_dim)
    b.add("attn.kv_norm", scope, Phase.FORWARD, _norm_op(model), rows=t, cols=m.kv_lora_rank)
    return b.add("attn.kv_up", scope, Phase.FORWARD, gemm, batch=1, m=t, k=m.kv_lora_rank,
                 n=heads * (m.qk_nope_head_dim + m.v_head_dim))  # fmt: skip


def _add_lora(b: _Builder, scope: str, base: str, tokens: int, d_in: int, d_out: int, rank: int) -> None:
    b.add(f"{base}.lora_a", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=tokens, k=d_in, n=rank)
    b.add(f"{base}.lora_b", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=tokens, k=rank, n=d_out)


def _add_experts(b: _Builder, model: ModelSpec, p: ParallelConfig, ctx: _Ctx, gpus_per_node: int) -> None:
    """Router, shared experts, token dispatch, routed experts and combine of one MoE layer.

    With ``etp == tp`` the experts take the layer's ``t`` tokens and split their GEMMs
    over the tp ranks. Otherwise each rank routes its ``t/tp`` share; with ``etp > 1`` the
    dispatched tokens are all-gathered over the etp ranks before the expert GEMMs (split
    ``etp`` ways) and reduce-scattered after (timed in the ``ep`` group). Shared experts run
    on all ``t`` tokens, split over tp.
    """
    scope, h = Scope.MOE_LAYER, model.hidden_size
    t = ctx.tokens if p.etp == p.tp else ctx.tokens // p.tp
    local = model.num_experts // p.ep
    sent = t * model.top_k  # token copies this rank dispatches (balanced routing)
    routed = sent * (p.etp if p.etp != p.tp else 1)  # token copies its experts process
    per_expert = -(-routed // local)
    f = model.expert_ffn_size // p.etp
    placement = group_placement(p, gpus_per_node)

    def exchange(name: str, op: OpType, ranks: int, key: str, size: int) -> None:
        """Token exchange among expert ranks (dispatch, combine, etp gather/scatter): ``size`` token copies."""
        if ranks > 1:
            b.add(name, scope, Phase.FORWARD, op, group=Group.EP, bytes=size * h * ctx.act_bytes, n_ranks=ranks,
                  ranks_per_node=placement[key][1])  # fmt: skip

    b.add("moe.router", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=t, k=h, n=model.num_experts)
    b.add("moe.router_softmax", scope, Phase.FORWARD, OpType.SOFTMAX, rows=t, cols=model.num_experts)
    if model.num_shared_experts:
        fs, dense = model.shared_expert_ffn_size // p.tp, _gemm_op(model)
        b.add("moe.shared_up", scope, Phase.FORWARD, dense, batch=1, m=ctx.tokens, k=h,
              n=fs * (2 if model.gated_mlp else 1))  # fmt: skip
        b.add("moe.shared_act", scope, Phase.FORWARD, _activation_op(model), rows=ctx.tokens, cols=fs)
        if model.gated_mlp:
            b.add("moe.shared_gate_mul", scope, Phase.FORWARD, OpType.MUL, rows=ctx.tokens, cols=fs)
        b.add("moe.shared_down", scope, Phase.FORWARD, dense, batch=1, m=ctx.tokens, k=fs, n=h)
    exchange("moe.dispatch", OpType.ALLTOALL, p.ep, Group.EP, sent)
    etp_split = p.etp != p.tp
    if etp_split:
        exchange("moe.etp_gather", OpType.ALLGATHER, p.etp, EXPERT_TP, routed)
    gemm = _gemm_op(model, local)
    b.add("moe.up", scope, Phase.FORWARD, gemm, batch=local, m=per_expert, k=h, n=f * (2 if model.gated_mlp else 1))
    b.add("moe.act", scope, Phase.FORWARD, _activation_op(model), rows=routed, cols=f)
    if model.gated_mlp:
        b.add("moe.gate_mul", scope, Phase.FORWARD, OpType.MUL, rows=routed, cols=f)
    b.add("moe.down", scope, Phase.FORWARD, gemm, batch=local, m=per_expert, k=f, n=h)
    if etp_split:
        exchange("moe.etp_scatter", OpType.REDUCESCATTER, p.etp, EXPERT_TP, routed)
    exchange("moe.combine", OpType.ALLTOALL, p.ep, Group.EP, sent)


def _add_head_forward(b: _Builder, model: ModelSpec, p: ParallelConfig, ctx: _Ctx) -> list[int]:
    first = len(b.rows)
    scope, h, t = Scope.LAST_STAGE, model.hidden_size, ctx.tokens
    vocab = padded_vocab_size(model, p.tp) // p.tp
    b.add("head.norm", scope, Phase.FORWARD, _norm_op(model), rows=ctx.vec_rows, cols=h)
    if ctx.sp:
        _tp_collective(b, "head.tp_gather", scope, ctx, OpType.ALLGATHER)
    b.add("head.logits", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=t, k=h, n=vocab)
    b.add("head.loss", scope, Phase.FORWARD, OpType.SOFTMAX, rows=t, cols=vocab)
    for _ in range(model.mtp_layers):  # each module's layer is counted among the last rank's layers
        b.add("mtp.norm", scope, Phase.FORWARD, _norm_op(model), rows=2 * ctx.vec_rows, cols=h)
        b.add("mtp.proj", scope, Phase.FORWARD, _gemm_op(model), batch=1, m=t, k=2 * h, n=h // p.tp)
        b.add("mtp.logits", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=t, k=h, n=vocab)
        b.add("mtp.loss", scope, Phase.FORWARD, OpType.SOFTMAX, rows=t, cols=vocab)
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
                b.add(f"{name}.bwd", scope, Phase.BACKWARD, op, bytes=row["bytes"], overlap_with=row["overlap_with"],
                      **comm)  # fmt: skip
            else:
                b.add(f"{name}.bwd", scope, Phase.BACKWARD, _CONJUGATE[op], bytes=row["bytes"], **comm)
        else:
            shape = {k: row[k] for k in _NON_GEMM_SHAPE if k in row}
            b.add(f"{name}.bwd", scope, Phase.BACKWARD, op, backward=True, **shape)
    _overlap_tp_backward(b, fwd_ids, bwd_of)


def _overlap_tp_forward(b: _Builder, ids: list[int]) -> None:
    """Point the tensor-parallel collectives among nodes ``ids`` at the GEMMs they overlap
    (:data:`TP_OVERLAP_GEMMS`)."""
    by_name = {b.rows[i]["name"]: i for i in ids}
    for collective, gemm in TP_OVERLAP_GEMMS.items():
        if collective in by_name and gemm in by_name:
            b.rows[by_name[collective]]["overlap_with"] = by_name[gemm]


def _overlap_tp_backward(b: _Builder, fwd_ids: list[int], bwd_of: dict[int, int]) -> None:
    """Point the backward of each overlapped tensor-parallel collective of ``fwd_ids`` at its
    GEMM's wgrad or dgrad (:data:`TP_OVERLAP_GEMMS`); ``bwd_of`` maps forward nodes to their
    first backward node."""
    added = {b.rows[i]["name"]: i for i in range(min(bwd_of.values(), default=len(b.rows)), len(b.rows))}
    for node in fwd_ids:
        row = b.rows[node]
        if row["group"] != Group.TP or row["overlap_with"] < 0 or node not in bwd_of:
            continue
        gemm = b.rows[row["overlap_with"]]["name"]
        wgrad = added.get(f"{gemm}.wgrad") if row["op"] == OpType.ALLGATHER.value else None
        partner = wgrad if wgrad is not None else added.get(f"{gemm}.dgrad")
        if partner is not None:
            b.rows[bwd_of[node]]["overlap_with"] = partner


def _add_recompute(b: _Builder, fwd_ids: list[int], p: ParallelConfig) -> None:
    if p.recompute is Recompute.NONE:
        return
    replay_of: dict[int, int] = {}
    for node in fwd_ids:
        row = dict(b.rows[node])
        if p.recompute is Recompute.SELECTIVE and not row["name"].startswith("attn.core"):
            continue
        if row["name"] == "zero3.param_gather" or row["group"] == Group.CP:
            continue  # weights and K/V of the forward are still at hand
        fields = {k: v for k, v in row.items() if k not in ("node", "name", "scope", "phase", "stream", "op", "dtype")}
        fields["overlap_with"] = -1
        replay_of[node] = b.add(f"{row['name']}.recompute", row["scope"], Phase.RECOMPUTE, _OP_BY_NAME[row["op"]],
                                **fields)  # fmt: skip
    for node, replay in replay_of.items():  # an overlapped collective's replay overlaps its GEMM's replay
        target = b.rows[node]["overlap_with"]
        if target in replay_of:
            b.rows[replay]["overlap_with"] = replay_of[target]


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


def _zero3_gather_params(model: ModelSpec, p: ParallelConfig, *, moe: bool) -> float:
    """Parameters one rank's ZeRO-3 gather of a layer moves, counted on the data-parallel group.

    Dense weights (attention, dense MLP, and in an MoE layer the router and shared experts)
    are split by ``tp`` and sharded over the ``dp*cp`` ranks. A rank's routed experts
    (``num_experts/ep`` of them, split by ``etp``) are sharded over the expert-data-parallel
    ranks only (``edp``): none to gather when ``edp = 1`` (``ep`` spans the data-parallel
    ranks). The node stays one all-gather on the data-parallel group, so the expert share
    is weighted by its ring factor against the group's: ``((edp-1)/edp) / ((n-1)/n)``.
    """
    dense = model.attention_params_per_layer + (0 if moe else model.mlp_params_per_layer)
    if not moe:
        return dense / p.tp
    dense += model.shared_expert_params + model.router_params_per_layer
    local_experts = model.num_experts * model.expert_params / (p.ep * p.etp)
    n, edp = p.dp * p.cp, p.edp
    share = ((edp - 1) / edp) / ((n - 1) / n) if edp > 1 and n > 1 else 0.0
    return dense / p.tp + local_experts * share


def _grad_bytes(p: ParallelConfig) -> int:
    return 4 if p.dtype in (DType.FP32, DType.TF32) else 2


def _add_step_ops(b: _Builder, model: ModelSpec, p: ParallelConfig, cluster: ClusterSpec) -> None:
    g = cluster.nvlink_domain
    dense, expert = trainable_params_per_rank(model, p)
    gb = _grad_bytes(p)
    dp_ranks = p.dp * p.cp
    edp_ranks = p.edp
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
