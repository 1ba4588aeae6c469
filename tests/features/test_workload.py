"""Tests of the workload graph: FLOPs per step against the analytic count, and the ops and
collectives each kind of parallelism adds.

FLOPs relation checked here (dense GPT, pp = tp = 1, no recomputation, fused causal
attention; T tokens per GPU and step, V_pad the vocabulary padded as the graph pads it)::

    graph GEMM FLOPs      = 6 * N_mm(V_pad) * T + bias * T
    graph attention FLOPs = L * T * (4 * s * h) * 0.5 * (1 + 2.5)          (= 7 * L * s * h * T)
    model.flops_per_token() * T = 6 * N_mm(V) * T + 12 * L * s * h * T    (full attention, 2x bwd)

hence ``GEMM + attention = flops_per_token * T + 6 * (V_pad - V) * h * T + bias * T
- 5 * L * s * h * T``, where ``bias`` is the linear-bias FLOPs per token (one add per
output element of each forward linear).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import SpecError
from perfcast.features import node_builder
from perfcast.features.hardware import ClusterSpec
from perfcast.features.model import TransformerSpec
from perfcast.features.ops import op_flops, op_memory_bytes
from perfcast.features.parallel import ParallelConfig, padded_vocab_size
from perfcast.features.workload import (
    NODE_COLUMNS,
    SHAPE_COLUMNS,
    WorkloadGraph,
    build_workload_graph,
    group_ranks_per_node,
    trainable_params_per_rank,
)

GPT = TransformerSpec(name="gpt-test", num_layers=4, hidden_size=512, num_heads=8, vocab_size=1000, seq_len=256)
GEMM_OPS = ("matmul", "linear", "bmm")
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")


def _graph(model: TransformerSpec = GPT, **fields) -> WorkloadGraph:
    fields.setdefault("global_batch", fields.get("dp", 1) * fields.get("micro_batch", 1))
    p = ParallelConfig(**fields)
    return build_workload_graph(model, p, ClusterSpec.build("h100-sxm5-80gb", p.world_size))


def _weighted_flops(g: WorkloadGraph) -> pd.Series:
    """FLOPs of each node over one step: flops * repeat * scope multiplicity * microbatches."""
    n = g.nodes
    mult = n["scope"].map(g.scope_multiplicity())
    steps = np.where(n["scope"] == "step", 1, g.num_microbatches)
    return n["flops"] * n["repeat"] * mult * steps


def _flops(g: WorkloadGraph, ops, scope: str | None = None) -> float:
    mask = g.nodes["op"].isin(ops)
    if scope is not None:
        mask &= g.nodes["scope"] == scope
    return float(_weighted_flops(g)[mask].sum())


def _bias_per_token(model: TransformerSpec, tp: int) -> int:
    """Linear-bias FLOPs per token and layer: QKV and MLP-up split over tp, out and down not."""
    qkv = (model.num_heads + 2 * model.kv_heads) * model.head_size // tp
    return model.num_layers * (qkv + model.hidden_size + model.ffn_size // tp + model.hidden_size)


def _padded_matmul_params(model: TransformerSpec, tp: int) -> int:
    return model.num_matmul_params + (padded_vocab_size(model, tp) - model.vocab_size) * model.hidden_size


def _ops(g: WorkloadGraph, **where) -> pd.DataFrame:
    n = g.nodes
    mask = np.ones(len(n), dtype=bool)
    for col, value in where.items():
        mask &= n[col].isin(value) if isinstance(value, (list, tuple, set)) else n[col] == value
    return n[mask]


# ------------------------------------------------------------------ FLOPs per step


def test_gemm_flops_are_six_n_tokens_plus_bias():
    g = _graph(global_batch=4, micro_batch=2)
    tokens = 4 * GPT.seq_len
    n_mm = _padded_matmul_params(GPT, 1)
    assert padded_vocab_size(GPT, 1) == 1024  # the padding is exercised
    expected = 6 * n_mm * tokens + _bias_per_token(GPT, 1) * tokens
    assert _flops(g, GEMM_OPS) == pytest.approx(expected, rel=1e-12)


def test_attention_flops_are_causal_with_two_and_a_half_backward():
    g = _graph(global_batch=4, micro_batch=2)
    tokens = 4 * GPT.seq_len
    expected = GPT.num_layers * tokens * (4 * GPT.seq_len * GPT.hidden_size) * 0.5 * (1 + 2.5)
    assert _flops(g, ["attention"]) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("model", [GPT, TransformerSpec.from_name("gpt3-1.3b")], ids=["gpt-test", "gpt3-1.3b"])
def test_flops_against_model_flops_per_token(model):
    g = _graph(model, global_batch=2, micro_batch=1)
    tokens = 2 * model.seq_len
    L, s, h, V = model.num_layers, model.seq_len, model.hidden_size, model.vocab_size
    gemm_attn = _flops(g, GEMM_OPS + ("attention",))
    exact = (
        model.flops_per_token() * tokens
        + 6 * (padded_vocab_size(model, 1) - V) * h * tokens
        + _bias_per_token(model, 1) * tokens
        - 5 * L * s * h * tokens
    )
    assert gemm_attn == pytest.approx(exact, rel=1e-12)
    # norms, activations, softmax, residuals and the optimizer are a small rest
    total = _weighted_flops(g).sum()
    assert 0 < total - gemm_attn < 0.02 * total
    # so the whole step is a few % under the full-attention count
    ratio = total / (model.flops_per_token() * tokens)
    assert 0.93 < ratio < 1.0


def test_tensor_parallelism_halves_the_gemm_flops_per_gpu():
    tokens = 2 * GPT.seq_len
    one, two = _graph(global_batch=2), _graph(tp=2, global_batch=2)
    assert padded_vocab_size(GPT, 2) == padded_vocab_size(GPT, 1)
    gemm_two = _flops(two, GEMM_OPS)
    # the row-parallel biases (attention out, MLP down) are added on every rank
    assert gemm_two == pytest.approx(
        3 * _padded_matmul_params(GPT, 2) * tokens + _bias_per_token(GPT, 2) * tokens, rel=1e-12
    )
    assert gemm_two == pytest.approx(_flops(one, GEMM_OPS) / 2, rel=0.01)
    assert _flops(two, ["attention"]) == pytest.approx(_flops(one, ["attention"]) / 2, rel=1e-12)


def test_full_recompute_replays_one_forward():
    none, full = _graph(global_batch=2), _graph(global_batch=2, recompute="full")
    layer_fwd = float(
        _weighted_flops(none)[
            (none.nodes["phase"] == "fwd") & (none.nodes["scope"] == "layer") & none.nodes["op"].isin(GEMM_OPS)
        ].sum()
    )
    assert _flops(full, GEMM_OPS, "layer") == pytest.approx(_flops(none, GEMM_OPS, "layer") + layer_fwd, rel=1e-12)
    assert _flops(full, GEMM_OPS) / _flops(none, GEMM_OPS) == pytest.approx(4 / 3, rel=0.03)
    recomputed = _ops(full, phase="recompute")
    assert set(recomputed["name"].str.removesuffix(".recompute")) == set(_ops(none, phase="fwd", scope="layer")["name"])


def test_selective_recompute_replays_the_attention_core_only():
    none, sel = _graph(global_batch=2), _graph(global_batch=2, recompute="selective")
    assert list(_ops(sel, phase="recompute")["op"]) == ["attention"]
    assert _flops(sel, ["attention"]) == pytest.approx(_flops(none, ["attention"]) * (1 + 1 / 3.5), rel=1e-12)
    assert _flops(sel, GEMM_OPS) == _flops(none, GEMM_OPS)


OP_SAC_REPLAYS = {
    # GPT (plain MLP): matmuls q k v o up down, the even-numbered (k, o, down) replayed
    "plain": (GPT, {"attn.qkv": 1 / 3, "attn.out": 1.0, "mlp.down": 1.0}),
    # Llama (gated MLP): q k v o gate up down, replayed k, o and the up half of the fused gate-up;
    # grouped-query K (8 of 32 + 8 + 8 heads wide) is a sixth of the fused QKV
    "gated": (TransformerSpec.from_name("llama3-8b").model_copy(update={"num_layers": 2, "seq_len": 256}),
              {"attn.qkv": 1 / 6, "attn.out": 1.0, "mlp.up": 0.5}),
}  # fmt: skip


@pytest.mark.parametrize("fields", [{}, {"tp": 2, "sequence_parallel": True}])
@pytest.mark.parametrize("block", list(OP_SAC_REPLAYS))
def test_op_sac_replays_the_matmuls_torchtitan_does_not_keep_and_every_vector_op(block, fields):
    """torchtitan's op-level checkpointing keeps the output of the odd-numbered matmuls of a block,
    of the attention kernel and of the tp reduce-scatters: a replay holds the layer's vector ops
    whole and each GEMM node at the share of its matmuls that are even-numbered."""
    model, shares = OP_SAC_REPLAYS[block]
    none = _graph(model, global_batch=2, **fields)
    sac = _graph(model, global_batch=2, recompute="op-sac", **fields)
    replays = _ops(sac, phase="recompute")
    gemm = replays["op"].isin(GEMM_OPS)
    assert dict(zip(replays[gemm]["name"].str.removesuffix(".recompute"), replays[gemm]["repeat"], strict=True)) == (
        pytest.approx(shares)
    )
    assert set(replays[~gemm]["repeat"]) == {1.0}
    kept = {"attention", "reducescatter", *GEMM_OPS}
    expected = _ops(none, phase="fwd", scope="layer")
    vector_and_gathers = sorted(replays[~gemm]["name"].str.removesuffix(".recompute"))
    assert vector_and_gathers == sorted(expected[~expected["op"].isin(kept)]["name"])
    assert ("allgather" in set(replays["op"])) == ("tp" in fields)
    fwd_flops = _weighted_flops(none)[(none.nodes["phase"] == "fwd") & (none.nodes["scope"] == "layer")]
    by_name = fwd_flops.groupby(none.nodes["name"]).sum()
    replayed_gemm = sum(by_name[name] * share for name, share in shares.items())
    assert _flops(sac, GEMM_OPS) == pytest.approx(_flops(none, GEMM_OPS) + replayed_gemm, rel=1e-12)
    assert _flops(sac, ["attention"]) == _flops(none, ["attention"])


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mixtral-8x7b", {"moe_layer": {"attn.qkv": 1 / 6, "attn.out": 1.0, "moe.up": 1.0, "moe.down": 1.0}}),
        ("deepseek-v3", {  # latent attention q_down q_up kv_down kv_up out, then the MLP or router + shared
            "layer": {"attn.q_up": 1.0, "attn.kv_up": 1.0, "mlp.up": 0.5, "mlp.down": 1.0},
            "moe_layer": {"attn.q_up": 1.0, "attn.kv_up": 1.0, "moe.router": 1.0, "moe.shared_up": 0.5,
                          "moe.up": 1.0, "moe.down": 1.0},
        }),
    ],
)  # fmt: skip
def test_op_sac_replays_routed_experts_whole_and_counts_the_other_matmuls_per_layer(name, expected):
    """Each layer counts its own matmuls (latent attention's five, the router, the shared experts'
    gate-up and down); the routed experts' grouped matmuls are neither counted nor kept."""
    model = TransformerSpec.from_name(name)
    sac = _graph(model, ep=8, dp=8, global_batch=8, recompute="op-sac")
    replays = _ops(sac, phase="recompute")
    gemm = replays[replays["op"].isin(GEMM_OPS)]
    for scope, shares in expected.items():
        got = gemm[gemm["scope"] == scope]
        names = got["name"].str.removesuffix(".recompute")
        assert dict(zip(names, got["repeat"], strict=True)) == pytest.approx(shares)


