"""Tests of the per-microbatch bodies the schedule reads (the schedule itself: test_schedule.py)."""

from __future__ import annotations

import numpy as np
import pytest

from perfcast.features.hardware import ClusterSpec
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import ParallelConfig, Recompute
from perfcast.features.schedule_bodies import BodyTemplate, segment_rows
from perfcast.features.workload import Scope, build_workload_graph

GPT = TransformerSpec(num_layers=8, hidden_size=512, num_heads=8, vocab_size=1000, seq_len=256)


def test_segment_rows_spell_the_chosen_segments():
    segments = [np.array([1, 2]), np.array([3]), np.array([4, 5, 6])]
    which = [2, 0, 2, 1]
    rows = segment_rows([len(s) for s in segments], which)
    np.testing.assert_array_equal(np.concatenate(segments)[rows], np.concatenate([segments[k] for k in which]))
    assert len(segment_rows([2, 1], [])) == 0


@pytest.mark.parametrize(
    "fields",
    [{"global_batch": 1}, {"pp": 2, "global_batch": 4}, {"tp": 2, "sequence_parallel": True, "global_batch": 1}],
)
def test_a_body_is_every_node_but_the_step_ones_each_in_one_stage_part(fields):
    p = ParallelConfig(**fields)
    graph = build_workload_graph(GPT, p, ClusterSpec.build("h100-sxm5-80gb", p.world_size))
    body = BodyTemplate.from_graph(graph)
    assert body.num_nodes == int((graph.column("scope") != Scope.STEP).sum())
    parts = body.arrays["body"].astype(int) + body.arrays["first"] + body.arrays["last"]
    np.testing.assert_array_equal(parts, 1)
    assert body.base is body
    np.testing.assert_array_equal(body.source, np.arange(body.num_nodes))


def test_a_variant_is_rows_of_its_base():
    p = ParallelConfig(pp=2, global_batch=4)
    base = BodyTemplate.from_graph(build_workload_graph(GPT, p, ClusterSpec.build("h100-sxm5-80gb", p.world_size)))
    variant = base.variant(1, Recompute.FULL)
    assert variant.base is base
    assert variant.num_nodes == len(variant.source) > base.num_nodes  # full recomputation replays the forward
    for name, values in variant.arrays.items():
        assert len(values) == variant.num_nodes, name
    assert base.variant(1, Recompute.FULL).num_nodes == variant.num_nodes  # the replay is cached per recompute
