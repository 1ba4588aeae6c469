"""Tests of the step composer: analytic equivalence, deduplication, intervals, timing scopes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fixtures.analytic_step import analytic_step

import perfcast.models
from perfcast.errors import SpecError
from perfcast.features.ops import COLLECTIVE_OPS
from perfcast.features.roofline import op_time_ms
from perfcast.features.run_config import parse_run_row
from perfcast.features.schedule import compose_step
from perfcast.features.workload import SHAPE_COLUMNS, build_workload_graph
from perfcast.models.analytic import AnalyticOpPredictor
from perfcast.models.composer import (
    ATTENTION_BACKWARD_EFFICIENCY,
    PRE_FA3_ATTENTION_EFFICIENCY,
    TIMING_SCOPES,
    StepComposer,
    composed_frame,
    measured_attention,
    stack_attention_ms,
)

BASE = {"model": "gpt3-1.3b", "gpu": "a100-sxm4-80gb", "micro_batch": 2, "global_batch": 64, "dtype": "bf16"}
LAYOUTS = [
    {"dp": 8},
    {"tp": 2, "pp": 2, "dp": 2},
    {"tp": 4, "pp": 2, "dp": 1, "vpp": 2, "sequence_parallel": True},
    {"tp": 2, "cp": 2, "dp": 2, "recompute": "full"},
    {"dp": 16, "zero_stage": 3, "num_gpus": 16, "gpus_per_node": 8},
    {"tp": 8, "pp": 2, "dp": 2, "num_gpus": 32, "gpus_per_node": 8, "inter_node": "ib-edr-100"},
]


def _configs():
    return [parse_run_row({**BASE, **layout}) for layout in LAYOUTS]


class SpyPredictor:
    """Analytic times with a +-20% interval (none for attention); records every row asked."""

    name = "spy"
    has_interval = True
    flags_out_of_domain = False

    def __init__(self):
        self.rows_seen = 0
        self.asked: list[pd.DataFrame] = []

    def predict_ops(self, ops, coverage=0.9):
        self.rows_seen += len(ops)
        self.asked.append(ops)
        pred, _, _ = AnalyticOpPredictor().predict_ops(ops, coverage=coverage)
        no_interval = (ops["op"] == "attention").to_numpy()
        lo = np.where(no_interval, np.nan, 0.8 * pred)
        hi = np.where(no_interval, np.nan, 1.2 * pred)
        return pred, lo, hi

    def out_of_domain(self, ops):
        return np.zeros(len(ops), dtype=bool)

    def predict_ops_flagged(self, ops, *, coverage=0.9):
        return (*self.predict_ops(ops, coverage=coverage), self.out_of_domain(ops))


class DoubleCollectives:
    """A collective model that says every collective takes twice the alpha-beta time."""

    def predict_with_interval(self, X, coverage=0.9):
        pred = 2.0 * AnalyticOpPredictor().predict_ops(X, coverage=coverage)[0]
        return pred, np.column_stack([pred, 1.5 * pred])


def test_analytic_predictor_reproduces_the_physics_composition():
    configs = _configs()
    steps = StepComposer(AnalyticOpPredictor()).compose_many(configs)
    for config, step in zip(configs, steps, strict=True):
        expected = analytic_step(config)
        assert step.step_ms == pytest.approx(expected.step_ms, rel=1e-12)
        assert step.breakdown.comm_ms == pytest.approx(expected.comm_ms, rel=1e-12)
        assert step.step_lo_ms == step.step_ms == step.step_hi_ms  # no interval from the analytic predictor


def test_compose_many_matches_one_at_a_time():
    configs = _configs()
    many = StepComposer(SpyPredictor()).compose_many(configs)
    for config, step in zip(configs, many, strict=True):
        one = StepComposer(SpyPredictor()).compose(config)
        assert step.breakdown == one.breakdown
        assert (step.step_lo_ms, step.step_hi_ms) == (one.step_lo_ms, one.step_hi_ms)
        np.testing.assert_array_equal(step.node_ms, one.node_ms)


def test_each_distinct_op_is_predicted_once():
    configs = _configs()
    spy = SpyPredictor()
    StepComposer(spy).compose_many(configs)
    once = spy.rows_seen
    spy_twice = SpyPredictor()
    steps = StepComposer(spy_twice).compose_many(configs + configs)
    assert spy_twice.rows_seen == once  # repeating every config adds no op rows
    compute_nodes = sum(int((s.graph.nodes["stream"] == "compute").sum()) for s in steps[: len(configs)])
    assert once < compute_nodes  # identical ops inside and across graphs were merged
    asked = pd.concat(spy.asked)[[*SHAPE_COLUMNS, "gpu"]].astype(str)
    assert not asked.duplicated().any()  # no op (shape, dtype, device) is asked twice
    separate = SpyPredictor()
    for config in configs:
        StepComposer(separate).compose(config)
    assert once < separate.rows_seen


def test_interval_brackets_the_step_and_nan_bounds_fall_back_to_the_point():
    steps = StepComposer(SpyPredictor()).compose_many(_configs())
    for step in steps:
        assert step.step_lo_ms < step.step_ms < step.step_hi_ms
        assert (step.node_lo_ms <= step.node_ms).all() and (step.node_ms <= step.node_hi_ms).all()
        attention = (step.graph.nodes["op"] == "attention").to_numpy()
        assert attention.any()
        np.testing.assert_array_equal(step.node_lo_ms[attention], step.node_ms[attention])


def test_collective_predictor_times_collective_nodes():
    config = parse_run_row({**BASE, **LAYOUTS[1]})
    plain = StepComposer(AnalyticOpPredictor()).compose(config)
    doubled = StepComposer(AnalyticOpPredictor(), DoubleCollectives()).compose(config)
    comm = (plain.graph.nodes["stream"] != "compute").to_numpy()
    np.testing.assert_allclose(doubled.node_ms[comm], 2.0 * plain.node_ms[comm])
    np.testing.assert_array_equal(doubled.node_ms[~comm], plain.node_ms[~comm])
    assert doubled.breakdown.comm_ms["tp"] == pytest.approx(2.0 * plain.breakdown.comm_ms["tp"])
    assert doubled.step_hi_ms > doubled.step_ms


def test_timing_scopes_nest():
    config = parse_run_row({**BASE, **LAYOUTS[0]})
    composer = StepComposer(AnalyticOpPredictor())
    fwd, fwd_bwd, step = (composer.compose(config, timing_scope=s).step_ms for s in ("fwd", "fwd_bwd", "step"))
    assert 0 < fwd < fwd_bwd < step
    with pytest.raises(SpecError, match="timing_scope"):
        composer.compose(config, timing_scope="inference")


def test_composed_frame_has_the_breakdown_columns():
    steps = StepComposer(AnalyticOpPredictor()).compose_many(_configs())
    frame = composed_frame(steps)
    assert len(frame) == len(steps)
    for col in ("step_ms", "step_lo_ms", "step_hi_ms", "compute_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms"):
        assert col in frame
    assert not frame.isna().any().any()
    parts = frame.drop(columns=["step_ms", "step_lo_ms", "step_hi_ms"]).sum(axis=1)
    np.testing.assert_allclose(parts, frame["step_ms"], rtol=1e-9)


def test_empty_and_misaligned_inputs():
    composer = StepComposer(AnalyticOpPredictor())
    assert composer.compose_many([]) == []
    with pytest.raises(SpecError, match="timing scopes"):
        composer.compose_many(_configs()[:2], timing_scopes=["step"])
    with pytest.raises(SpecError, match="coverage"):
        StepComposer(AnalyticOpPredictor(), coverage=1.5)


def test_pandas_frame_of_nodes_is_not_modified():
    config = parse_run_row({**BASE, **LAYOUTS[1]})
    step = StepComposer(SpyPredictor()).compose(config)
    assert isinstance(step.graph.nodes, pd.DataFrame)
    assert "gpu" not in step.graph.nodes and "link" not in step.graph.nodes


def test_default_bundle_composes_with_an_interval():
    from perfcast.models.bundle import load_bundle

    bundle = load_bundle(Path(perfcast.models.__file__).parent / "default_bundle")
    configs = _configs()[:3]
    steps = StepComposer(bundle).compose_many(configs)
    for config, step in zip(configs, steps, strict=True):
        assert step.step_lo_ms <= step.step_ms <= step.step_hi_ms
        assert step.step_lo_ms < step.step_hi_ms  # the op model's GEMM intervals reach the step
        assert np.isfinite(step.node_ms).all() and (step.node_ms >= 0).all()
        assert step.step_ms > 0.5 * analytic_step(config).step_ms  # roofline is (nearly) a lower bound


VARIED_ROWS = [
    *({**BASE, **layout} for layout in LAYOUTS),
    {**BASE, "tp": 2, "dp": 4, "flash_attention": False, "recompute": "selective"},
    {**BASE, "tp": 2, "dp": 2, "finetune": "lora", "lora_rank": 8, "flash_attention": False, "recompute": "full"},
    {**BASE, "gpu": "h100-sxm5-80gb", "dtype": "fp8", "tp": 2, "pp": 4, "dp": 1, "vpp": 2},
    {**BASE, "dtype": "fp32", "dp": 4, "zero_stage": 1, "pp": 2, "global_batch": 32},
    {"model": "mixtral-8x7b", "gpu": "h100-sxm5-80gb", "tp": 2, "ep": 4, "dp": 4, "micro_batch": 1, "global_batch": 8,
     "sequence_parallel": True},
]  # fmt: skip


def _composed_one_config_from_frames(config, timing_scope: str):
    """The per-config path: node times from the graph's frame, each composition on its own."""
    graph = build_workload_graph(config.model, config.parallel, config.cluster)
    nodes = graph.nodes.assign(gpu=config.cluster.gpu.id)
    pred, lo, hi = SpyPredictor().predict_ops(nodes)
    comm = nodes["op"].isin([o.value for o in COLLECTIVE_OPS]).to_numpy()
    pred[comm] = op_time_ms(nodes[comm], config.cluster)
    lo = np.minimum(np.where(np.isnan(lo) | comm, pred, lo), pred)
    hi = np.maximum(np.where(np.isnan(hi) | comm, pred, hi), pred)
    keep = {
        "step": np.ones(len(nodes), dtype=bool),
        "fwd_bwd": (nodes["scope"] != "step").to_numpy(),
        "fwd": (nodes["phase"] == "fwd").to_numpy(),
    }[timing_scope]
    return [compose_step(graph, np.where(keep, t, 0.0)) for t in (pred, lo, hi)]