def test_data_parallelism_splits_the_tokens():
    one, four = _graph(global_batch=8), _graph(dp=4, global_batch=8)
    assert one.num_microbatches == 8 and four.num_microbatches == 2
    assert _flops(four, GEMM_OPS) == pytest.approx(_flops(one, GEMM_OPS) / 4, rel=1e-12)


# ------------------------------------------------------------------ parallelism ops


def test_no_parallelism_has_no_collectives():
    g = _graph()
    assert not g.nodes["op"].isin(COLLECTIVES).any()
    assert set(g.nodes["stream"]) == {"compute"}


def test_tp_without_sequence_parallelism_all_reduces():
    g = _graph(tp=2, global_batch=1)
    tokens, h = GPT.seq_len, GPT.hidden_size
    layer_comm = _ops(g, scope="layer", stream="comm")
    assert set(layer_comm["op"]) == {"allreduce"} and set(layer_comm["group"]) == {"tp"}
    assert (layer_comm["phase"] == "fwd").sum() == 2 and (layer_comm["phase"] == "bwd").sum() == 2
    assert set(layer_comm["bytes"]) == {tokens * h * 2}
    assert set(layer_comm["n_ranks"]) == {2} and set(layer_comm["ranks_per_node"]) == {2}
    # heads and FFN columns are split
    assert _ops(g, name="attn.core")["heads"].item() == GPT.num_heads // 2
    assert _ops(g, name="mlp.up")["n"].item() == GPT.ffn_size // 2
    assert _ops(g, name="attn.norm")["rows"].item() == tokens


