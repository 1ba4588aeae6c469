"""Workload graph: one training step of a (model, layout, cluster) config as a graph of ops.

The graph is a *template* of what one GPU on the busiest pipeline stage executes: a
dense transformer layer and (for MoE models) a mixture-of-experts layer, each with its
forward, recomputation and backward ops for one microbatch; the first-stage ops
(embedding), the last-stage ops (final norm, LM head, loss); the pipeline send/recv of
one microbatch; and the once-per-step ops (data-parallel gradient sync, optimizer).
``WorkloadGraph`` records how often each scope repeats, so a step is the template
expanded: every op is still one row with its shapes, FLOPs, bytes and dependencies.
The ops of one layer's forward are :mod:`perfcast.features.layer_ops`; nodes are appended
by :class:`~perfcast.features.node_builder.NodeBuilder`. This module assembles the step:
embedding, layers, head, pipeline transfers, backward, recomputation and the step ops.

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
  its backward; ``selective`` replays the attention core; torchtitan's ``op-sac`` every other
  matmul and the vector ops (:func:`replay_weights`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from perfcast.features.cluster import ClusterSpec
from perfcast.features.graph import (  # noqa: F401 (re-exported)
    NODE_COLUMNS,
    SHAPE_COLUMNS,
    Phase,
    Scope,
    WorkloadGraph,
)
from perfcast.features.layer_ops import (  # noqa: F401 (re-exported: the overlap markers)
    EP_OVERLAP_GEMMS,
    OVERLAP_PREVIOUS_LAYER,
    TP_OVERLAP_GEMMS,
    add_layer_forward,
)
from perfcast.features.model import TransformerSpec
from perfcast.features.node_builder import (  # noqa: F401 (re-exported: QUANTIZED_GEMMS)
    OP_BY_NAME,
    QUANTIZED_GEMMS,
    MicrobatchSizes,
    NodeBuilder,
    add_tp_collective,
    gemm_op,
    grad_bytes,
    norm_op,
)
from perfcast.features.ops import COLLECTIVE_OPS, GEMM_OPS, OpType
from perfcast.features.parallel import Finetune, ParallelConfig, Recompute, check_layout, padded_vocab_size
from perfcast.features.placement import (  # noqa: F401 (re-exported: the graph's group names and placement)
    DP_REPLICATE,
    DP_SHARD,
    EXPERT_DP_REPLICATE,
    EXPERT_DP_SHARD,
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

_NON_GEMM_SHAPE = ("batch", "rows", "cols", "scalar", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal")
"""Shape fields a vector or attention op's backward keeps from its forward."""
_CONJUGATE = {
    OpType.ALLGATHER: OpType.REDUCESCATTER,
    OpType.REDUCESCATTER: OpType.ALLGATHER,
    OpType.ALLREDUCE: OpType.ALLREDUCE,
    OpType.ALLTOALL: OpType.ALLTOALL,
    OpType.SENDRECV: OpType.SENDRECV,
}


def build_workload_graph(model: TransformerSpec, parallel: ParallelConfig, cluster: ClusterSpec) -> WorkloadGraph:
    """Expand a config into the op graph of one training step.

    Raises:
        SpecError: the layout does not fit the model or cluster (see ``check_layout``).
    """
    check_layout(model, parallel, cluster)
    p, g = parallel, cluster.nvlink_domain
    ctx = microbatch_sizes(model, p, g)
    b = NodeBuilder(p.dtype)

    ranks = layers_per_rank(model, p)
    dense_layers, moe_layers = busiest_rank_layers(ranks)
    even = len(set(ranks)) == 1
    _add_embedding_forward(b, model, p, ctx)
    dense_fwd = add_layer_forward(b, model, p, ctx, g, moe=False) if any(d for d, _ in ranks) else []
    moe_fwd = add_layer_forward(b, model, p, ctx, g, moe=True) if any(m for _, m in ranks) else []
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


def microbatch_sizes(model: TransformerSpec, parallel: ParallelConfig, nvlink_domain: int) -> MicrobatchSizes:
    """Per-rank tensor sizes of one microbatch of ``parallel`` (ranks of one NVLink domain place the
    tensor-parallel group)."""
    p = parallel
    sp = p.sequence_parallel and p.tp > 1
    tokens = p.micro_batch * model.seq_len // p.cp
    return MicrobatchSizes(
        tokens=tokens,
        hidden=model.hidden_size,
        vec_rows=tokens // p.tp if sp else tokens,
        act_bytes=max(p.dtype.bytes_per_element, 2),
        tp=p.tp,
        sp=sp,
        tp_rpn=group_placement(p, nvlink_domain)[Group.TP][1],
    )