def test_batched_composition_equals_the_per_config_frame_path():
    configs = [parse_run_row(row) for row in VARIED_ROWS]
    scopes = [TIMING_SCOPES[i % len(TIMING_SCOPES)] for i in range(len(configs))]
    steps = StepComposer(SpyPredictor(), stack_attention=False).compose_many(configs, timing_scopes=scopes)
    for config, scope, step in zip(configs, scopes, steps, strict=True):
        median, lo, hi = _composed_one_config_from_frames(config, scope)
        assert step.breakdown == median
        assert (step.step_lo_ms, step.step_hi_ms) == (lo.step_ms, hi.step_ms)
    assert len({s.graph.num_nodes for s in steps}) > 5  # the configs make different graphs


VARIED = [  # dense and MoE; vpp, cp, sp, recompute, every ZeRO stage, LoRA, fp32, unfused attention, several GPUs
    {**BASE, "dp": 8},
    {**BASE, "tp": 2, "pp": 2, "dp": 2, "recompute": "selective"},
    {**BASE, "tp": 4, "pp": 2, "dp": 2, "vpp": 2, "sequence_parallel": True, "recompute": "full", "num_gpus": 16},
    {**BASE, "tp": 2, "cp": 2, "dp": 2, "zero_stage": 1, "gpu": "h100-sxm5-80gb"},
    {**BASE, "dp": 16, "zero_stage": 3, "num_gpus": 16, "gpus_per_node": 4},
    {**BASE, "dp": 8, "zero_stage": 3, "recompute": "full", "gpus_per_node": 4},
    {**BASE, "pp": 4, "dp": 2, "zero_stage": 2, "vpp": 2, "gpu": "h100-sxm5-80gb"},
    {**BASE, "pp": 2, "dp": 4, "vpp": 4, "recompute": "selective", "global_batch": 128},
    {**BASE, "tp": 2, "dp": 4, "finetune": "lora", "lora_rank": 16},
    {**BASE, "tp": 2, "dp": 4, "dtype": "fp32", "flash_attention": False, "recompute": "selective"},
    {**BASE, "model": "mixtral-8x7b", "tp": 2, "pp": 4, "dp": 4, "ep": 4, "global_batch": 64,
     "gpu": "h100-sxm5-80gb", "sequence_parallel": True},
    {**BASE, "model": "mixtral-8x7b", "tp": 4, "pp": 2, "dp": 4, "cp": 2, "ep": 8, "global_batch": 64, "vpp": 2,
     "recompute": "full", "zero_stage": 1, "gpu": "h100-sxm5-80gb", "sequence_parallel": True},
    {**BASE, "model": "llama2-7b", "tp": 8, "pp": 2, "dp": 2, "num_gpus": 32, "gpus_per_node": 8,
     "inter_node": "ib-edr-100", "sequence_parallel": True, "zero_stage": 1},
]  # fmt: skip