def test_tp_without_sequence_parallelism_all_reduces_the_head_input_gradient():
    # Megatron's LM head copies its input to the tp ranks (identity forward, all-reduce backward)
    g = _graph(tp=2, global_batch=1)
    head = _ops(g, scope="last_stage", stream="comm")
    assert list(zip(head["phase"], head["op"], head["group"], strict=False)) == [("bwd", "allreduce", "tp")]
    assert head["bytes"].item() == GPT.seq_len * GPT.hidden_size * 2


def test_tp_with_sequence_parallelism_gathers_and_scatters():
    g = _graph(tp=2, sequence_parallel=True, global_batch=1)
    layer_comm = _ops(g, scope="layer", stream="comm")
    fwd, bwd = layer_comm[layer_comm["phase"] == "fwd"], layer_comm[layer_comm["phase"] == "bwd"]
    assert sorted(fwd["op"]) == ["allgather", "allgather", "reducescatter", "reducescatter"]
    assert sorted(bwd["op"]) == ["allgather", "allgather", "reducescatter", "reducescatter"]
    assert "allreduce" not in set(g.nodes["op"])
    assert set(layer_comm["group"]) == {"tp"}
    # norms and residual adds work on tokens / tp rows
    for name in ("attn.norm", "attn.residual", "mlp.norm", "mlp.residual"):
        assert _ops(g, name=name)["rows"].item() == GPT.seq_len // 2
    assert _ops(g, name="mlp.up")["m"].item() == GPT.seq_len