def op_sac_kept_bytes(model: TransformerSpec, parallel: ParallelConfig, *, moe: bool = False) -> float:
    """Activation bytes one layer keeps for backward under ``op-sac``, per microbatch per GPU: the
    16-bit outputs of what :func:`replay_weights` does not replay, read off the layer's forward
    nodes (each GEMM node's output times its kept share, the fused attention output, the
    tensor-parallel reduce-scatter outputs), plus the layer's input."""
    p = parallel.model_copy(update={"recompute": Recompute.OP_SAC})
    ctx = microbatch_sizes(model, p, max(p.tp, 1))
    b = NodeBuilder(p.dtype)
    ids = add_layer_forward(b, model, p, ctx, max(p.tp, 1), moe=moe)
    rows = [b.rows[i] for i in ids]
    kept = 1.0 - _row_replay_weights(rows, Recompute.OP_SAC)
    total = 2.0 * ctx.vec_rows * ctx.hidden  # the layer input
    gemms = {op.value for op in GEMM_OPS}
    for row, share in zip(rows, kept, strict=True):
        if row["op"] in gemms and not row["name"].startswith("attn.core"):
            total += 2.0 * share * row["batch"] * row["m"] * row["n"]
        elif row["op"] == OpType.ATTENTION.value:  # one node per part of the heads (windowed or full)
            total += 2.0 * ctx.tokens * row["heads"] * model.v_head_size
        elif row["op"] == OpType.REDUCESCATTER.value and row["group"] == Group.TP:
            total += 2.0 * ctx.vec_rows * ctx.hidden
    return total


def body_structure_key(parallel: ParallelConfig, gpus_per_node: int) -> tuple[Any, ...]:
    """What a graph's per-microbatch nodes (all but the ``step`` scope) depend on besides the
    model, apart from ``vpp`` and ``recompute`` (:func:`body_variant` applies those): configs
    of one model with equal keys, ``vpp`` and ``recompute`` have identical such nodes, layer
    counts and ``pp``.

    The data-parallel degree, ZeRO stage, global batch and GPU type only change the
    once-per-step nodes (:func:`build_step_ops`) and the number of microbatches, except
    where they reach the layers: ZeRO-3's per-layer weight gathers and whether a pipeline
    transfer stays inside a node. The framework switches that set ``overlap_with``
    (``tp_comm_overlap`` with sequence parallelism, ``fsdp_prefetch`` under ZeRO-3,
    ``ep_comm_overlap`` with expert parallelism and more than one microbatch) are part of the key.
    """
    p = parallel
    zero3_shards = (p.zero_shard_ranks, p.expert_shard_ranks, p.dp_replicate) if p.zero_stage == 3 else (0, 0, 0)
    same_node = p.pp > 1 and group_placement(p, gpus_per_node)[Group.PP][1] == 2
    overlaps = (p.tp_comm_overlap and p.sequence_parallel and p.tp > 1, p.fsdp_prefetch and p.zero_stage == 3,
                p.hides_expert_all_to_all)  # fmt: skip
    return (p.tp, p.pp, p.cp, p.ep, p.etp, p.micro_batch, p.sequence_parallel, p.finetune, p.lora_rank, p.dtype,
            p.flash_attention, p.document_tokens, gpus_per_node, *zero3_shards, same_node, *pipeline_split_key(p),
            *overlaps)  # fmt: skip


def pipeline_split_key(parallel: ParallelConfig) -> tuple[Any, ...]:
    """The stated uneven-pipeline switches: with the model, ``pp`` and ``vpp`` they fix the
    layers of each stage (:func:`~perfcast.features.parallel.pipeline_split`)."""
    p = parallel
    return (p.account_for_embedding_in_pipeline_split, p.account_for_loss_in_pipeline_split, p.first_stage_layers,
            p.last_stage_layers)  # fmt: skip


