"""Tests of the step composer: pipeline bubble, overlap rules, and the breakdown's sum."""

from __future__ import annotations

import numpy as np
import pytest

from perfcast.features.hardware import ClusterSpec
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import ParallelConfig
from perfcast.features.roofline import op_time_ms
from perfcast.features.schedule import (
    HOST_MS_PER_KERNEL,
    BodyTemplate,
    StepBreakdown,
    StepPlan,
    compose_step,
    step_breakdowns,
)
from perfcast.features.workload import WorkloadGraph, build_workload_graph

GPT = TransformerSpec(num_layers=8, hidden_size=512, num_heads=8, vocab_size=1000, seq_len=256)


def _setup(model: TransformerSpec = GPT, **fields) -> tuple[WorkloadGraph, ClusterSpec]:
    fields.setdefault("global_batch", fields.get("dp", 1))
    p = ParallelConfig(**fields)
    cluster = ClusterSpec.build("h100-sxm5-80gb", p.world_size)
    return build_workload_graph(model, p, cluster), cluster


def _layer_only_times(g: WorkloadGraph) -> tuple[np.ndarray, float]:
    """1 ms per layer node, 0 elsewhere; returns the times and one stage's microbatch time."""
    times = np.where(g.nodes["scope"] == "layer", 1.0, 0.0)
    stage = times.sum() * g.dense_layers_per_stage
    return times, stage


@pytest.mark.parametrize(("pp", "vpp"), [(4, 1), (4, 2), (2, 1), (2, 4)])
def test_one_f_one_b_bubble_for_equal_stages(pp, vpp):
    g, _ = _setup(pp=pp, vpp=vpp, global_batch=8)
    times, stage = _layer_only_times(g)
    step = compose_step(g, times)
    m = g.num_microbatches
    assert step.bubble_ms == pytest.approx((pp - 1) / vpp * stage, rel=1e-12)
    assert step.step_ms == pytest.approx(m * stage + (pp - 1) / vpp * stage, rel=1e-12)
    assert step.compute_ms + step.attention_ms == pytest.approx(m * stage, rel=1e-12)


def test_unequal_stages_take_the_slowest_plus_the_rest_over_v():
    g, _ = _setup(pp=4, global_batch=8)
    times, stage = _layer_only_times(g)
    times[(g.nodes["scope"] == "last_stage").to_numpy()] = 0.5  # LM head on the last stage only
    head = 0.5 * (g.nodes["scope"] == "last_stage").sum()
    step = compose_step(g, times)
    slowest, total = stage + head, 4 * stage + head
    assert step.step_ms == pytest.approx(8 * slowest + (total - slowest), rel=1e-12)


def test_no_bubble_without_pipeline():
    g, cluster = _setup(global_batch=4)
    assert compose_step(g, op_time_ms(g.nodes, cluster)).bubble_ms == 0.0


def _cp_times(g: WorkloadGraph, exchange_ms: float) -> np.ndarray:
    times = np.full(len(g.nodes), 0.1)
    names = g.nodes["name"]
    times[(names == "attn.core").to_numpy()] = 5.0
    times[(names == "attn.cp_exchange").to_numpy()] = exchange_ms
    times[(names == "attn.core.bwd").to_numpy()] = 10.0
    times[(names == "attn.cp_exchange.bwd").to_numpy()] = 2 * exchange_ms
    return times


def test_comm_shorter_than_its_overlapped_compute_adds_nothing():
    g, _ = _setup(cp=2, global_batch=1)
    hidden = compose_step(g, _cp_times(g, 3.0))
    free = compose_step(g, _cp_times(g, 0.0))
    assert hidden.step_ms == pytest.approx(free.step_ms, rel=1e-12)
    assert hidden.comm_ms.get("cp", 0.0) == 0.0
    assert hidden.compute_ms + hidden.attention_ms == pytest.approx(free.compute_ms + free.attention_ms, rel=1e-12)