def test_context_parallelism_exchanges_kv_beside_attention():
    g = _graph(cp=2, global_batch=1)
    n = g.nodes
    exch = _ops(g, name="attn.cp_exchange").iloc[0]
    core = _ops(g, name="attn.core").iloc[0]
    assert exch["op"] == "allgather" and exch["group"] == "cp" and exch["n_ranks"] == 2
    assert exch["overlap_with"] == core["node"]
    s_rank = GPT.seq_len // 2
    assert exch["bytes"] == 2 * s_rank * GPT.kv_heads * GPT.head_size * 2 * 2  # K and V of every cp rank
    assert (core["seq_q"], core["seq_kv"]) == (s_rank, GPT.seq_len)
    qkv = _ops(g, name="attn.qkv")["node"].item()
    edges = set(zip(g.edges["src"], g.edges["dst"], strict=False))
    assert {(qkv, exch["node"]), (exch["node"], core["node"])} <= edges
    bwd = _ops(g, name="attn.cp_exchange.bwd").iloc[0]
    assert bwd["bytes"] == 2 * exch["bytes"] and bwd["group"] == "cp"
    assert n.loc[bwd["overlap_with"], "name"] == "attn.core.bwd"
    # K/V are at hand for recomputation: no second exchange
    full = _graph(cp=2, global_batch=1, recompute="full")
    assert len(_ops(full, group="cp")) == 2


WINDOWED = GPT.model_copy(update={"sliding_window": 64, "sliding_window_layers": 2})
LONG_WINDOW = GPT.model_copy(update={"sliding_window": GPT.seq_len, "sliding_window_layers": 4})
LATENT = TransformerSpec.from_hf_config(Path(__file__).parents[1] / "fixtures" / "hf_configs" / "deepseek_v3.json")


@pytest.mark.parametrize(
    ("model", "fields"),
    [(GPT, {}), (WINDOWED, {}), (LONG_WINDOW, {}), (GPT, {"document_tokens": 100}), (GPT, {"document_tokens": 60}),
     (WINDOWED, {"document_tokens": 48, "cp": 2}), (TransformerSpec.from_name("gpt3-1.3b"), {}),
     (LATENT.model_copy(update={"seq_len": 4096}), {})],
    ids=["dense", "window", "window-as-long-as-the-sequence", "packed-100", "packed-60", "packed-window-cp",
         "gpt3-1.3b", "latent-attention"],
)  # fmt: skip
def test_forward_attention_flops_are_a_third_of_the_model_flops_attention_term(model, fields):
    from perfcast.models.analytic import attention_flops_per_token

    g = _graph(model, global_batch=2, micro_batch=2, **fields)
    p = ParallelConfig(global_batch=2, micro_batch=2, **fields)
    forward = _flops(g, ["attention"]) - float(_weighted_flops(g)[_ops(g, op="attention", phase="bwd").index].sum())
    tokens = 2 * model.seq_len // p.cp  # one rank's
    span = p.attention_documents(model.seq_len)[1]
    assert forward == pytest.approx(attention_flops_per_token(model, span) * tokens / 3, rel=0.02)  # documents round


def test_a_window_as_long_as_the_sequence_is_plain_causal_attention():
    pd.testing.assert_frame_equal(_graph(LONG_WINDOW, global_batch=1).nodes, _graph(GPT, global_batch=1).nodes)