OP_SAC_GATED_PROJECTIONS = {"mlp.up": "mlp.gate_mul", "moe.shared_up": "moe.shared_gate_mul"}
"""GEMM nodes that fuse two matmuls (gate and up projection) where their scope holds the named
gate multiply (a gated MLP); ``attn.qkv`` fuses three (Q, K, V); any other GEMM node is one."""
REPLAY_COLUMNS = ("name", "phase", "scope", "group", "op", "heads", "head_dim", "n")
"""The node columns :func:`replay_weights` reads."""
ROUTED_EXPERT_GEMMS = frozenset({"moe.up", "moe.down"})
"""The routed experts' GEMM nodes of an MoE layer (one grouped matmul each, whatever the experts per rank)."""


def replay_weights(nodes: Mapping[str, np.ndarray], recompute: Recompute) -> np.ndarray:
    """How often ``recompute`` replays each row of ``nodes`` before its layer's backward, per
    occurrence of the row (0: not replayed); ``nodes`` are a graph's nodes built without
    recomputation (or a layer's forward rows).

    ``nodes`` hold at least the columns :data:`REPLAY_COLUMNS`.

    Replayed are forward nodes of a layer (dense or MoE), except what the backward still has at
    hand: the ZeRO-3 weight gather and the context-parallel K/V exchange. Of those,
    ``full`` replays every node (collectives included, as Megatron's full recomputation does),
    ``selective`` the attention core only, ``op-sac`` (torchtitan) every node but the fused
    attention kernel and the tensor-parallel reduce-scatters and all-reduces (their outputs are
    kept), and of the weight GEMMs the matmuls torchtitan's policy does not keep
    (:func:`_op_sac_gemm_replay`); an unfused attention core (batched matmuls and softmax, which
    the policy neither counts nor keeps) is replayed whole.
    """
    names = np.asarray(nodes["name"]).astype(str)
    replay = (np.asarray(nodes["phase"]) == Phase.FORWARD) & np.isin(nodes["scope"], [Scope.LAYER, Scope.MOE_LAYER])
    replay &= (names != "zero3.param_gather") & (np.asarray(nodes["group"]) != Group.CP)
    attention = np.char.startswith(names, "attn.core")
    weights = replay.astype(float)
    if recompute is Recompute.NONE:
        weights[:] = 0.0
    elif recompute is Recompute.SELECTIVE:
        weights[~attention] = 0.0
    elif recompute is Recompute.OP_SAC:
        ops, tp = np.asarray(nodes["op"]), np.asarray(nodes["group"]) == Group.TP
        reduced = tp & np.isin(ops, [OpType.REDUCESCATTER.value, OpType.ALLREDUCE.value])
        kept = (ops == OpType.ATTENTION.value) | reduced
        weights[kept] = 0.0
        gemm = np.isin(ops, [op.value for op in GEMM_OPS]) & ~attention  # weight GEMMs
        scopes = np.asarray(nodes["scope"])
        key_share = _key_share(names, ops, scopes, nodes)
        weights[gemm] *= _op_sac_gemm_replay(names, scopes, gemm & (weights > 0), key_share)[gemm]
    return weights


def _row_replay_weights(rows: list[dict[str, Any]], recompute: Recompute) -> np.ndarray:
    """:func:`replay_weights` of node rows as a :class:`NodeBuilder` holds them."""
    return replay_weights({c: np.array([r[c] for r in rows], dtype=object) for c in REPLAY_COLUMNS}, recompute)


def _key_share(
    names: np.ndarray, ops: np.ndarray, scopes: np.ndarray, nodes: Mapping[str, np.ndarray]
) -> dict[str, float]:
    """Per layer scope, K's share of the fused QKV GEMM, ``kv / (heads + 2 kv)`` (grouped-query
    attention): the QKV node's width in heads (its ``n`` over the attention's ``head_dim``) less
    the query heads of the scope's forward fused attention nodes (one per windowed or full part) is
    ``2 kv``; a third where the scope has no fused attention (unfused) or no QKV node."""
    heads, head_dim, width = (np.asarray(nodes[c]).astype(float) for c in ("heads", "head_dim", "n"))
    forward = np.asarray(nodes["phase"]) == Phase.FORWARD
    share = {}
    for scope in (Scope.LAYER, Scope.MOE_LAYER):
        fused = forward & (scopes == scope) & (ops == OpType.ATTENTION.value)
        qkv = forward & (scopes == scope) & (names == "attn.qkv")
        if not (fused.any() and qkv.any()):
            share[scope] = 1 / 3
            continue
        total = width[qkv][0] / head_dim[fused][0]  # heads + 2 kv, per rank
        share[scope] = (total - heads[fused].sum()) / 2 / total
    return share


