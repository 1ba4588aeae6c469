"""Layout enumeration for the search."""

from __future__ import annotations

import pytest

from perfcast.errors import SpecError
from perfcast.features.hardware import ClusterSpec
from perfcast.features.layouts import LayoutSpace, enumerate_layouts
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import Recompute, check_layout


@pytest.fixture(scope="module")
def llama() -> TransformerSpec:
    return TransformerSpec.load("llama2-7b")


def test_every_layout_is_valid_and_unique(llama: TransformerSpec) -> None:
    cluster = ClusterSpec.build("a100-sxm4-80gb", 16, 8)
    layouts = list(enumerate_layouts(llama, cluster, 64))
    assert layouts
    for p in layouts:
        check_layout(llama, p, cluster)
        assert p.global_batch == 64
        assert p.sequence_parallel == (p.tp > 1)
    assert len(set(layouts)) == len(layouts)


def test_space_covers_the_degrees_practitioners_try(llama: TransformerSpec) -> None:
    cluster = ClusterSpec.build("a100-sxm4-80gb", 16, 8)
    layouts = list(enumerate_layouts(llama, cluster, 64))
    assert {p.tp for p in layouts} == {1, 2, 4, 8}  # 16-way tp would cross nodes
    assert {1, 2, 4, 8, 16} <= {p.pp for p in layouts}
    assert {p.recompute for p in layouts} == {Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL}  # Megatron's
    assert any(p.vpp > 1 for p in layouts) and all(p.pp > 1 for p in layouts if p.vpp > 1)
    assert all(p.zero_stage == 0 for p in layouts if p.dp * p.cp == 1)  # ZeRO shards over dp * cp ranks
    assert any(p.zero_stage == 1 for p in layouts if p.dp == 1 and p.cp > 1)


def test_micro_batch_must_fit_the_global_batch(llama: TransformerSpec) -> None:
    cluster = ClusterSpec.build("a100-sxm4-80gb", 8, 8)
    layouts = list(enumerate_layouts(llama, cluster, 8, space=LayoutSpace(micro_batches=(1, 2, 4, 8))))
    assert all(8 % (p.dp * p.micro_batch) == 0 for p in layouts)
    assert max(p.dp * p.micro_batch for p in layouts) == 8


def test_moe_models_get_expert_parallel_layouts() -> None:
    model = TransformerSpec.load("mixtral-8x7b")
    cluster = ClusterSpec.build("h100-sxm5-80gb", 16, 8)
    space = LayoutSpace(micro_batches=(1,), recompute=(Recompute.FULL,), vpp=(1,), cp=(1,))
    eps = {p.ep for p in enumerate_layouts(model, cluster, 32, space=space)}
    assert eps == {1, 2, 4, 8}


def test_narrow_space_and_bad_input(llama: TransformerSpec) -> None:
    cluster = ClusterSpec.build("a100-sxm4-80gb", 8, 8)
    space = LayoutSpace(micro_batches=(1,), cp=(1,), vpp=(1,), recompute=(Recompute.NONE,), zero_stages=(0,),
                        max_tp=1, max_pp=1)  # fmt: skip
    assert [(p.tp, p.pp, p.dp) for p in enumerate_layouts(llama, cluster, 8, space=space)] == [(1, 1, 8)]
    with pytest.raises(SpecError, match="global_batch=0"):
        list(enumerate_layouts(llama, cluster, 0))
    with pytest.raises(SpecError, match="zero_stages"):
        LayoutSpace(zero_stages=(4,))
    with pytest.raises(SpecError, match="micro_batches is empty"):
        LayoutSpace(micro_batches=())


def test_replicate_per_domain_adds_one_replica_per_nvlink_domain_to_sharded_layouts(llama: TransformerSpec) -> None:
    cluster = ClusterSpec.build("h100-sxm5-80gb", 32, 8)
    space = LayoutSpace(zero_stages=(0, 3), replicate_per_domain=True, micro_batches=(1,), cp=(1,), vpp=(1,))
    layouts = list(enumerate_layouts(llama, cluster, 64, space=space))
    replicated = [p for p in layouts if p.dp_replicate > 1]
    assert replicated and all(p.zero_stage == 3 for p in replicated)
    assert all(p.tp * p.zero_shard_ranks == 8 for p in replicated)  # a replica fills one 8-GPU node
    twins = {(p.tp, p.pp, p.recompute) for p in replicated}
    assert twins <= {(p.tp, p.pp, p.recompute) for p in layouts if p.dp_replicate == 1 and p.zero_stage == 3}
    assert not [p for p in enumerate_layouts(llama, cluster, 64, space=LayoutSpace()) if p.dp_replicate > 1]