def test_comm_longer_than_its_overlapped_compute_adds_the_excess():
    g, _ = _setup(cp=2, global_batch=1)
    slow = compose_step(g, _cp_times(g, 7.0))
    free = compose_step(g, _cp_times(g, 0.0))
    excess = (7.0 - 5.0) + (14.0 - 10.0)  # forward and backward exchange, per layer
    assert slow.step_ms - free.step_ms == pytest.approx(excess * g.dense_layers_per_stage, rel=1e-9)
    assert slow.comm_ms["cp"] == pytest.approx(excess * g.dense_layers_per_stage, rel=1e-9)


def test_tensor_parallel_comm_is_exposed():
    g, cluster = _setup(tp=2, global_batch=2)
    times = op_time_ms(g.nodes, cluster)
    step = compose_step(g, times)
    tp = (g.nodes["group"] == "tp").to_numpy()
    mult = g.nodes["scope"].map(g.scope_multiplicity()).to_numpy()
    assert step.comm_ms["tp"] == pytest.approx(g.num_microbatches * (times * mult)[tp].sum(), rel=1e-12)
    assert step.comm_ms["tp"] > 0


CONFIGS = {
    "dense": dict(global_batch=4, micro_batch=2),
    "tp_sp_dp": dict(tp=2, dp=2, sequence_parallel=True, global_batch=4),
    "pp_vpp": dict(pp=2, vpp=2, dp=2, global_batch=8, recompute="full"),
    "cp": dict(cp=2, dp=2, global_batch=2),
    "zero3": dict(dp=4, zero_stage=3, global_batch=8),
    "moe": dict(dp=4, ep=4, global_batch=4),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("overlap", [False, True])
def test_breakdown_parts_sum_to_step(name, overlap):
    model = GPT
    if name == "moe":
        model = GPT.model_copy(update={"num_experts": 4, "top_k": 2})
    g, cluster = _setup(model, **CONFIGS[name])
    step = compose_step(g, op_time_ms(g.nodes, cluster), overlap_grad_reduce=overlap)
    parts = sum(step.as_row().values())  # compute, attention, exposed comm, bubble, sync, optimizer
    assert parts == pytest.approx(step.step_ms, rel=1e-9)
    assert step.step_ms > 0 and step.optimizer_ms > 0 and step.compute_ms > 0
    row = step.as_row()
    assert {"compute_ms", "attention_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms"} <= set(row)
    assert 0 < step.attention_ms < step.compute_ms
    assert all(row[f"comm_{k}_ms"] == v for k, v in step.comm_ms.items())


def test_overlapping_the_gradient_reduction_never_slows_the_step():
    g, cluster = _setup(dp=8, global_batch=8)
    times = op_time_ms(g.nodes, cluster)
    plain, overlapped = compose_step(g, times), compose_step(g, times, overlap_grad_reduce=True)
    assert plain.dp_sync_ms > 0
    assert overlapped.dp_sync_ms <= plain.dp_sync_ms and overlapped.step_ms <= plain.step_ms


def test_breakdown_defaults():
    b = StepBreakdown(step_ms=3.0, compute_ms=1.0, bubble_ms=1.0, dp_sync_ms=0.5, optimizer_ms=0.5)
    assert b.comm_ms == {} and b.as_row() == {
        "compute_ms": 1.0,
        "attention_ms": 0.0,
        "bubble_ms": 1.0,
        "dp_sync_ms": 0.5,
        "optimizer_ms": 0.5,
    }


def _kernels_per_microbatch(g: WorkloadGraph) -> float:
    mult = g.nodes["scope"].map(g.scope_multiplicity()).to_numpy(dtype=float)
    per_mb = (g.nodes["scope"] != "step").to_numpy()
    return float((g.nodes["repeat"].to_numpy() * mult)[per_mb].sum())


def test_host_floor_binds_only_when_kernels_are_shorter_than_their_dispatch():
    g, _ = _setup(global_batch=4)
    tiny = np.full(len(g.nodes), 1e-4)
    floor = compose_step(g, tiny, host_ms_per_kernel=0.05)
    m = g.num_microbatches
    per_mb = _kernels_per_microbatch(g) * 0.05
    step_nodes = (g.nodes["scope"] == "step").to_numpy()
    assert floor.step_ms == pytest.approx(m * per_mb + tiny[step_nodes].sum(), rel=1e-9)
    free = compose_step(g, tiny, host_ms_per_kernel=0)
    assert floor.host_stall_ms == pytest.approx(m * per_mb - free.compute_ms - free.attention_ms)
    slow = np.full(len(g.nodes), 1.0)
    assert compose_step(g, slow, host_ms_per_kernel=0.05).step_ms == compose_step(g, slow, host_ms_per_kernel=0).step_ms


def _pp_times(g: WorkloadGraph, xfer_ms: float) -> np.ndarray:
    times = np.where(g.nodes["scope"] == "layer", 1.0, 0.0)
    times[(g.nodes["group"] == "pp").to_numpy()] = xfer_ms
    return times


def test_plain_1f1b_transfers_are_on_the_critical_path():
    g, _ = _setup(pp=4, global_batch=8)
    base = compose_step(g, _pp_times(g, 0.0), host_ms_per_kernel=0)
    step = compose_step(g, _pp_times(g, 0.5), host_ms_per_kernel=0)
    m = g.num_microbatches
    assert step.comm_ms["pp"] == pytest.approx(m * 2 * 0.5)  # one forward and one backward transfer per microbatch
    assert step.step_ms == pytest.approx(base.step_ms + (m + 3) * 2 * 0.5)


@pytest.mark.parametrize("vpp", [2, 4])
def test_interleaved_transfers_hide_in_steady_state_and_add_fill_and_drain(vpp):
    g, _ = _setup(GPT.model_copy(update={"num_layers": 16}), pp=4, vpp=vpp, global_batch=8)
    base = compose_step(g, _pp_times(g, 0.0), host_ms_per_kernel=0)
    step = compose_step(g, _pp_times(g, 0.5), host_ms_per_kernel=0)
    assert step.comm_ms["pp"] == 0.0
    assert step.bubble_ms == pytest.approx(base.bubble_ms + (4 - 1) * (0.5 + 0.5))
    assert step.step_ms == pytest.approx(base.step_ms + 3 * 1.0)
    parts = sum(step.as_row().values())  # compute, attention, exposed comm, bubble, sync, optimizer
    assert parts == pytest.approx(step.step_ms)


def test_interleaved_transfers_longer_than_the_stage_compute_are_exposed():
    g, _ = _setup(pp=2, vpp=2, global_batch=4)
    _, stage = _layer_only_times(g)
    xfer = stage  # vpp forward + vpp backward transfers per microbatch: 4 * stage
    step = compose_step(g, _pp_times(g, xfer), host_ms_per_kernel=0)
    m = g.num_microbatches
    assert step.comm_ms["pp"] == pytest.approx(m * (4 * xfer - stage))


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("overlap", [False, True])
def test_step_plan_of_several_arrays_equals_compose_step_per_array(name, overlap):
    model = GPT.model_copy(update={"num_experts": 4, "top_k": 2}) if name == "moe" else GPT
    g, cluster = _setup(model, **CONFIGS[name])
    base = op_time_ms(g.nodes, cluster)
    rng = np.random.default_rng(0)
    arrays = [base, base * rng.uniform(0.5, 1.0, len(base)), base.copy(), base * rng.uniform(1.0, 3.0, len(base))]
    plan = StepPlan.from_graphs(
        [g], overlap_grad_reduce=[overlap], overlap_param_gather=[False], host_ms_per_kernel=[HOST_MS_PER_KERNEL]
    )
    parts = plan.compose(arrays)
    assert parts[2] is parts[0]  # an equal array reuses the columns
    steps = [step_breakdowns(p)[0] for p in parts]
    assert steps == [compose_step(g, a, overlap_grad_reduce=overlap) for a in arrays]
    assert steps[1].step_ms < steps[0].step_ms == steps[2].step_ms < steps[3].step_ms


BODY_LAYOUTS = [
    {},
    {"tp": 2, "sequence_parallel": True, "dp": 2, "global_batch": 8},
    {"pp": 2, "dp": 2, "global_batch": 8},
    {"pp": 4, "vpp": 2, "global_batch": 8},
    {"pp": 2, "cp": 2, "dp": 2, "zero_stage": 3, "global_batch": 4},
    {"tp": 2, "pp": 2, "recompute": "full", "global_batch": 6},
]


def _composed_together(
    graphs: list[WorkloadGraph], bodies: list[BodyTemplate], times: list[np.ndarray], host_ms: float, **switches
) -> list[StepBreakdown]:
    """The graphs composed by one :class:`StepPlan` over ``bodies`` (a template may repeat), each its own config."""
    step = np.concatenate([g.column("scope") == "step" for g in graphs])
    index = np.arange(len(graphs))
    plan = StepPlan(
        bodies,
        {name: np.concatenate([g.column(name) for g in graphs])[step] for name in ("op", "name")},
        [g.num_nodes - b.num_nodes for g, b in zip(graphs, bodies, strict=True)],
        body_of=index,
        steps_of=index,
        num_microbatches=np.array([g.num_microbatches for g in graphs]),
        host_ms_per_kernel=np.full(len(graphs), host_ms),
        **{name: np.asarray(values, dtype=bool) for name, values in switches.items()},
        body_rows=np.flatnonzero(~step),
        step_rows=np.flatnonzero(step),
    )
    return step_breakdowns(plan.compose([np.concatenate(times)])[0])


@pytest.mark.parametrize("overlap", [False, True])
def test_a_plan_of_many_graphs_equals_composing_each_alone(overlap):
    """Many graphs composed at once, each with its own node times, microbatch count and switches."""
    rng = np.random.default_rng(0)
    graphs = [_setup(**layout)[0] for layout in BODY_LAYOUTS]
    graphs += graphs[::-1]  # a template repeated, with other node times
    times = [rng.uniform(0.0, 2.0, g.num_nodes) for g in graphs]
    templates = {id(g): BodyTemplate.from_graph(g) for g in graphs}
    gather = [i % 3 == 0 for i in range(len(graphs))]
    got = _composed_together(graphs, [templates[id(g)] for g in graphs], times, 1.0,  # a floor binding some stages
                             overlap_grad_reduce=[overlap] * len(graphs), overlap_param_gather=gather)  # fmt: skip
    for g, t, step, gathered in zip(graphs, times, got, gather, strict=True):
        assert step == compose_step(
            g, t, overlap_grad_reduce=overlap, overlap_param_gather=gathered, host_ms_per_kernel=1
        )
    assert any(s.host_stall_ms > 0 for s in got) and any(s.host_stall_ms == 0 for s in got)
    assert len({frozenset(s.comm_ms) for s in got}) > 2  # configs of different process groups side by side


# ------------------------------------------------------------------ uneven pipeline stages


def _per_rank_stage_ms(g: WorkloadGraph, times: np.ndarray) -> np.ndarray:
    """Each rank's microbatch time from its own layer counts (vpp=1, no overlap, no host floor)."""
    scope = g.nodes["scope"].to_numpy()
    part = {name: float(times[scope == name].sum()) for name in ("layer", "moe_layer", "stage", "first_stage",
                                                                   "last_stage")}  # fmt: skip
    ranks = g.stage_layers
    out = [d * part["layer"] + m * part["moe_layer"] + part["stage"] for d, m in ranks]
    out[0] += part["first_stage"]
    out[-1] += part["last_stage"]
    return np.array(out)


@pytest.mark.parametrize(
    ("layers", "fields", "ranks"),
    [
        (7, {"pp": 3}, (2, 3, 2)),  # 7 + embedding + loss = 9 over 3 stages
        (9, {"pp": 2, "first_stage_layers": 6, "last_stage_layers": 3}, (6, 3)),
        (8, {"pp": 3, "account_for_loss_in_pipeline_split": True}, (3, 3, 2)),
    ],
)
def test_uneven_stages_are_timed_by_their_own_layers(layers, fields, ranks):
    model = GPT.model_copy(update={"num_layers": layers})
    g, _ = _setup(model, global_batch=6, **fields)
    assert tuple(d for d, _ in g.stage_layers) == ranks
    assert g.dense_layers_per_stage == max(ranks)
    rng = np.random.default_rng(0)
    times = rng.uniform(0.1, 1.0, g.num_nodes)
    step = compose_step(g, times, host_ms_per_kernel=0.0)
    stages = _per_rank_stage_ms(g, times)
    step_nodes = (g.nodes["scope"] == "step").to_numpy()
    m = g.num_microbatches
    pipeline = m * stages.max() + stages.sum() - stages.max()
    assert step.step_ms == pytest.approx(pipeline + times[step_nodes].sum(), rel=1e-12)
    assert step.bubble_ms == pytest.approx(stages.sum() - stages.max(), rel=1e-12)
    parts = sum(step.as_row().values())  # compute, attention, exposed comm, bubble, sync, optimizer
    assert parts == pytest.approx(step.step_ms, rel=1e-12)


def test_the_slowest_uneven_stage_sets_the_steady_state():
    light = GPT.model_copy(update={"num_layers": 9})
    for first, last in ((3, 6), (6, 3)):
        g, _ = _setup(light, pp=2, global_batch=8, first_stage_layers=first, last_stage_layers=last)
        times = np.where(g.nodes["scope"] == "layer", 1.0, 0.0)
        step = compose_step(g, times, host_ms_per_kernel=0.0)
        per_layer = float(times.sum())
        # 9 layers: 6 on the slow stage, 3 on the other; an even 4.5 / 4.5 split would take 8 * 4.5 + 4.5
        assert step.step_ms == pytest.approx(8 * 6 * per_layer + 3 * per_layer, rel=1e-12)
        assert step.step_ms > 8 * 4.5 * per_layer + 4.5 * per_layer


@pytest.mark.parametrize("overlap", [False, True])
def test_a_plan_of_many_graphs_equals_composing_each_alone_for_uneven_stages(overlap):
    mixtral = TransformerSpec.from_name("mixtral-8x7b").model_copy(update={"seq_len": 512})
    graphs = [
        _setup(GPT.model_copy(update={"num_layers": 7}), pp=3, dp=2, global_batch=6, zero_stage=1)[0],
        _setup(GPT.model_copy(update={"num_layers": 11}), pp=2, vpp=2, tp=2, global_batch=4, sequence_parallel=True)[0],
        _setup(mixtral, pp=3, dp=2, ep=2, global_batch=6)[0],
        _setup(GPT, pp=2, global_batch=4)[0],  # an even body beside them
    ]
    assert [g.stage_layers is None for g in graphs] == [False, False, False, True]
    times = [np.random.default_rng(i).uniform(0.01, 1.0, g.num_nodes) for i, g in enumerate(graphs)]
    gather = [True, False, True, False]
    got = _composed_together(graphs, [BodyTemplate.from_graph(g) for g in graphs], times, HOST_MS_PER_KERNEL,
                             overlap_grad_reduce=[overlap] * 4, overlap_param_gather=gather)  # fmt: skip
    for g, t, step, gathered in zip(graphs, times, got, gather, strict=True):
        assert step == compose_step(g, t, overlap_grad_reduce=overlap, overlap_param_gather=gathered)