class FlaggingSpy(SpyPredictor):
    """The spy, flagging every GEMM with k above 4096 as out of domain."""

    def out_of_domain(self, ops):
        return (ops["op"].isin(["matmul", "linear", "bmm"]) & (ops["k"] > 4096)).to_numpy()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("predictor", [AnalyticOpPredictor, FlaggingSpy])
def test_compose_table_equals_composing_every_config(predictor, overlap):
    rows = [*VARIED, *({**row, "global_batch": 2 * row["global_batch"]} for row in VARIED)]  # shared bodies
    # bodies built for one vpp and recomputation, reused for the others
    rows += [{**row, "recompute": r} for row in VARIED[1:4] for r in ("none", "selective", "op-sac", "full")]
    rows += [{**row, "vpp": v} for row in VARIED[6:8] for v in (1, 2)]
    configs = [parse_run_row(row) for row in rows]
    composer = StepComposer(predictor(), overlap_grad_reduce=overlap)
    steps = composer.compose_many(configs)
    expected = composed_frame(steps)
    for _ in range(2):  # the second call reuses the remembered bodies
        got, flags = composer.compose_table(configs)
        assert list(got.columns) == list(expected.columns)
        np.testing.assert_allclose(got.to_numpy(), expected.to_numpy(), rtol=1e-11, atol=1e-12)
        assert flags.tolist() == [s.out_of_domain for s in steps]
    assert any(s.out_of_domain for s in steps) == (predictor is FlaggingSpy)


