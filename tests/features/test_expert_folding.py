"""Megatron-Core parallel folding: ep and etp over the tp x cp x dp ranks of a pipeline stage."""

from __future__ import annotations

import pytest

from perfcast.errors import SpecError
from perfcast.features.hardware import ClusterSpec
from perfcast.features.memory import peak_memory
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import ParallelConfig, check_layout
from perfcast.features.placement import EXPERT_TP, Group, group_placement
from perfcast.features.workload import build_workload_graph

MOE = TransformerSpec(num_layers=4, hidden_size=512, num_heads=8, vocab_size=1000, num_experts=64, top_k=2,
                gated_mlp=True, moe_ffn_hidden_size=256, seq_len=1024)  # fmt: skip
H100 = "h100-sxm5-80gb"


def layout(**kw) -> ParallelConfig:
    return ParallelConfig(**{"global_batch": 64, **kw})


def test_ep_folds_over_tp_cp_dp() -> None:
    p = layout(tp=4, dp=2, ep=8)  # ep > dp*cp: valid under folding
    check_layout(MOE, p, ClusterSpec.build(H100, 8))
    assert p.edp == 1
    assert layout(tp=2, cp=2, dp=4, ep=8, etp=2).edp == 1


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"tp": 2, "dp": 2, "ep": 8}, r"ep\*etp=8\*1=8 does not divide tp\*cp\*dp=2\*1\*2=4.*ep <= 4 at etp=1"),
        ({"tp": 2, "dp": 4, "ep": 4, "etp": 4}, r"ep\*etp=4\*4=16 does not divide tp\*cp\*dp=2\*1\*4=8"),
    ],
)
def test_invalid_folds_name_field_value_and_allowed(kw, message) -> None:
    with pytest.raises((SpecError, ValueError), match=message):
        layout(**kw)


def test_ep_and_etp_must_divide_the_model() -> None:
    cluster = ClusterSpec.build(H100, 8)
    with pytest.raises(SpecError, match="ep=8 does not divide num_experts=12; allowed: a divisor"):
        check_layout(MOE.model_copy(update={"num_experts": 12}), layout(dp=8, ep=8), cluster)
    with pytest.raises(SpecError, match="etp=8 does not divide the expert ffn size moe_ffn_hidden_size=100"):
        check_layout(MOE.model_copy(update={"moe_ffn_hidden_size": 100}), layout(dp=8, etp=8), cluster)
    dense = MOE.model_copy(update={"num_experts": 1, "top_k": 1})
    with pytest.raises(SpecError, match="etp=2 needs a mixture-of-experts model"):
        check_layout(dense, layout(dp=8, etp=2), cluster)


def test_expert_groups_are_placed_etp_innermost_then_ep_then_edp() -> None:
    p = layout(tp=2, dp=32, ep=16, etp=2)  # 64 ranks per stage
    place = group_placement(p, 8)
    assert place[EXPERT_TP] == (2, 2)
    assert place[Group.EP] == (16, 4)  # stride etp=2: 4 ep ranks per 8-GPU domain
    assert place[Group.EXPERT_DP] == (2, 1)  # stride 32: across domains
    assert group_placement(p, 72)[Group.EP] == (16, 16)  # NVL72: the all-to-all stays on NVLink


def test_etp_splits_expert_gemms_and_expert_state() -> None:
    cluster = ClusterSpec.build(H100, 16)
    one = build_workload_graph(MOE, layout(tp=2, dp=8, ep=8, sequence_parallel=True), cluster).nodes
    two = build_workload_graph(MOE, layout(tp=2, dp=8, ep=8, etp=2, sequence_parallel=True), cluster).nodes

    def first(nodes, name):
        return nodes[nodes["name"] == name].iloc[0]

    assert first(one, "moe.up")["n"] == 2 * 256 and first(two, "moe.up")["n"] == 256  # etp, not tp, splits
    assert first(one, "moe.dispatch")["bytes"] == 512 * 2 * 512 * 2  # the rank's t/tp tokens, top_k copies
    assert "moe.etp_gather" not in set(one["name"]) | set(two["name"])  # etp=1, or etp=tp (the tp gather serves)
    three = build_workload_graph(MOE, layout(tp=4, dp=4, ep=4, etp=2, sequence_parallel=True), cluster).nodes
    gather = first(three, "moe.etp_gather")
    assert (gather["group"], gather["n_ranks"], first(three, "moe.up")["n"]) == ("ep", 2, 256)
    # FLOPs of the experts are the same either way
    assert one[one["name"] == "moe.up"]["flops"].sum() == pytest.approx(two[two["name"] == "moe.up"]["flops"].sum())
    edp1 = build_workload_graph(MOE, layout(tp=2, dp=8, ep=8, sequence_parallel=True), cluster).nodes
    sync = edp1[edp1["name"] == "edp.grad_allreduce"].iloc[0]
    assert sync["n_ranks"] == 2  # tp*cp*dp / (ep*etp) = 16 / 8
    m1 = peak_memory(MOE, layout(tp=2, dp=8, ep=8), cluster)
    m2 = peak_memory(MOE, layout(tp=2, dp=8, ep=8, etp=2), cluster)
    assert m2.weights_gib < m1.weights_gib


def test_token_permutation_copies_the_routed_token_copies() -> None:
    """moe.permute / moe.unpermute copy the rank's t/tp * top_k token copies (not the etp-gathered
    ones), get a backward, stay unquantised under fp8 and are replayed under full recomputation."""
    cluster = ClusterSpec.build(H100, 16)
    p = layout(tp=4, dp=4, ep=4, etp=2, sequence_parallel=True, micro_batch=1)
    nodes = build_workload_graph(MOE, p, cluster).nodes
    tokens = MOE.seq_len // p.tp  # the rank's share: etp != tp
    for name in ("moe.permute", "moe.unpermute"):
        node = nodes[nodes["name"] == name].iloc[0]
        assert (node["op"], node["rows"], node["cols"], bool(node["scalar"])) == ("mul", tokens * 2, 512, True)
        assert nodes[nodes["name"] == f"{name}.bwd"]["backward"].astype(bool).all()
    gather = nodes[nodes["name"] == "moe.etp_gather"].iloc[0]
    assert gather["bytes"] == 2 * tokens * 2 * 512 * 2  # the etp gather moves twice the permuted copies
    fp8 = build_workload_graph(MOE, layout(dp=8, ep=8, dtype="fp8"), ClusterSpec.build(H100, 8)).nodes
    assert not fp8["name"].str.startswith("moe.permute.quantize").any()
    full = build_workload_graph(MOE, layout(dp=8, ep=8, recompute="full"), ClusterSpec.build(H100, 8)).nodes
    assert full["name"].str.fullmatch(r"moe\.permute\.recompute").any()