def _op_sac_gemm_replay(
    names: np.ndarray, scopes: np.ndarray, gemm: np.ndarray, key_share: Mapping[str, float]
) -> np.ndarray:
    """Per node, the share of its matmuls that torchtitan's op-level policy replays, for the
    ``gemm`` nodes (the rest of the array is unused).

    The policy (``torchtitan/models/llama3/infra/parallelize.py``, ``_apply_ac_to_transformer_block``)
    counts the block's matmuls afresh on each forward and keeps the output of the odd-numbered ones:
    in a Llama block (``wq wk wv wo w1 w3 w2``) it replays ``wk``, ``wo`` and the up projection
    ``w3``; in a plain-MLP block (``wq wk wv wo up down``) ``wk``, ``wo`` and ``down``. Here each
    layer scope counts its GEMM nodes in forward order, a fused node as its matmuls
    (:data:`OP_SAC_GATED_PROJECTIONS`): gate and up an equal share each, Q, K and V their widths'
    (``key_share``, from :func:`_key_share`: grouped-query K is narrower than a third).
    Latent attention, router, shared-expert and adapter GEMMs count one matmul per node, in node
    order. The routed experts' GEMMs (:data:`ROUTED_EXPERT_GEMMS`: a grouped matmul, which the
    policy neither counts nor keeps) are replayed whole. torchao's float8 GEMMs are counted like
    the others, though the policy's version decides whether it sees them.
    """
    share = np.zeros(len(names))
    grouped = np.isin(names, list(ROUTED_EXPERT_GEMMS))
    share[gemm & grouped] = 1.0
    for scope in (Scope.LAYER, Scope.MOE_LAYER):
        in_scope = scopes == scope
        present = set(names[in_scope].tolist())
        count = 0
        for i in np.flatnonzero(gemm & in_scope & ~grouped):
            name = str(names[i])
            if name == "attn.qkv":  # Q, K, V: K is the second matmul, with its own width
                k = key_share[scope]
                parts = (1 - 2 * k, k, k)
            else:
                parts = (0.5, 0.5) if OP_SAC_GATED_PROJECTIONS.get(name) in present else (1.0,)
            share[i] = sum(w for j, w in enumerate(parts, start=count + 1) if j % 2 == 0)
            count += len(parts)
    return share