class BackwardFlaggingSpy(SpyPredictor):
    """The spy, flagging the ops first met in a backward pass as out of domain."""

    def out_of_domain(self, ops):
        return (ops["phase"] == "bwd").to_numpy()


def test_only_nodes_in_the_timing_scope_flag_a_step_out_of_domain():
    config = parse_run_row({**BASE, "tp": 2, "dp": 4})
    composer = StepComposer(BackwardFlaggingSpy())
    steps = composer.compose_many([config] * 3, timing_scopes=["fwd", "fwd_bwd", "step"])
    assert [s.out_of_domain for s in steps] == [False, True, True]
    assert composer.compose_table([config])[1].tolist() == [True]


def test_compose_table_with_a_collective_model_and_no_configs():
    configs = [parse_run_row(row) for row in VARIED]
    composer = StepComposer(SpyPredictor(), DoubleCollectives())
    got, _ = composer.compose_table(configs)
    np.testing.assert_allclose(got.to_numpy(), composed_frame(composer.compose_many(configs)).to_numpy(), rtol=1e-11)
    empty, flags = composer.compose_table([])
    assert len(empty) == 0 and len(flags) == 0


def test_a_run_row_can_overlap_its_own_gradient_sync():
    rows = [row for row in VARIED if row.get("dp", 1) > 1][:6]
    own = [parse_run_row({**row, "overlap_grad_reduce": i % 2 == 0}) for i, row in enumerate(rows)]
    plain = [parse_run_row(row) for row in rows]
    hidden = StepComposer(AnalyticOpPredictor(), overlap_grad_reduce=True).compose_many(plain)
    exposed = StepComposer(AnalyticOpPredictor()).compose_many(plain)
    expected = composed_frame([hidden[i] if i % 2 == 0 else exposed[i] for i in range(len(rows))])
    composer = StepComposer(AnalyticOpPredictor())
    np.testing.assert_allclose(composed_frame(composer.compose_many(own)).to_numpy(), expected.to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(composer.compose_table(own)[0].to_numpy(), expected.to_numpy(), rtol=1e-11)
    assert (expected["dp_sync_ms"].to_numpy()[0::2] < composed_frame(exposed)["dp_sync_ms"].to_numpy()[0::2]).any()


def test_compose_table_with_flagged_op_predictions_flags_the_nodes_outside_the_domain():
    from perfcast.models.bundle import load_bundle

    bundle = load_bundle(Path(perfcast.models.__file__).parent / "default_bundle")
    rows = [*VARIED, *({**row, "gpu": "b200-hgx"} for row in VARIED[:4])]  # some nodes outside the op domain
    configs = [parse_run_row(row) for row in rows]
    got, flags = StepComposer(bundle).compose_table(configs)
    expected = composed_frame(StepComposer(bundle).compose_many(configs))
    np.testing.assert_allclose(got.to_numpy(), expected.to_numpy(), rtol=1e-11, atol=0)
    assert any(flags) and not all(flags)
    assert got["step_lo_ms"].lt(got["step_hi_ms"]).all()


UNEVEN = [  # pp*vpp not dividing the layers (gpt3-1.3b: 24, mixtral: 32), default and stated splits
    {**BASE, "pp": 5, "global_batch": 80, "num_gpus": 5},
    {**BASE, "pp": 5, "vpp": 2, "global_batch": 80, "num_gpus": 5, "recompute": "full"},
    {**BASE, "tp": 2, "pp": 4, "vpp": 4, "dp": 2, "global_batch": 64, "sequence_parallel": True},
    {**BASE, "pp": 4, "vpp": 2, "dp": 2, "first_stage_layers": 4, "last_stage_layers": 4, "zero_stage": 1,
     "overlap_grad_reduce": True},
    {**BASE, "pp": 5, "dp": 2, "account_for_embedding_in_pipeline_split": True, "gpus_per_node": 2,
     "global_batch": 80},
    {**BASE, "model": "mixtral-8x7b", "tp": 2, "pp": 3, "dp": 2, "ep": 2, "global_batch": 60, "gpus_per_node": 4,
     "gpu": "h100-sxm5-80gb"},
]  # fmt: skip


@pytest.mark.parametrize("overlap", [False, True])
def test_compose_table_equals_composing_every_config_with_uneven_stages(overlap):
    rows = [*UNEVEN, *VARIED[:3], *({**row, "recompute": r} for row in UNEVEN[:2] for r in ("none", "selective"))]
    configs = [parse_run_row(row) for row in rows]
    assert sum(c.defaulted.count("account_for_loss_in_pipeline_split") for c in configs) >= 3
    composer = StepComposer(SpyPredictor(), overlap_grad_reduce=overlap)
    steps = composer.compose_many(configs)
    assert [s.graph.stage_layers is not None for s in steps[: len(UNEVEN)]] == [True] * len(UNEVEN)
    expected = composed_frame(steps)
    for _ in range(2):  # the second call reuses the remembered bodies (keyed by each rank's layers)
        got, _ = composer.compose_table(configs)
        np.testing.assert_allclose(got.to_numpy(), expected.to_numpy(), rtol=1e-11, atol=1e-12)


def test_uneven_split_is_slower_than_the_even_split_of_fewer_layers():
    def step(row):
        return StepComposer(AnalyticOpPredictor()).compose(parse_run_row(row)).step_ms

    base = {**BASE, "pp": 4, "global_batch": 64, "num_gpus": 4}
    # a tiny vocabulary: the embedding and the LM head weigh next to nothing
    ms = {n: step({**base, "model": None, "num_layers": n, "hidden_size": 2048, "num_heads": 16,
                   "vocab_size": 128, "seq_len": 2048}) for n in (24, 25, 28)}  # fmt: skip
    # 25 layers: 6, 7, 7, 5 (first_stage_layers, last_stage_layers by default): timed by a 7-layer stage
    shape = {"model": None, "hidden_size": 2048, "num_heads": 16, "vocab_size": 128}
    defaulted = parse_run_row({**base, **shape, "num_layers": 25}).defaulted
    assert defaulted[-2:] == ("first_stage_layers", "last_stage_layers")
    assert ms[24] < ms[25] < ms[28]
    assert ms[25] > ms[24] + (ms[28] - ms[24]) / 4  # above an even 6.25 layers per stage
    assert ms[25] > 0.97 * ms[28]  # the 28-layer split's stages hold 7 layers too


def test_stack_attention_slows_the_backward_and_caps_hopper_attention():
    from perfcast.features.hardware import list_hardware
    from perfcast.features.ops import op_flops

    row = {"op": "attention", "batch": 1, "heads": 32, "kv_heads": 32, "seq_q": 8192, "seq_kv": 8192,
           "head_dim": 128, "causal": True, "dtype": "bf16"}  # fmt: skip
    ops = pd.DataFrame([{**row, "backward": False}, {**row, "backward": True},
                        {"op": "gelu", "rows": 8192, "cols": 4096, "dtype": "bf16", "backward": False}])  # fmt: skip
    ops["flops"] = op_flops(ops)
    gpus = {g.id: g for g in list_hardware() if g.id in ("a100-sxm4-80gb", "h100-sxm5-80gb")}
    fast = np.array([1e-3, 1e-3, 0.5])  # far faster than any kernel: the Hopper ceiling binds
    a100 = stack_attention_ms(ops.assign(gpu="a100-sxm4-80gb"), fast, gpus)
    np.testing.assert_allclose(a100, [1e-3, 1e-3 / ATTENTION_BACKWARD_EFFICIENCY, 0.5])
    measured = stack_attention_ms(ops.assign(gpu="a100-sxm4-80gb"), fast, gpus, backward_measured=True)
    np.testing.assert_allclose(measured, fast)  # a measured backward is not slowed again; no cap off Hopper
    h100 = stack_attention_ms(ops.assign(gpu="h100-sxm5-80gb"), fast, gpus)
    peak = gpus["h100-sxm5-80gb"].peak_tflops("bf16") * 1e12
    eta = PRE_FA3_ATTENTION_EFFICIENCY["hopper"]
    ceiling = eta * np.array([1.0, ATTENTION_BACKWARD_EFFICIENCY]) * peak
    np.testing.assert_allclose(h100[:2], ops["flops"][:2] / ceiling * 1e3)
    assert h100[2] == 0.5
    slow = np.array([1e3, 1e3, 0.5])  # slower than the ceiling: only the backward's efficiency applies
    np.testing.assert_allclose(stack_attention_ms(ops.assign(gpu="h100-sxm5-80gb"), slow, gpus)[:2],
                               [1e3, 1e3 / ATTENTION_BACKWARD_EFFICIENCY])  # fmt: skip


def test_stack_attention_is_on_only_where_attention_was_learned_from_measured_kernels():
    import copy
    import dataclasses

    from perfcast.serve.predictors import load_op_predictor

    bundle = load_op_predictor(None)
    assert measured_attention(bundle) == (True, False)  # the H200 table: forward attention only
    from perfcast.models.calibration import CalibratedPredictor

    assert measured_attention(CalibratedPredictor(bundle, {})) == (True, False)  # a wrapper is looked through
    assert StepComposer(bundle).stack_attention
    assert not StepComposer(AnalyticOpPredictor()).stack_attention
    assert not StepComposer(SpyPredictor()).stack_attention  # no op model: nothing measured to correct
    op_model = copy.copy(bundle.op_model)
    op_model.boosters_ = {c: b for c, b in op_model.boosters_.items() if c != "attention"}
    no_attention = dataclasses.replace(bundle, op_model=op_model)  # its attention falls back to the roofline
    assert measured_attention(no_attention) == (False, False) and not StepComposer(no_attention).stack_attention
    op_model = copy.copy(bundle.op_model)
    op_model.backward_classes_ = ("attention",)
    with_backward = dataclasses.replace(bundle, op_model=op_model)
    assert measured_attention(with_backward) == (True, True)
    config = parse_run_row({**BASE, "gpu": "h100-sxm5-80gb", "dp": 8})
    on, off = (StepComposer(SpyPredictor(), stack_attention=flag).compose(config) for flag in (True, False))
    assert on.breakdown.attention_ms > off.breakdown.attention_ms
    # the slower attention lengthens the step, by at most its own growth (the host floor may absorb some)
    assert 0 < on.step_ms - off.step_ms <= on.breakdown.attention_ms - off.breakdown.attention_ms + 1e-9
