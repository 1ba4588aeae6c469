"""The forward ops of one transformer layer of the workload graph, for one microbatch on one rank.

A layer is its attention block (norm; QKV projection, or multi-head latent attention's
down and up projections; LoRA adapters; the attention core, fused or unfused, with
sliding-window heads; the output projection; the residual add) and its MLP block (norm;
a dense MLP or a mixture-of-experts block: router, shared experts, token dispatch, routed
experts, combine; the residual add), with the tensor-parallel collectives around each
block, the context-parallel K/V exchange and the ZeRO-3 weight gather. Layout conventions
are those of :mod:`perfcast.features.workload`, which assembles the step from these
layers.
"""

from __future__ import annotations

from perfcast.features.graph import Phase, Scope
from perfcast.features.model import TransformerSpec
from perfcast.features.node_builder import (
    MicrobatchSizes,
    NodeBuilder,
    activation_op,
    add_tp_collective,
    gemm_op,
    grad_bytes,
    norm_op,
)
from perfcast.features.ops import OpType
from perfcast.features.parallel import Finetune, ParallelConfig
from perfcast.features.placement import DP_SHARD, EXPERT_DP_SHARD, EXPERT_TP, Group, group_placement

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
GEMM. The LM head and the embedding keep their collectives exposed; the MoE block's, but for
:data:`EP_OVERLAP_GEMMS`."""
EP_OVERLAP_GEMMS = {"moe.dispatch": "moe.up", "moe.combine": "moe.down"}
"""Under ``ep_comm_overlap``, the expert GEMM each expert all-to-all of an MoE layer overlaps: the
schemes that hide it (Megatron-Core's ``overlap_moe_expert_parallel_comm``, DeepSeek's DualPipe)
run one microbatch's all-to-all beside another microbatch's compute, and the expert GEMM of the
same layer stands for that compute; a step of one microbatch has no other, and its all-to-alls
stay exposed. Backward as :data:`TP_OVERLAP_GEMMS`: the all-to-all beside its GEMM's wgrad (dgrad
where the weights are frozen). The ``etp`` gather and scatter stay exposed."""


def add_layer_forward(
    b: NodeBuilder, model: TransformerSpec, p: ParallelConfig, ctx: MicrobatchSizes, gpus_per_node: int, *, moe: bool
) -> list[int]:
    """Append the forward ops of one dense layer (an MoE layer with ``moe``) to ``b``; returns their
    node ids in order."""
    scope = Scope.MOE_LAYER if moe else Scope.LAYER
    h, t, tp = model.hidden_size, ctx.tokens, p.tp
    heads, kv = model.num_heads // tp, max(1, model.kv_heads // tp)
    hd = model.head_size
    first = len(b.rows)
    gemm = gemm_op(model)

    b.add("attn.norm", scope, Phase.FORWARD, norm_op(model), rows=ctx.vec_rows, cols=h)
    if ctx.sp:
        add_tp_collective(b, "attn.tp_gather", scope, ctx, OpType.ALLGATHER)
    gather = _zero3_gather(model, p, gpus_per_node, moe=moe)
    if gather is not None:
        group, n_ranks, per_node, params = gather
        b.add(
            "zero3.param_gather",
            scope,
            Phase.FORWARD,
            OpType.ALLGATHER,
            overlap_with=OVERLAP_PREVIOUS_LAYER if p.fsdp_prefetch else -1,
            group=group,
            bytes=round(params) * grad_bytes(p),
            n_ranks=n_ranks,
            ranks_per_node=per_node,
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
    add_tp_collective(b, "attn.tp_reduce", scope, ctx, OpType.REDUCESCATTER if ctx.sp else OpType.ALLREDUCE)
    b.add("attn.residual", scope, Phase.FORWARD, OpType.ADD, rows=ctx.vec_rows, cols=h)
    b.add("mlp.norm", scope, Phase.FORWARD, norm_op(model), rows=ctx.vec_rows, cols=h)
    # With etp != tp the routed experts take the rank's 1/tp share of the tokens (Megatron-Core
    # runs MoE layers sequence-parallel); the layer's tp collectives then serve the shared
    # experts, or rebuild the replicated activations without sequence parallelism.
    mlp_tp = not moe or p.etp == p.tp or not ctx.sp or model.num_shared_experts > 0
    if ctx.sp and mlp_tp:
        add_tp_collective(b, "mlp.tp_gather", scope, ctx, OpType.ALLGATHER)
    if moe:
        _add_experts(b, model, p, ctx, gpus_per_node)
    else:
        f = model.ffn_size // tp
        b.add("mlp.up", scope, Phase.FORWARD, gemm, batch=1, m=t, k=h, n=f * (2 if model.gated_mlp else 1))
        b.add("mlp.act", scope, Phase.FORWARD, activation_op(model), rows=t, cols=f)
        if model.gated_mlp:
            b.add("mlp.gate_mul", scope, Phase.FORWARD, OpType.MUL, rows=t, cols=f)
        b.add("mlp.down", scope, Phase.FORWARD, gemm, batch=1, m=t, k=f, n=h)
    if mlp_tp:
        add_tp_collective(b, "mlp.tp_reduce", scope, ctx, OpType.REDUCESCATTER if ctx.sp else OpType.ALLREDUCE)
    b.add("mlp.residual", scope, Phase.FORWARD, OpType.ADD, rows=ctx.vec_rows, cols=h)
    ids = list(range(first, len(b.rows)))
    if p.tp_comm_overlap and ctx.sp:
        _point_at_gemms(b, ids, TP_OVERLAP_GEMMS)
    return ids


def _add_attention_core(
    b: NodeBuilder, scope: str, model: TransformerSpec, p: ParallelConfig, heads: int, kv: int
) -> None:
    """Scores, softmax and context of one layer: one fused op, or three unfused ones.

    Fused, the op runs over each sequence's attention documents
    (:meth:`~perfcast.features.parallel.ParallelConfig.attention_documents`: the whole
    sequence, or its packed documents), each over its own keys, the rank's queries of the
    sequence shared among them (so the FLOPs are those of the sequence's tokens attending to
    ``document_tokens`` keys, whether or not the documents divide the sequence). Unfused
    (``flash_attention=False``), K and V are broadcast to every query head and the full
    score matrix of the sequence is computed and normalised in memory, causal or packed
    mask or not.
    """
    s_q, s_kv = model.seq_len // p.cp, model.seq_len
    hd = (model.qk_head_size + model.v_head_size) // 2  # MLA: the FLOP-equal mean of the Q/K and V head sizes
    documents, doc_kv = p.attention_documents(model.seq_len) if p.flash_attention else (1, s_kv)
    doc_q = max(1, round(s_q / documents))  # the rank's queries of the sequence, shared among its documents
    for name, n_heads, n_kv, keys, causal in _attention_parts(model, heads, kv, doc_kv):
        if p.flash_attention:
            b.add(name, scope, Phase.FORWARD, OpType.ATTENTION, batch=p.micro_batch * documents, heads=n_heads,
                  kv_heads=n_kv, seq_q=doc_q, seq_kv=keys, head_dim=hd, causal=causal)  # fmt: skip
            continue
        batch = p.micro_batch * n_heads
        b.add(f"{name}.scores", scope, Phase.FORWARD, OpType.BMM, batch=batch, m=s_q, k=hd, n=keys)
        b.add(f"{name}.softmax", scope, Phase.FORWARD, OpType.SOFTMAX, rows=batch * s_q, cols=keys)
        b.add(f"{name}.context", scope, Phase.FORWARD, OpType.BMM, batch=batch, m=s_q, k=keys, n=hd)


def _attention_parts(model: TransformerSpec, heads: int, kv: int, s_kv: int) -> list[tuple[str, int, int, int, bool]]:
    """(name, heads, kv heads, keys, causal) of a layer template's attention cores.

    One causal core over ``s_kv`` keys; when ``sliding_window_layers`` of the layers use a
    window shorter than ``s_kv``, the template stands for their average: that share of the
    heads (whole KV groups where there are several KV heads) attends non-causally to
    :func:`window_keys` keys in ``attn.core_window`` (the mean keys per query of a causal
    sliding window), the rest causally to all ``s_kv``. A window at least ``s_kv`` long masks
    nothing beyond the causal mask: every head attends as in ``attn.core``.
    """
    share = model.num_window_layers / model.num_layers
    full = ("attn.core", heads, kv, s_kv, True)
    if not share or (model.sliding_window or s_kv) >= s_kv:
        return [full]
    window = window_keys(model.sliding_window, s_kv)
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


def window_keys(window: int, keys: int) -> int:
    """Mean keys per query of a causal sliding window of ``window`` tokens over ``keys`` tokens,
    rounded (at least 1): ``w - w**2 / (2 * keys)`` with ``w = min(window, keys)``, which is
    ``keys / 2`` (causal attention) for a window as long as the keys."""
    w = min(window, keys)
    return max(1, round(w - w * w / (2 * keys)))


def _add_latent_qkv(b: NodeBuilder, model: TransformerSpec, scope: str, t: int, heads: int) -> int:
    """Multi-head latent attention's Q and K/V projections (``heads`` per rank); returns the last node.

    The down projections to the latents are replicated over tp ranks (as in Megatron-Core's
    MLA), the up projections split by heads.
    """
    m, h, gemm = model.mla, model.hidden_size, gemm_op(model)
    if m.q_lora_rank is None:
        b.add("attn.q", scope, Phase.FORWARD, gemm, batch=1, m=t, k=h, n=heads * m.qk_head_dim)
    else:
        b.add("attn.q_down", scope, Phase.FORWARD, gemm, batch=1, m=t, k=h, n=m.q_lora_rank)
        b.add("attn.q_norm", scope, Phase.FORWARD, norm_op(model), rows=t, cols=m.q_lora_rank)
        b.add("attn.q_up", scope, Phase.FORWARD, gemm, batch=1, m=t, k=m.q_lora_rank, n=heads * m.qk_head_dim)
    b.add("attn.kv_down", scope, Phase.FORWARD, gemm, batch=1, m=t, k=h, n=m.kv_lora_rank + m.qk_rope_head_dim)
    b.add("attn.kv_norm", scope, Phase.FORWARD, norm_op(model), rows=t, cols=m.kv_lora_rank)
    return b.add("attn.kv_up", scope, Phase.FORWARD, gemm, batch=1, m=t, k=m.kv_lora_rank,
                 n=heads * (m.qk_nope_head_dim + m.v_head_dim))  # fmt: skip


def _add_lora(b: NodeBuilder, scope: str, base: str, tokens: int, d_in: int, d_out: int, rank: int) -> None:
    b.add(f"{base}.lora_a", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=tokens, k=d_in, n=rank)
    b.add(f"{base}.lora_b", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=tokens, k=rank, n=d_out)


def _add_experts(
    b: NodeBuilder, model: TransformerSpec, p: ParallelConfig, ctx: MicrobatchSizes, gpus_per_node: int
) -> None:
    """Router, shared experts, token dispatch, routed experts and combine of one MoE layer.

    With ``etp == tp`` the experts take the layer's ``t`` tokens and split their GEMMs
    over the tp ranks. Otherwise each rank routes its ``t/tp`` share; with ``etp > 1`` the
    dispatched tokens are all-gathered over the etp ranks before the expert GEMMs (split
    ``etp`` ways) and reduce-scattered after (timed in the ``ep`` group); under ``ep_comm_overlap``
    the dispatch and combine name the expert GEMM they overlap (:data:`EP_OVERLAP_GEMMS`). Shared
    experts run on all ``t`` tokens, split over tp. The rank's token copies (``top_k`` per routed token) are
    permuted into expert order before the dispatch and weighted back into token order after the
    combine (``moe.permute``, ``moe.unpermute``, as Megatron-Core's token permutation does):
    memory-bound copies, each timed as a tensor-scalar multiply over the copies (one read and
    one write of each element; the unpermute's reduction writes fewer, so it is timed a little
    long). The second sort that Megatron-Core makes when a rank holds several experts after an
    etp gather is not modelled.
    """
    scope, h = Scope.MOE_LAYER, model.hidden_size
    t = ctx.tokens if p.etp == p.tp else ctx.tokens // p.tp
    local = model.num_experts // p.ep
    sent = t * model.top_k  # token copies this rank dispatches (balanced routing)
    routed = sent * (p.etp if p.etp != p.tp else 1)  # token copies its experts process
    per_expert = -(-routed // local)
    f = model.expert_ffn_size // p.etp
    placement = group_placement(p, gpus_per_node)
    first = len(b.rows)

    def exchange(name: str, op: OpType, ranks: int, key: str, size: int) -> None:
        """Token exchange among expert ranks (dispatch, combine, etp gather/scatter): ``size`` token copies."""
        if ranks > 1:
            b.add(name, scope, Phase.FORWARD, op, group=Group.EP, bytes=size * h * ctx.act_bytes, n_ranks=ranks,
                  ranks_per_node=placement[key][1])  # fmt: skip

    b.add("moe.router", scope, Phase.FORWARD, OpType.MATMUL, batch=1, m=t, k=h, n=model.num_experts)
    b.add("moe.router_softmax", scope, Phase.FORWARD, OpType.SOFTMAX, rows=t, cols=model.num_experts)
    if model.num_shared_experts:
        fs, dense = model.shared_expert_ffn_size // p.tp, gemm_op(model)
        b.add("moe.shared_up", scope, Phase.FORWARD, dense, batch=1, m=ctx.tokens, k=h,
              n=fs * (2 if model.gated_mlp else 1))  # fmt: skip
        b.add("moe.shared_act", scope, Phase.FORWARD, activation_op(model), rows=ctx.tokens, cols=fs)
        if model.gated_mlp:
            b.add("moe.shared_gate_mul", scope, Phase.FORWARD, OpType.MUL, rows=ctx.tokens, cols=fs)
        b.add("moe.shared_down", scope, Phase.FORWARD, dense, batch=1, m=ctx.tokens, k=fs, n=h)
    b.add("moe.permute", scope, Phase.FORWARD, OpType.MUL, rows=sent, cols=h, scalar=True)
    exchange("moe.dispatch", OpType.ALLTOALL, p.ep, Group.EP, sent)
    etp_split = p.etp != p.tp
    if etp_split:
        exchange("moe.etp_gather", OpType.ALLGATHER, p.etp, EXPERT_TP, routed)
    gemm = gemm_op(model, local)
    b.add("moe.up", scope, Phase.FORWARD, gemm, batch=local, m=per_expert, k=h, n=f * (2 if model.gated_mlp else 1))
    b.add("moe.act", scope, Phase.FORWARD, activation_op(model), rows=routed, cols=f)
    if model.gated_mlp:
        b.add("moe.gate_mul", scope, Phase.FORWARD, OpType.MUL, rows=routed, cols=f)
    b.add("moe.down", scope, Phase.FORWARD, gemm, batch=local, m=per_expert, k=f, n=h)
    if etp_split:
        exchange("moe.etp_scatter", OpType.REDUCESCATTER, p.etp, EXPERT_TP, routed)
    exchange("moe.combine", OpType.ALLTOALL, p.ep, Group.EP, sent)
    b.add("moe.unpermute", scope, Phase.FORWARD, OpType.MUL, rows=sent, cols=h, scalar=True)
    if p.hides_expert_all_to_all:
        _point_at_gemms(b, list(range(first, len(b.rows))), EP_OVERLAP_GEMMS)


def _point_at_gemms(b: NodeBuilder, ids: list[int], partners: dict[str, str]) -> None:
    """Point the collectives among nodes ``ids`` at the GEMMs they overlap (``partners``:
    :data:`TP_OVERLAP_GEMMS` or :data:`EP_OVERLAP_GEMMS`)."""
    by_name = {b.rows[i]["name"]: i for i in ids}
    for collective, gemm in partners.items():
        if collective in by_name and gemm in by_name:
            b.rows[by_name[collective]]["overlap_with"] = by_name[gemm]


def _zero3_gather(
    model: TransformerSpec, p: ParallelConfig, gpus_per_node: int, *, moe: bool
) -> tuple[str, int, int, float] | None:
    """A layer's ZeRO-3 weight gather as ``(group, ranks, ranks per NVLink domain, parameters)``,
    None where nothing is sharded: on the dense shard group (:func:`_zero3_gather_params`), or,
    where the dense state has one-rank shards but an MoE layer's experts are sharded over
    ``edp / dp_replicate > 1`` ranks (their ``ep * etp`` spanning fewer ranks than ``tp``), the
    rank's experts on the expert shard group."""
    if p.zero_stage != 3:
        return None
    placement = group_placement(p, gpus_per_node)
    if p.zero_shard_ranks > 1:
        return Group.DP, p.zero_shard_ranks, placement[DP_SHARD][1], _zero3_gather_params(model, p, moe=moe)
    if moe and p.expert_shard_ranks > 1:
        experts = model.num_experts * model.expert_params / (p.ep * p.etp)
        return Group.EXPERT_DP, p.expert_shard_ranks, placement[EXPERT_DP_SHARD][1], experts
    return None


def _zero3_gather_params(model: TransformerSpec, p: ParallelConfig, *, moe: bool) -> float:
    """Parameters one rank's ZeRO-3 gather of a layer moves, counted on the shard group.

    Dense weights (attention, dense MLP, and in an MoE layer the router and shared experts)
    are split by ``tp`` and sharded over the ``n = dp*cp / dp_replicate`` ranks of a replica.
    A rank's routed experts (``num_experts/ep`` of them, split by ``etp``) are sharded over
    the ``e = edp / dp_replicate`` expert-data-parallel ranks of a replica only: none to
    gather when ``e = 1``. The node stays one all-gather on the dense shard group, so the
    expert share is weighted by its ring factor against the group's: ``((e-1)/e) / ((n-1)/n)``.
    """
    dense = model.attention_params_per_layer + (0 if moe else model.mlp_params_per_layer)
    if not moe:
        return dense / p.tp
    dense += model.shared_expert_params + model.router_params_per_layer
    local_experts = model.num_experts * model.expert_params / (p.ep * p.etp)
    n, edp = p.zero_shard_ranks, p.expert_shard_ranks
    share = ((edp - 1) / edp) / ((n - 1) / n) if edp > 1 and n > 1 else 0.0
    return dense / p.tp + local_experts * share