def body_variant(
    nodes: Mapping[str, np.ndarray], vpp: int, replay: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The per-microbatch nodes of the same config with ``vpp`` and the recomputation whose
    :func:`replay_weights` are ``replay``, as rows of ``nodes`` and the columns that differ
    from those rows.

    ``nodes`` are the non-step nodes of a graph built with ``recompute="none"`` (any
    ``vpp``). ``vpp`` only sets how often each pipeline transfer repeats; the replayed
    nodes (which :func:`build_workload_graph` puts before each layer's backward) are
    appended at the end: the same nodes, in another order.

    Returns:
        ``source``: the variant's nodes as rows of ``nodes`` (all of them, then the
        replayed ones); and its ``repeat``, ``phase`` and ``overlap_with`` columns. Other
        columns are those of ``source`` (replayed names aside, which gain ``.recompute``).
    """
    replayed = np.flatnonzero(replay)
    n, k = len(nodes["node"]), len(replayed)
    repeat = np.where(nodes["group"] == Group.PP, vpp, nodes["repeat"]).astype(float)
    replay_of = np.full(n, -1, dtype=np.int64)  # a replayed node's overlap partner is its partner's replay
    replay_of[replayed] = n + np.arange(k)
    target = nodes["overlap_with"][replayed].astype(np.int64)
    return np.concatenate([np.arange(n), replayed]), {
        "repeat": np.concatenate([repeat, repeat[replayed] * replay[replayed]]),
        "phase": np.concatenate([nodes["phase"], np.full(k, Phase.RECOMPUTE, dtype=object)]),
        "overlap_with": np.concatenate([nodes["overlap_with"], np.where(target >= 0, replay_of[target], -1)]),
    }


def step_ops_key(parallel: ParallelConfig, gpus_per_node: int) -> tuple[Any, ...]:
    """What :func:`build_step_ops` depends on besides the model: configs of one model with
    equal keys have identical step nodes."""
    p = parallel
    return (p.tp, p.pp, p.cp, p.ep, p.etp, p.dp, p.zero_stage, p.dp_replicate, p.dtype, p.finetune, p.lora_rank,
            gpus_per_node, p.vpp, *pipeline_split_key(p))  # fmt: skip


def build_step_ops(model: TransformerSpec, parallel: ParallelConfig, cluster: ClusterSpec) -> dict[str, np.ndarray]:
    """The once-per-step nodes of the config's graph (gradient sync, optimizer), as ``NODE_COLUMNS`` arrays.

    They equal the ``step``-scope rows that :func:`build_workload_graph` appends last,
    numbered from 0 (no step node overlaps another node).
    """
    b = NodeBuilder(parallel.dtype)
    _add_step_ops(b, model, parallel, cluster)
    return b.columns()


def _add_embedding_forward(b: NodeBuilder, model: TransformerSpec, p: ParallelConfig, ctx: MicrobatchSizes) -> None:
    b.add("embedding", Scope.FIRST_STAGE, Phase.FORWARD, OpType.EMBEDDING, rows=ctx.tokens, cols=model.hidden_size)
    add_tp_collective(b, "embedding.tp", Scope.FIRST_STAGE, ctx, OpType.REDUCESCATTER if ctx.sp else OpType.ALLREDUCE)


def _add_head_forward(b: NodeBuilder, model: TransformerSpec, p: ParallelConfig, ctx: MicrobatchSizes) -> list[int]:
    first = len(b.rows)
    scope, h, t = Scope.LAST_STAGE, model.hidden_size, ctx.tokens
    vocab = padded_vocab_size(model, p.tp) // p.tp
    b.add("head.norm", scope, Phase.FORWARD, norm_op(model), rows=ctx.vec_rows, cols=h)
    if ctx.sp:
        add_tp_collective(b, "head.tp_gather", scope, ctx, OpType.ALLGATHER)
    b.add("head.logits", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=t, k=h, n=vocab)
    b.add("head.loss", scope, Phase.FORWARD, OpType.SOFTMAX, rows=t, cols=vocab)
    for _ in range(model.mtp_layers):  # each module's layer is counted among the last rank's layers
        b.add("mtp.norm", scope, Phase.FORWARD, norm_op(model), rows=2 * ctx.vec_rows, cols=h)
        b.add("mtp.proj", scope, Phase.FORWARD, gemm_op(model), batch=1, m=t, k=2 * h, n=h // p.tp)
        b.add("mtp.logits", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=t, k=h, n=vocab)
        b.add("mtp.loss", scope, Phase.FORWARD, OpType.SOFTMAX, rows=t, cols=vocab)
    return list(range(first, len(b.rows)))


def _add_pipeline_transfer(
    b: NodeBuilder, p: ParallelConfig, ctx: MicrobatchSizes, gpus_per_node: int, phase: str
) -> None:
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


def _add_backward(b: NodeBuilder, fwd_ids: list[int], p: ParallelConfig) -> None:
    """Append the backward ops of ``fwd_ids`` in reverse order."""
    bwd_of: dict[int, int] = {}
    for node in reversed(fwd_ids):
        row = b.rows[node]
        op = OP_BY_NAME[row["op"]]
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
    _overlap_collectives_backward(b, fwd_ids, bwd_of)


def _overlap_collectives_backward(b: NodeBuilder, fwd_ids: list[int], bwd_of: dict[int, int]) -> None:
    """Point the backward of each overlapped tensor-parallel or expert collective of ``fwd_ids`` at
    its GEMM's wgrad or dgrad (:data:`TP_OVERLAP_GEMMS`, :data:`EP_OVERLAP_GEMMS`: an all-gather's
    or all-to-all's at the wgrad where there is one); ``bwd_of`` maps forward nodes to their
    first backward node."""
    added = {b.rows[i]["name"]: i for i in range(min(bwd_of.values(), default=len(b.rows)), len(b.rows))}
    for node in fwd_ids:
        row = b.rows[node]
        if row["group"] not in (Group.TP, Group.EP) or row["overlap_with"] < 0 or node not in bwd_of:
            continue
        gemm = b.rows[row["overlap_with"]]["name"]
        to_wgrad = row["op"] in (OpType.ALLGATHER.value, OpType.ALLTOALL.value)
        wgrad = added.get(f"{gemm}.wgrad") if to_wgrad else None
        partner = wgrad if wgrad is not None else added.get(f"{gemm}.dgrad")
        if partner is not None:
            b.rows[bwd_of[node]]["overlap_with"] = partner


def _add_recompute(b: NodeBuilder, fwd_ids: list[int], p: ParallelConfig) -> None:
    """Append the replays of the layer forward nodes ``fwd_ids`` that ``p.recompute`` replays
    (:func:`replay_weights`), each with its repeat times its replay weight."""
    rows = [b.rows[node] for node in fwd_ids]
    weights = _row_replay_weights(rows, p.recompute)
    replay_of: dict[int, int] = {}
    for node, row, weight in zip(fwd_ids, rows, weights, strict=True):
        if weight == 0.0:
            continue
        fields = {k: v for k, v in row.items() if k not in ("node", "name", "scope", "phase", "stream", "op", "dtype")}
        fields["overlap_with"], fields["repeat"] = -1, row["repeat"] * weight
        replay_of[node] = b.add(f"{row['name']}.recompute", row["scope"], Phase.RECOMPUTE, OP_BY_NAME[row["op"]],
                                **fields)  # fmt: skip
    for node, replay in replay_of.items():  # an overlapped collective's replay overlaps its GEMM's replay
        target = b.rows[node]["overlap_with"]
        if target in replay_of:
            b.rows[replay]["overlap_with"] = replay_of[target]


def _add_embedding_backward(b: NodeBuilder, model: TransformerSpec, p: ParallelConfig, ctx: MicrobatchSizes) -> None:
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


def _add_step_ops(b: NodeBuilder, model: TransformerSpec, p: ParallelConfig, cluster: ClusterSpec) -> None:
    """Append the once-per-step nodes: each data-parallel group's gradient sync (all-reduce
    without ZeRO; with it, a reduce-scatter inside each replica's shard group, an all-reduce
    of the shard across the ``dp_replicate`` replicas, and below ZeRO-3 the all-gather of the
    updated parameters), the tied embedding's gradient sync and the optimizer step."""
    g = cluster.nvlink_domain
    dense, expert = trainable_params_per_rank(model, p)
    gb = grad_bytes(p)
    placement = group_placement(p, g)
    groups = [(Group.DP, dense, p.dp * p.cp, placement[Group.DP][1], placement[DP_SHARD], placement[DP_REPLICATE])]
    if expert:
        groups.append((Group.EXPERT_DP, expert, p.edp, placement[Group.EXPERT_DP][1], placement[EXPERT_DP_SHARD],
                       placement[EXPERT_DP_REPLICATE]))  # fmt: skip
    for group, params, ranks, rpn, (shard, shard_rpn), (replicas, replica_rpn) in groups:
        if ranks <= 1 or params == 0:
            continue
        if p.zero_stage == 0:
            syncs = [("grad_allreduce", OpType.ALLREDUCE, params, ranks, rpn)]
        else:  # sharded gradients; below ZeRO-3 the updated parameter shards are gathered back
            syncs = [("grad_reducescatter", OpType.REDUCESCATTER, params, shard, shard_rpn)]
            syncs += [("grad_replica_allreduce", OpType.ALLREDUCE, params // shard, replicas, replica_rpn)]
            syncs += [("param_allgather", OpType.ALLGATHER, params, shard, shard_rpn)] if p.zero_stage < 3 else []
        for name, op, count, n_ranks, per_node in syncs:
            if n_ranks > 1:
                b.add(f"{group}.{name}", Scope.STEP, Phase.STEP, op, group=group, bytes=count * gb, n_ranks=n_ranks,
                      ranks_per_node=per_node)  # fmt: skip
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
    sharded = p.zero_stage >= 1
    owned = dense // (p.zero_shard_ranks if sharded else 1) + expert // (p.expert_shard_ranks if sharded else 1)
    b.add("optimizer", Scope.STEP, Phase.STEP, OpType.OPTIMIZER, rows=1, cols=owned)
