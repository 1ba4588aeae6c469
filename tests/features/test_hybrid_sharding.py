"""Hybrid-sharded ZeRO (``dp_replicate``): state sharded inside a replica, replicated across replicas."""

from __future__ import annotations

import pandas as pd
import pytest

from perfcast.errors import SpecError
from perfcast.features.hardware import ClusterSpec
from perfcast.features.memory import peak_memory
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import ParallelConfig
from perfcast.features.placement import DP_REPLICATE, DP_SHARD, EXPERT_DP_REPLICATE, EXPERT_DP_SHARD, group_placement
from perfcast.features.run_config import parse_run_row
from perfcast.features.workload import build_workload_graph, trainable_params_per_rank
from perfcast.serve.python_api import predict_steps

GPT = TransformerSpec(name="gpt-test", num_layers=4, hidden_size=512, num_heads=8, vocab_size=1000, seq_len=256)
MOE = TransformerSpec(num_layers=4, hidden_size=512, num_heads=8, vocab_size=1000, num_experts=64, top_k=2,
                      gated_mlp=True, moe_ffn_hidden_size=256, seq_len=256)  # fmt: skip
H100 = "h100-sxm5-80gb"


def layout(**kw) -> ParallelConfig:
    kw.setdefault("global_batch", kw.get("dp", 1))
    return ParallelConfig(**kw)


def step_comm(model: TransformerSpec, p: ParallelConfig, gpus_per_node: int = 8) -> pd.DataFrame:
    """The step-scope collectives of the config's graph, with their sizes and placement."""
    g = build_workload_graph(model, p, ClusterSpec.build(H100, p.world_size, gpus_per_node))
    n = g.nodes
    return n[(n["scope"] == "step") & (n["op"] != "optimizer")][["name", "op", "bytes", "n_ranks", "ranks_per_node"]]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"dp": 16, "dp_replicate": 2}, r"dp_replicate=2 replicates ZeRO-sharded state, but zero_stage=0"),
        (
            {"dp": 12, "zero_stage": 3, "dp_replicate": 8},
            r"dp_replicate=8 does not divide dp\*cp=12\*1=12.*"
            r"allowed: a divisor of 12",
        ),
        (
            {"tp": 2, "dp": 8, "ep": 16, "zero_stage": 1, "dp_replicate": 2},
            r"dp_replicate=2 does not divide the expert-data-parallel ranks edp=.*=1",
        ),
    ],
)
def test_bad_replication_names_the_field_the_value_and_what_is_allowed(kw, message) -> None:
    with pytest.raises((SpecError, ValueError), match=message):
        layout(**kw)


def test_shard_ranks_are_consecutive_and_replicas_one_replica_apart() -> None:
    p = layout(tp=2, dp=64, zero_stage=3, dp_replicate=16)  # replicas of 4 dp ranks = 8 GPUs
    assert (p.zero_shard_ranks, p.expert_shard_ranks) == (4, 8)  # no experts: edp = tp*dp
    place = group_placement(p, 8)
    assert place[DP_SHARD] == (4, 4)  # one 8-GPU node holds a replica
    assert place[DP_REPLICATE] == (16, 1)  # the replicas of a shard sit in 16 nodes
    moe = layout(tp=2, dp=16, ep=4, zero_stage=1, dp_replicate=4)  # edp = 8: expert shards of 2
    assert group_placement(moe, 8)[EXPERT_DP_SHARD] == (2, 2)  # stride ep*etp = 4: both in one node
    assert group_placement(moe, 8)[EXPERT_DP_REPLICATE] == (4, 1)


def test_full_sharding_syncs_over_every_data_parallel_rank() -> None:
    sharded = step_comm(GPT, layout(dp=16, zero_stage=3))
    assert list(sharded["op"]) == ["reducescatter"] and list(sharded["n_ranks"]) == [16]


def test_context_parallel_ranks_shard_with_the_data_parallel_ones() -> None:
    p = layout(dp=8, cp=2, zero_stage=1, dp_replicate=4)  # dp*cp = 16 ranks: 4 replicas of 4
    comm = step_comm(GPT, p).set_index("name")
    assert comm.loc["dp.grad_reducescatter", "n_ranks"] == 4
    assert comm.loc["dp.grad_replica_allreduce", ["n_ranks", "ranks_per_node"]].tolist() == [4, 2]


