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


def test_one_replica_is_the_fully_sharded_graph_and_memory() -> None:
    for zero in (1, 2, 3):
        full, one = layout(dp=16, zero_stage=zero), layout(dp=16, zero_stage=zero, dp_replicate=1)
        cluster = ClusterSpec.build(H100, 16)
        assert build_workload_graph(GPT, full, cluster).nodes.equals(build_workload_graph(GPT, one, cluster).nodes)
    sharded = step_comm(GPT, layout(dp=16, zero_stage=3))
    assert list(sharded["op"]) == ["reducescatter"] and list(sharded["n_ranks"]) == [16]


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