@pytest.mark.parametrize("cp", [1, 2])
def test_packed_documents_run_attention_within_each_document(cp):
    whole = _graph(cp=cp, global_batch=2, micro_batch=2)
    packed = _graph(cp=cp, global_batch=2, micro_batch=2, document_tokens=GPT.seq_len // 4)
    core = _ops(packed, name="attn.core").iloc[0]
    assert (core["batch"], core["seq_q"], core["seq_kv"]) == (2 * 4, GPT.seq_len // 4 // cp, GPT.seq_len // 4)
    # attention FLOPs scale with the document length; nothing else changes
    assert _flops(packed, ["attention"]) == pytest.approx(_flops(whole, ["attention"]) / 4, rel=1e-12)
    others = [op for op in set(whole.nodes["op"]) if op != "attention"]
    assert _flops(packed, others) == pytest.approx(_flops(whole, others), rel=1e-12)
    assert len(packed.nodes) == len(whole.nodes)


def test_unfused_attention_ignores_packed_documents():
    whole = _graph(global_batch=1, flash_attention=False)
    packed = _graph(global_batch=1, flash_attention=False, document_tokens=GPT.seq_len // 4)
    pd.testing.assert_frame_equal(whole.nodes, packed.nodes)


@pytest.mark.parametrize("tokens", [GPT.seq_len + 1, 1])
def test_document_tokens_outside_cp_to_seq_len_raise(tokens):
    with pytest.raises(SpecError, match=f"document_tokens={tokens} must lie between cp=2"):
        _graph(cp=2, global_batch=1, document_tokens=tokens)


def test_expert_parallelism_all_to_alls_in_the_ep_group():
    mixtral = TransformerSpec.from_name("mixtral-8x7b").model_copy(update={"seq_len": 256})
    g = _graph(mixtral, dp=8, ep=4, global_batch=8)
    assert g.moe_layers_per_stage == 32 and g.dense_layers_per_stage == 0
    a2a = _ops(g, op="alltoall")
    assert set(a2a["group"]) == {"ep"} and set(a2a["n_ranks"]) == {4} and set(a2a["scope"]) == {"moe_layer"}
    assert sorted(a2a["name"]) == ["moe.combine", "moe.combine.bwd", "moe.dispatch", "moe.dispatch.bwd"]
    assert set(a2a["bytes"]) == {256 * mixtral.top_k * mixtral.hidden_size * 2}
    up = _ops(g, name="moe.up").iloc[0]
    assert up["op"] == "bmm" and up["batch"] == mixtral.num_experts // 4
    assert up["m"] == 256 * mixtral.top_k // 2  # balanced routing: token copies per local expert
    # expert gradients are synchronised over the dp*cp/ep ranks holding the same experts
    edp = _ops(g, group="edp")
    assert list(edp["op"]) == ["allreduce"] and edp["n_ranks"].item() == 2
    dense, expert = trainable_params_per_rank(mixtral, ParallelConfig(dp=8, ep=4, global_batch=8))
    assert edp["bytes"].item() == expert * 2
    assert _ops(g, group="dp")["bytes"].item() == dense * 2


@pytest.mark.parametrize("vpp", [1, 2])
def test_pipeline_parallelism_sends_and_receives(vpp):
    g = _graph(pp=2, vpp=vpp, global_batch=4)
    assert g.pp == 2 and g.vpp == vpp and g.dense_layers_per_stage == GPT.num_layers // 2
    sr = _ops(g, op="sendrecv")
    assert list(sr["phase"]) == ["fwd", "bwd"]
    assert set(sr["group"]) == {"pp"} and set(sr["scope"]) == {"stage"}
    assert set(sr["repeat"]) == {vpp} and set(sr["n_ranks"]) == {2}
    assert set(sr["bytes"]) == {GPT.seq_len * GPT.hidden_size * 2}


def test_zero0_all_reduces_gradients():
    g = _graph(dp=2, global_batch=2)
    sync = _ops(g, scope="step", stream="comm")
    assert list(sync["op"]) == ["allreduce"] and sync["group"].item() == "dp" and sync["n_ranks"].item() == 2
    dense, _ = trainable_params_per_rank(GPT, ParallelConfig(dp=2, global_batch=2))
    assert sync["bytes"].item() == dense * 2
    assert _ops(g, op="optimizer")["cols"].item() == dense


@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_reduce_scatters_gradients_and_gathers_parameters(stage):
    g = _graph(dp=2, global_batch=2, zero_stage=stage)
    sync = _ops(g, scope="step", stream="comm")
    assert list(sync["op"]) == ["reducescatter", "allgather"]
    assert "zero3.param_gather" not in set(g.nodes["name"])
    dense, _ = trainable_params_per_rank(GPT, ParallelConfig(dp=2, global_batch=2))
    assert _ops(g, op="optimizer")["cols"].item() == dense // 2


def test_zero3_gathers_every_layers_parameters():
    g = _graph(dp=2, global_batch=2, zero_stage=3)
    gathers = _ops(g, name=["zero3.param_gather", "zero3.param_gather.bwd"])
    assert list(gathers["phase"]) == ["fwd", "bwd"] and set(gathers["op"]) == {"allgather"}
    assert set(gathers["scope"]) == {"layer"} and set(gathers["group"]) == {"dp"}
    layer = GPT.attention_params_per_layer + GPT.mlp_params_per_layer
    assert set(gathers["bytes"]) == {layer * 2}
    assert list(_ops(g, scope="step", stream="comm")["op"]) == ["reducescatter"]


def test_zero3_gathers_a_ranks_own_experts_over_the_expert_data_parallel_ranks_only():
    mixtral = TransformerSpec.from_name("mixtral-8x7b").model_copy(update={"seq_len": 256})
    dense = mixtral.attention_params_per_layer + mixtral.router_params_per_layer
    experts = mixtral.num_experts * mixtral.expert_params
    # ep spans the data-parallel ranks (edp = 1): the experts are whole on their rank
    g = _graph(mixtral, dp=8, ep=8, global_batch=8, zero_stage=3)
    assert set(_ops(g, name="zero3.param_gather")["bytes"]) == {dense * 2}
    # edp = 2 of dp = 8: the rank's experts weighted by the ring factor (1/2) / (7/8)
    g = _graph(mixtral, dp=8, ep=4, global_batch=8, zero_stage=3)
    want = dense + experts / 4 * (1 / 2) / (7 / 8)
    assert set(_ops(g, name="zero3.param_gather")["bytes"]) == {round(want) * 2}
    # without expert parallelism the whole layer is sharded over dp, as a dense layer's
    g = _graph(mixtral, dp=8, global_batch=8, zero_stage=3)
    assert set(_ops(g, name="zero3.param_gather")["bytes"]) == {(dense + experts) * 2}


def test_tied_embeddings_with_pipeline_sync_the_embedding_gradient():
    tied = GPT.model_copy(update={"tied_embeddings": True})
    g = _graph(tied, pp=2, global_batch=2)
    sync = _ops(g, name="embedding.grad_sync")
    assert sync["op"].item() == "allreduce" and sync["group"].item() == "emb" and sync["n_ranks"].item() == 2
    assert sync["bytes"].item() == padded_vocab_size(tied, 1) * tied.hidden_size * 2
    assert "embedding.grad_sync" not in set(_graph(GPT, pp=2, global_batch=2).nodes["name"])
    assert "embedding.grad_sync" not in set(_graph(tied, global_batch=2).nodes["name"])


def test_lora_trains_only_the_adapters():
    rank = 8
    g = _graph(finetune="lora", lora_rank=rank, dp=2, global_batch=2)
    names = g.nodes["name"]
    wgrads = names[names.str.endswith(".wgrad")]
    assert len(wgrads) and wgrads.str.contains(".lora_", regex=False).all()
    lora_fwd = _ops(g, phase="fwd")["name"]
    assert sorted(lora_fwd[lora_fwd.str.contains("lora")]) == [
        "attn.out.lora_a",
        "attn.out.lora_b",
        "attn.qkv.lora_a",
        "attn.qkv.lora_b",
    ]
    assert "embedding.bwd" not in set(names)
    h, q = GPT.hidden_size, GPT.num_heads * GPT.head_size
    qkv_out = (GPT.num_heads + 2 * GPT.kv_heads) * GPT.head_size
    params = GPT.num_layers * rank * (h + qkv_out + q + h)
    assert _ops(g, op="optimizer")["cols"].item() == params
    assert _ops(g, group="dp")["bytes"].item() == params * 2


CONFIGS = {
    "dense": dict(global_batch=2, micro_batch=2),
    "tp": dict(tp=2, global_batch=1),
    "tp_sp": dict(tp=2, sequence_parallel=True, global_batch=1, recompute="selective"),
    "cp": dict(cp=2, tp=2, global_batch=1),
    "pp_vpp": dict(pp=2, vpp=2, dp=2, global_batch=8),
    "zero3_full_recompute": dict(dp=4, zero_stage=3, recompute="full", global_batch=4),
    "lora": dict(finetune="lora", lora_rank=4, tp=2, global_batch=1),
    "fp8": dict(dtype="fp8", dp=2, global_batch=2),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_graph_invariants(name):
    g = _graph(**CONFIGS[name])
    n = g.nodes
    assert list(n.columns) == [*NODE_COLUMNS, "flops", "mem_bytes"]
    assert list(n["node"]) == list(range(len(n)))
    # one optimizer step per step
    assert (n["op"] == "optimizer").sum() == 1
    assert _ops(g, op="optimizer")["scope"].item() == "step"
    # collectives run on the comm stream, in a group, with a message
    comm = n[n["op"].isin(COLLECTIVES)]
    assert (comm["stream"] == "comm").all() and (comm["group"] != "").all()
    assert (comm["bytes"] > 0).all() and (comm["n_ranks"] >= 2).all()
    assert (n.loc[~n["op"].isin(COLLECTIVES), "stream"] == "compute").all()
    # overlap targets are compute nodes
    targets = n.loc[n["overlap_with"] >= 0, "overlap_with"]
    assert (n.loc[targets, "stream"] == "compute").all()
    # edges reference nodes and point forward: a DAG
    e = g.edges
    assert set(e["src"]) | set(e["dst"]) <= set(n["node"])
    assert (e["src"] < e["dst"]).all()
    assert set(e["src"]) | set(e["dst"]) == set(n["node"])  # no isolated node
    # FLOPs and bytes are there
    assert (n["flops"] >= 0).all() and (n["mem_bytes"] > 0).all()
    assert (n.loc[n["op"].isin(GEMM_OPS), "flops"] > 0).all()


def test_the_residual_adds_of_a_layer_are_one_op():
    # equal shape columns: the composer predicts the two adds as one distinct op
    adds = _ops(_graph(), name=["attn.residual", "mlp.residual"])
    assert len(adds) == 2
    assert adds[list(SHAPE_COLUMNS)].drop_duplicates().shape[0] == 1


def test_invalid_layout_raises():
    with pytest.raises(SpecError, match="does not equal num_gpus"):
        build_workload_graph(GPT, ParallelConfig(tp=2, global_batch=1), ClusterSpec.build("h100-sxm5-80gb", 4))


# ------------------------------------------------------------------ helpers


@pytest.mark.parametrize(
    ("stride", "size", "per_node", "expected"),
    [(1, 8, 8, 8), (1, 16, 8, 8), (2, 4, 8, 4), (4, 4, 8, 2), (8, 4, 8, 1), (16, 4, 8, 1), (3, 1, 8, 1)],
)
def test_group_ranks_per_node(stride, size, per_node, expected):
    assert group_ranks_per_node(stride, size, per_node) == expected


def test_trainable_params_per_rank_dense():
    p = ParallelConfig(global_batch=1)
    dense, expert = trainable_params_per_rank(GPT, p)
    padding = (padded_vocab_size(GPT, 1) - GPT.vocab_size) * GPT.hidden_size
    # untied: the padding is in both the embedding and the LM head; the final norm is not counted
    assert dense == GPT.num_params - GPT.final_norm_params + 2 * padding and expert == 0
    tp2, _ = trainable_params_per_rank(GPT, ParallelConfig(tp=2, global_batch=1))
    assert tp2 == dense // 2


def test_trainable_params_per_rank_moe_splits_experts_over_ep():
    mixtral = TransformerSpec.from_name("mixtral-8x7b")
    _, expert = trainable_params_per_rank(mixtral, ParallelConfig(dp=8, ep=4, global_batch=8))
    assert expert == mixtral.num_layers * mixtral.moe_params_per_layer // 4


def test_unfused_attention_keeps_both_gradients_under_lora():
    g = _graph(finetune="lora", lora_rank=4, flash_attention=False, global_batch=1)
    names = set(g.nodes["name"])
    assert {"attn.core.scores.wgrad", "attn.core.context.wgrad"} <= names


# ------------------------------------------------------------------ column-wise construction

MOE = TransformerSpec(
    name="moe-test", num_layers=4, hidden_size=256, num_heads=4, vocab_size=500, seq_len=128, num_experts=4, top_k=2
)
VARIED = {
    **CONFIGS,
    "unfused_attention": dict(flash_attention=False, tp=2, global_batch=1),
    "op_sac_tp_overlap": dict(tp=2, sequence_parallel=True, tp_comm_overlap=True, recompute="op-sac", global_batch=1),
    "lora_unfused_full_recompute": dict(
        finetune="lora", lora_rank=8, flash_attention=False, recompute="full", global_batch=1
    ),
    "fp32_pp_zero1": dict(dtype="fp32", pp=2, dp=2, zero_stage=1, global_batch=4),
    "moe_ep": dict(model=MOE, ep=2, dp=2, tp=2, sequence_parallel=True, global_batch=4),
}


def _graph_row_by_row(rows: list[dict]) -> pd.DataFrame:
    """The node frame as the workload graph built it before it went column-wise: from records, via the frame path."""
    nodes = pd.DataFrame(rows).reindex(columns=list(NODE_COLUMNS))
    ints = [c for c in NODE_COLUMNS if c not in ("name", "scope", "phase", "stream", "group", "op", "dtype")]
    flags = ["scalar", "causal", "backward"]
    ints = [c for c in ints if c not in (*flags, "repeat")]
    nodes[ints] = nodes[ints].fillna(0).astype("int64")
    nodes["repeat"] = nodes["repeat"].fillna(0).astype(float)  # occurrences per layer: half for op-sac's GEMM replays
    nodes[flags] = nodes[flags].astype("boolean").fillna(False).astype(bool)
    nodes["flops"] = op_flops(nodes)
    nodes["mem_bytes"] = op_memory_bytes(nodes)
    return nodes


@pytest.mark.parametrize("name", list(VARIED))
def test_column_wise_graph_equals_the_row_by_row_frame(name, monkeypatch):
    fields = dict(VARIED[name])
    model = fields.pop("model", GPT)
    seen: list[list[dict]] = []
    columns = node_builder.NodeBuilder.columns

    def spy(self):
        seen.append([dict(r) for r in self.rows])
        return columns(self)

    monkeypatch.setattr(node_builder.NodeBuilder, "columns", spy)
    g = _graph(model, **fields)
    expected = _graph_row_by_row(seen[0])
    pd.testing.assert_frame_equal(g.nodes, expected, check_exact=True)
    for col in expected.columns:  # the cached arrays agree with the frame
        np.testing.assert_array_equal(g.column(col), expected[col].to_numpy())
    assert g.num_nodes == len(expected)
    # a graph given frames answers the same
    framed = WorkloadGraph(g.nodes, g.edges, g.dense_layers_per_stage, g.moe_layers_per_stage,
                           g.num_microbatches, g.pp, g.vpp)  # fmt: skip
    np.testing.assert_array_equal(framed.column("flops"), g.column("flops"))
    assert _weighted_flops(framed).sum() == _weighted_flops(g).sum()


def _body_rows(columns: dict) -> list[tuple]:
    """A body's nodes as sorted tuples of every column but the node id and name (order-free);
    ``overlap_with`` as the name of the node it names."""
    names = [n for n in NODE_COLUMNS if n not in ("node", "name")]
    body = columns["scope"] != "step"
    picked = {n: np.asarray(columns[n])[body] for n in names}
    overlap = picked["overlap_with"]
    picked["overlap_with"] = np.where(overlap >= 0, np.asarray(columns["name"])[np.clip(overlap, 0, None)], "")
    return sorted(zip(*(picked[n].tolist() for n in names), strict=True))


MOE = TransformerSpec(name="moe-test", num_layers=4, hidden_size=512, num_heads=8, vocab_size=1000, seq_len=256,
                num_experts=4, top_k=2)  # fmt: skip
VARIANT_LAYOUTS = [
    (GPT, {"tp": 2, "sequence_parallel": True, "dp": 2}),
    (GPT, {"pp": 2, "dp": 2, "micro_batch": 2}),
    (GPT, {"tp": 2, "pp": 2, "cp": 2, "flash_attention": False}),
    (GPT, {"pp": 2, "dp": 4, "zero_stage": 3}),
    (GPT, {"tp": 2, "dp": 2, "finetune": "lora", "lora_rank": 8}),
    (MOE, {"tp": 2, "pp": 2, "dp": 2, "ep": 2, "sequence_parallel": True}),
]


@pytest.mark.parametrize(("model", "fields"), VARIANT_LAYOUTS)
@pytest.mark.parametrize("recompute", ["none", "selective", "op-sac", "full"])
def test_body_variant_gives_the_graphs_nodes(model, fields, recompute):
    """A body built without recomputation (vpp 1), varied, holds the built graph's nodes."""
    from perfcast.features.parallel import Recompute
    from perfcast.features.workload import body_variant, replay_weights

    fields = {**fields, "global_batch": 4 * fields.get("dp", 1) * fields.get("micro_batch", 1)}
    base = _graph(model, **fields)
    n = int((base.column("scope") != "step").sum())
    nodes = {name: base.column(name)[:n] for name in NODE_COLUMNS}
    for vpp in (1, 2) if fields.get("pp", 1) > 1 else (1,):
        target = _graph(model, **fields, vpp=vpp, recompute=recompute)
        source, changed = body_variant(nodes, vpp, replay_weights(nodes, Recompute(recompute)))
        variant = {name: changed.get(name, nodes[name][source]) for name in NODE_COLUMNS}
        assert _body_rows(variant) == _body_rows({name: target.column(name) for name in NODE_COLUMNS})


def test_configs_with_one_body_key_share_their_body_nodes():
    from perfcast.features.workload import body_structure_key

    one = ParallelConfig(tp=2, pp=2, dp=2, zero_stage=0, global_batch=4)
    other = ParallelConfig(tp=2, pp=2, dp=4, zero_stage=1, global_batch=32)  # dp, ZeRO below 3, batch differ
    clusters = [ClusterSpec.build("h100-sxm5-80gb", p.world_size, 4) for p in (one, other)]
    assert body_structure_key(one, 4) == body_structure_key(other, 4)
    graphs = [build_workload_graph(GPT, p, c) for p, c in zip((one, other), clusters, strict=True)]
    assert _body_rows({n: graphs[0].column(n) for n in NODE_COLUMNS}) == _body_rows(
        {n: graphs[1].column(n) for n in NODE_COLUMNS}
    )
    assert body_structure_key(ParallelConfig(tp=2, pp=2, dp=1, global_batch=4), 4) != body_structure_key(one, 4)
    zero3 = ParallelConfig(tp=2, pp=2, dp=2, zero_stage=3, global_batch=4)
    assert body_structure_key(zero3, 4) != body_structure_key(one, 4)


# ------------------------------------------------------------------ uneven pipeline stages


def test_layers_per_rank_follow_the_pipeline_split():
    from perfcast.features.workload import layers_per_rank

    model = GPT.model_copy(update={"num_layers": 7})
    p = ParallelConfig(pp=3, global_batch=3)
    assert layers_per_rank(model, p) == ((2, 0), (3, 0), (2, 0))  # 7 + embedding + loss over 3 stages
    g = _graph(model, pp=3)
    assert g.stage_layers == ((2, 0), (3, 0), (2, 0))
    assert (g.dense_layers_per_stage, g.moe_layers_per_stage) == (3, 0)
    assert _graph(GPT, pp=2).stage_layers is None  # even: every rank holds the busiest stage's layers


def test_moe_layers_per_rank_take_the_models_share_rounded_up():
    from perfcast.features.workload import layers_per_rank

    moe = TransformerSpec(num_layers=12, hidden_size=512, num_heads=8, vocab_size=1000, ffn_hidden_size=1024,
                    num_experts=4, top_k=2, moe_layer_freq=2)  # fmt: skip
    even = layers_per_rank(moe, ParallelConfig(pp=4, global_batch=4))
    assert even == ((1, 2),) * 4  # the even rule of old: ceil(6 / 4) MoE layers per stage
    uneven = layers_per_rank(moe, ParallelConfig(pp=2, global_batch=2, first_stage_layers=5, last_stage_layers=7))
    assert uneven == ((2, 3), (3, 4))  # ceil(5 * 6 / 12), ceil(7 * 6 / 12)


def test_trainable_params_of_uneven_ranks():
    model = GPT.model_copy(update={"num_layers": 7})
    p = ParallelConfig(pp=3, global_batch=3)
    per_layer = model.attention_params_per_layer + model.mlp_params_per_layer + model.norm_params_per_layer
    vocab = padded_vocab_size(model, 1) * model.hidden_size
    ranks = [trainable_params_per_rank(model, p, rank=r)[0] for r in range(3)]
    assert ranks[1] == 3 * per_layer
    assert ranks[0] == 2 * per_layer + model.embedding_params - model.vocab_size * model.hidden_size + vocab
    assert ranks[2] == 2 * per_layer + vocab
    assert trainable_params_per_rank(model, p)[0] == max(ranks)