def test_moe_zero3_gathers_the_replicas_expert_shards() -> None:
    mixtral = TransformerSpec.from_name("mixtral-8x7b").model_copy(update={"seq_len": 256})
    p = layout(dp=32, ep=4, zero_stage=3, dp_replicate=4)  # shard 8 ranks, experts over edp/R = 2
    g = build_workload_graph(mixtral, p, ClusterSpec.build(H100, 32))
    dense = mixtral.attention_params_per_layer + mixtral.router_params_per_layer
    experts = mixtral.num_experts * mixtral.expert_params / 4
    want = dense + experts * (1 / 2) / (7 / 8)  # the experts' ring factor against the shard group's
    gathers = g.nodes[g.nodes["name"] == "zero3.param_gather"]
    assert set(gathers["bytes"]) == {round(want) * 2} and set(gathers["n_ranks"]) == {8}


@pytest.mark.parametrize("dp", [1, 8])
def test_experts_sharded_beyond_one_rank_shards_are_gathered_on_their_own_group(dp) -> None:
    p = layout(tp=2, dp=dp, zero_stage=3, dp_replicate=dp)  # dense shards of one rank; experts over tp's 2
    assert (p.zero_shard_ranks, p.expert_shard_ranks) == (1, 2)
    g = build_workload_graph(MOE, p, ClusterSpec.build(H100, 2 * dp))
    gathers = g.nodes[g.nodes["name"].str.startswith("zero3.param_gather")]
    assert gathers["phase"].tolist() == ["fwd", "bwd"] and set(gathers["scope"]) == {"moe_layer"}
    assert set(gathers["group"]) == {"edp"} and set(gathers["n_ranks"]) == {2} and set(gathers["ranks_per_node"]) == {2}
    assert set(gathers["bytes"]) == {MOE.num_experts * MOE.expert_params * 2}


def test_switches_count_only_where_there_is_something_to_gather() -> None:
    row = {"model": "llama2-7b", "dp": 8, "global_batch": 8, "gpu": H100, "num_gpus": 8, "dp_replicate": 8}
    titan = parse_run_row({**row, "framework": "torchtitan"})  # ZeRO-3 over one-rank replicas: no gathers
    assert "fsdp_prefetch" not in titan.defaulted
    megatron = parse_run_row({**row, "framework": "megatron-core"})
    assert "overlap_param_gather" not in megatron.defaulted and "overlap_grad_reduce" in megatron.defaulted
    assert "fsdp_prefetch" in parse_run_row({**row, "framework": "torchtitan", "dp_replicate": 2}).defaulted


def test_a_batch_predicts_each_replication_as_alone() -> None:
    """Configs that differ only in ``dp_replicate`` share no cached graph part."""
    rows = [{"model": "llama2-7b", "seq_len": 1024, "dp": 16, "global_batch": 16, "zero_stage": zero,
             "dp_replicate": r, "gpu": H100, "num_gpus": 16, "framework": "torchtitan"}
            for zero in (1, 3) for r in (1, 2, 16)]  # fmt: skip
    together = predict_steps(pd.DataFrame(rows), breakdown=True)
    alone = pd.concat([predict_steps(pd.DataFrame([row]), breakdown=True) for row in rows], ignore_index=True)
    for col in ("step_ms", "composed_step_ms", "peak_mem_gib", "optimizer_ms"):
        assert together[col].tolist() == pytest.approx(alone[col].tolist(), rel=1e-9)
    composed = together["composed_step_ms"]
    assert composed.nunique() == 5 and composed[2] == composed[5]  # one-rank replicas: plain data parallelism


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_gradients_reduce_scatter_in_a_replica_then_all_reduce_their_shard_across_replicas(zero) -> None:
    p = layout(dp=32, zero_stage=zero, dp_replicate=4)  # 4 replicas of 8 ranks, one node each
    dense, _ = trainable_params_per_rank(GPT, p)
    comm = step_comm(GPT, p).set_index("name")
    assert comm.loc["dp.grad_reducescatter", ["n_ranks", "ranks_per_node", "bytes"]].tolist() == [8, 8, dense * 2]
    allreduce = comm.loc["dp.grad_replica_allreduce"]
    assert allreduce["op"] == "allreduce"
    assert allreduce[["n_ranks", "ranks_per_node", "bytes"]].tolist() == [4, 1, dense // 8 * 2]
    assert ("dp.param_allgather" in comm.index) == (zero < 3)  # ZeRO-3 gathers layer by layer instead
    g = build_workload_graph(GPT, p, ClusterSpec.build(H100, 32))
    gathers = g.nodes[g.nodes["name"].str.startswith("zero3.param_gather")]
    assert set(gathers["n_ranks"]) == ({8} if zero == 3 else set())
    assert set(gathers["ranks_per_node"]) == ({8} if zero == 3 else set())
    optimizer = g.nodes.loc[g.nodes["op"] == "optimizer", "cols"].item()
    assert optimizer == dense // 8


def test_a_replica_of_one_rank_syncs_as_plain_data_parallelism() -> None:
    comm = step_comm(GPT, layout(dp=8, zero_stage=1, dp_replicate=8))
    assert comm["name"].tolist() == ["dp.grad_replica_allreduce"]
    plain = step_comm(GPT, layout(dp=8))
    assert comm[["op", "bytes", "n_ranks", "ranks_per_node"]].to_numpy().tolist() == \
        plain[["op", "bytes", "n_ranks", "ranks_per_node"]].to_numpy().tolist()  # fmt: skip


def test_memory_shards_over_one_replica() -> None:
    llama = TransformerSpec.from_name("llama2-7b")
    cluster = ClusterSpec.build(H100, 64)
    mem = {r: peak_memory(llama, layout(dp=64, zero_stage=3, dp_replicate=r), cluster) for r in (1, 8, 64)}
    unsharded = peak_memory(llama, layout(dp=64), cluster)
    for part in ("weights_gib", "grads_gib", "optimizer_gib"):
        assert getattr(mem[8], part) == pytest.approx(getattr(mem[1], part) * 8, rel=1e-12)
        assert getattr(mem[64], part) == pytest.approx(getattr(unsharded, part), rel=1e-12)
    assert mem[1].activations_gib == mem[8].activations_gib == mem[64].activations_gib


def test_moe_expert_state_shards_over_the_replicas_expert_ranks() -> None:
    cluster = ClusterSpec.build(H100, 32)
    full = peak_memory(MOE, layout(dp=32, ep=4, zero_stage=1), cluster)  # edp 8
    hybrid = peak_memory(MOE, layout(dp=32, ep=4, zero_stage=1, dp_replicate=2), cluster)  # shards 16, experts 4
    dense, expert = trainable_params_per_rank(MOE, layout(dp=32, ep=4))
    per_param = 12 / 2**30  # fp32 master weights and Adam moments of 16-bit training
    assert full.optimizer_gib == pytest.approx(per_param * (dense / 32 + expert / 8), rel=1e-12)
    assert hybrid.optimizer_gib == pytest.approx(per_param * (dense / 16 + expert / 4), rel=1e-12)


def test_run_rows_state_dp_replicate() -> None:
    row = {"model": "llama2-7b", "dp": 16, "global_batch": 16, "zero_stage": 3, "dp_replicate": 2, "gpu": H100,
           "num_gpus": 16, "framework": "torchtitan"}  # fmt: skip
    config = parse_run_row(row)
    assert config.parallel.dp_replicate == 2 and config.parallel.zero_shard_ranks == 8
    assert "dp_replicate" not in config.defaulted  # an absent degree means no replication, as for tp or ep
    with pytest.raises(SpecError, match="dp_replicate=3 does not divide"):
        parse_run_row({**row, "dp_replicate": 3})
    unsharded = {k: v for k, v in row.items() if k != "zero_stage"} | {"framework": "megatron-deepspeed"}  # default 0
    with pytest.raises(SpecError, match="zero_stage=0 shards nothing.*the framework's default"):
        parse_run_row(unsharded)
