"""Tests of the framework column: spellings, shipped defaults, and the overlaps the composer honours."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from perfcast.errors import SpecError
from perfcast.features.frameworks import DEFAULT_FRAMEWORK, Framework, framework_fields
from perfcast.features.run_config import parse_run_row
from perfcast.features.schedule import compose_step, param_gather_exposed_ms
from perfcast.features.workload import OVERLAP_PREVIOUS_LAYER, build_workload_graph
from perfcast.models.analytic import AnalyticOpPredictor
from perfcast.models.composer import StepComposer
from perfcast.models.step_predictor import StepPredictor

# Llama-3-70B on 64 H100s: tp=8 with sequence parallelism, 8-way data parallel
RUN = {"model": "llama3-70b", "gpu": "h100-sxm5-80gb", "tp": 8, "dp": 8, "sequence_parallel": True,
       "micro_batch": 1, "global_batch": 64}  # fmt: skip
SWITCHES = ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "fsdp_prefetch", "cuda_graphs")


@pytest.mark.parametrize(
    ("spelling", "framework"),
    [("megatron-core", Framework.MEGATRON_CORE), ("NeMo", Framework.MEGATRON_CORE),
     ("Megatron-LM", Framework.MEGATRON_CORE), ("megatron_bridge", Framework.MEGATRON_CORE),
     ("megatron", Framework.MEGATRON_CORE), ("Megatron-DeepSpeed", Framework.MEGATRON_DEEPSPEED),
     ("torchtitan", Framework.TORCHTITAN), ("FSDP2", Framework.PYTORCH_FSDP), ("fsdp", Framework.PYTORCH_FSDP),
     ("llm-foundry", Framework.PYTORCH_FSDP), ("composer", Framework.PYTORCH_FSDP),
     ("NeMo AutoModel", Framework.PYTORCH_FSDP), (" deepspeed ", Framework.DEEPSPEED)],
)  # fmt: skip
def test_framework_spellings(spelling, framework):
    assert Framework.parse(spelling) is framework
    assert parse_run_row({**RUN, "framework": spelling}).parallel.framework is framework


def test_bad_framework_is_named_and_jax_stacks_are_refused():
    with pytest.raises(SpecError, match=r"framework='megatrom' is not a known framework; allowed: megatron-core"):
        parse_run_row({**RUN, "framework": "megatrom"})
    with pytest.raises(SpecError, match=r"framework='MaxText' is a JAX/XLA stack"):
        parse_run_row({**RUN, "framework": "MaxText"})
    with pytest.raises(SpecError, match=r"tp_comm_overlap=.*'sometimes'"):
        parse_run_row({**RUN, "tp_comm_overlap": "sometimes"})
    with pytest.raises(SpecError, match=r"tp_comm_overlap=true with tp=8 needs sequence_parallel=true"):
        parse_run_row({**RUN, "sequence_parallel": False, "tp_comm_overlap": True})


@pytest.mark.parametrize(
    ("framework", "zero_stage", "expected"),
    [("megatron-core", 1, (True, True, True, True, False)),
     ("megatron-deepspeed", 0, (False, False, False, False, False)),
     ("torchtitan", 3, (False, True, False, True, False)),
     ("pytorch-fsdp", 3, (False, True, False, True, False)),
     ("deepspeed", 0, (False, False, False, True, False))],
)  # fmt: skip
def test_framework_defaults_fill_unstated_switches_and_name_them(framework, zero_stage, expected):
    config = parse_run_row({**RUN, "framework": framework})
    p = config.parallel
    assert p.zero_stage == zero_stage
    assert tuple(getattr(p, name) for name in SWITCHES) == expected
    assert p.torch_compile is (framework == "torchtitan")
    relevant = {"zero_stage", "overlap_grad_reduce", "tp_comm_overlap", "cuda_graphs"}
    relevant |= {"overlap_param_gather"} if zero_stage in (1, 2) else {"fsdp_prefetch"} if zero_stage == 3 else set()
    assert relevant <= set(config.defaulted) and "framework" not in config.defaulted
    assert "torch_compile" not in config.defaulted  # not modelled: its default shapes nothing


def test_stated_values_win_over_framework_defaults():
    config = parse_run_row({**RUN, "framework": "nemo", "zero_stage": 0, "tp_comm_overlap": "false", "cuda_graphs": 1})
    p = config.parallel
    assert (p.zero_stage, p.tp_comm_overlap, p.cuda_graphs, p.overlap_grad_reduce) == (0, False, True, True)
    assert not {"zero_stage", "tp_comm_overlap", "cuda_graphs"} & set(config.defaulted)
    # Megatron-Core turns TP overlap on only where it can run
    assert not parse_run_row({**RUN, "framework": "nemo", "sequence_parallel": False}).parallel.tp_comm_overlap
    # one GPU of data parallelism: no sharded optimizer to default to
    assert parse_run_row({**RUN, "framework": "torchtitan", "dp": 1, "global_batch": 8}).parallel.zero_stage == 0
    assert framework_fields({"framework": "deepspeed", "dp": 4, "zero_stage": 3})["overlap_grad_reduce"]


def test_torchtitan_tensor_parallelism_is_sequence_parallel_unless_stated():
    """torchtitan's TP plan shards the norms over the sequence: an unstated ``sequence_parallel`` of a
    ``tp > 1`` layout is true, and named; a stated one wins; ``tp = 1`` has nothing to shard."""
    unstated = {k: v for k, v in RUN.items() if k != "sequence_parallel"}
    titan = parse_run_row({**unstated, "framework": "torchtitan"})
    assert titan.parallel.sequence_parallel and "sequence_parallel" in titan.defaulted
    assert not parse_run_row({**RUN, "framework": "torchtitan", "sequence_parallel": False}).parallel.sequence_parallel
    assert "sequence_parallel" not in framework_fields({"framework": "torchtitan", "tp": 1, "dp": 8})
    assert not parse_run_row({**unstated, "framework": "nemo"}).parallel.sequence_parallel  # Megatron: a flag


def test_torchtitan_refuses_megatrons_selective_recomputation():
    with pytest.raises(SpecError, match=r"recompute=selective with framework=torchtitan: .*state recompute=op-sac"):
        parse_run_row({**RUN, "framework": "torchtitan", "recompute": "selective"})
    assert parse_run_row({**RUN, "framework": "torchtitan", "recompute": "op-sac"}).parallel.recompute.value == "op-sac"


def test_unstated_framework_is_the_documented_default_and_named():
    config = parse_run_row(RUN)
    assert config.parallel.framework is DEFAULT_FRAMEWORK is Framework.MEGATRON_DEEPSPEED
    assert "framework" in config.defaulted
    p = config.parallel
    assert p.zero_stage == 0 and not any(getattr(p, name) for name in SWITCHES)


def _step(config):
    return StepComposer(AnalyticOpPredictor()).compose(config).breakdown


def test_tp_comm_overlap_hides_tp_collectives_behind_their_gemms():
    off = parse_run_row({**RUN, "recompute": "full"})
    on = replace(off, parallel=off.parallel.model_copy(update={"tp_comm_overlap": True}))
    graph = build_workload_graph(on.model, on.parallel, on.cluster)
    nodes = graph.nodes
    tp = nodes[(nodes["group"] == "tp") & (nodes["scope"] == "layer")]
    partner = nodes.set_index("node").loc[tp["overlap_with"].to_numpy(), "name"].to_numpy()
    pairs = dict(zip(tp["name"], partner, strict=True))
    assert pairs["attn.tp_gather"] == "attn.qkv" and pairs["mlp.tp_reduce"] == "mlp.down"
    assert pairs["attn.tp_gather.bwd"] == "attn.qkv.wgrad" and pairs["mlp.tp_reduce.bwd"] == "mlp.down.dgrad"
    assert pairs["attn.tp_gather.recompute"] == "attn.qkv.recompute"
    before, after = _step(off), _step(on)
    times = AnalyticOpPredictor().predict_ops(nodes.assign(gpu=on.cluster.gpu.id))[0]
    layer = nodes["scope"].to_numpy() == "layer"
    by_node = dict(zip(nodes["node"], times, strict=True))
    hidden = sum(min(by_node[n], by_node[o]) for n, o in zip(tp["node"], tp["overlap_with"], strict=True))
    m, layers = graph.num_microbatches, graph.dense_layers_per_stage
    assert after.comm_ms["tp"] == pytest.approx(before.comm_ms["tp"] - m * layers * hidden, rel=1e-9)
    assert after.compute_ms == pytest.approx(before.compute_ms)  # the GEMMs keep their time
    assert after.step_ms < before.step_ms and layer.any()


def test_ep_comm_overlap_hides_expert_all_to_alls_behind_the_expert_gemms():
    """Mixtral on 16 H100s, 8-way expert parallel: dispatch and combine point at the expert GEMMs beside
    them (backward: their wgrad, or dgrad under LoRA), hide at most those GEMMs' time, and leave the
    compute alone; off by default, and named as defaulted where there is expert parallelism. A step of
    one microbatch has no other microbatch's compute to hide behind: nothing changes."""
    moe = {"model": "mixtral-8x7b", "gpu": "h100-sxm5-80gb", "dp": 16, "ep": 8, "micro_batch": 1,
           "global_batch": 32, "recompute": "full"}  # fmt: skip
    off = parse_run_row(moe)
    assert not off.parallel.ep_comm_overlap and "ep_comm_overlap" in off.defaulted
    assert "ep_comm_overlap" not in parse_run_row({**moe, "ep": 1}).defaulted
    on = parse_run_row({**moe, "ep_comm_overlap": True})
    graph = build_workload_graph(on.model, on.parallel, on.cluster)
    nodes = graph.nodes
    ep = nodes[(nodes["group"] == "ep") & (nodes["overlap_with"] >= 0)]
    partner = nodes.set_index("node").loc[ep["overlap_with"].to_numpy(), "name"].to_numpy()
    pairs = dict(zip(ep["name"], partner, strict=True))
    assert pairs["moe.dispatch"] == "moe.up" and pairs["moe.combine"] == "moe.down"
    assert pairs["moe.dispatch.bwd"] == "moe.up.wgrad" and pairs["moe.combine.recompute"] == "moe.down.recompute"
    lora = parse_run_row({**moe, "ep_comm_overlap": True, "finetune": "lora"})
    lora_nodes = build_workload_graph(lora.model, lora.parallel, lora.cluster).nodes.set_index("node")
    bwd = lora_nodes[lora_nodes["name"] == "moe.combine.bwd"]["overlap_with"].iloc[0]
    assert lora_nodes.loc[bwd, "name"] == "moe.down.dgrad"  # frozen experts: no wgrad to hide behind
    before, after = _step(off), _step(on)
    assert 0 <= after.comm_ms["ep"] < before.comm_ms["ep"]
    single = {**moe, "global_batch": 16}  # dp 16 x micro_batch 1: one microbatch
    assert _step(parse_run_row({**single, "ep_comm_overlap": True})) == _step(parse_run_row(single))
    assert "ep_comm_overlap" not in parse_run_row(single).defaulted
    assert after.compute_ms == pytest.approx(before.compute_ms) and after.step_ms < before.step_ms
    times = AnalyticOpPredictor().predict_ops(nodes.assign(gpu=on.cluster.gpu.id))[0]
    by_node = dict(zip(nodes["node"], times, strict=True))
    hidden = sum(min(by_node[n], by_node[o]) for n, o in zip(ep["node"], ep["overlap_with"], strict=True))
    m, layers = graph.num_microbatches, graph.moe_layers_per_stage
    assert after.comm_ms["ep"] == pytest.approx(before.comm_ms["ep"] - m * layers * hidden, rel=1e-9)


def test_fsdp_prefetch_hides_zero3_gathers_except_the_first_layers():
    off = parse_run_row({**RUN, "zero_stage": 3})
    on = replace(off, parallel=off.parallel.model_copy(update={"fsdp_prefetch": True}))
    graph = build_workload_graph(on.model, on.parallel, on.cluster)
    nodes = graph.nodes
    gathers = nodes["name"].str.startswith("zero3.param_gather").to_numpy()
    assert (nodes.loc[gathers, "overlap_with"] == OVERLAP_PREVIOUS_LAYER).all()
    times = AnalyticOpPredictor().predict_ops(nodes.assign(gpu=on.cluster.gpu.id))[0]
    before, after = _step(off), _step(on)
    compute = (nodes["stream"] == "compute").to_numpy() & (nodes["scope"] == "layer").to_numpy()
    fwd = (nodes["phase"] == "fwd").to_numpy()
    m, n = graph.num_microbatches, graph.dense_layers_per_stage
    expected = 0.0
    for is_fwd in (True, False):
        g = float(times[gathers & (fwd == is_fwd)][0])
        c = float(times[compute & (fwd == is_fwd)].sum())
        expected += m * ((n - 1) * max(0.0, g - c) + g)
    assert after.comm_ms["dp"] == pytest.approx(expected, rel=1e-9)
    assert before.comm_ms["dp"] == pytest.approx(m * n * float(times[gathers].sum()), rel=1e-9)
    assert after.step_ms < before.step_ms


def test_overlap_param_gather_and_cuda_graphs_never_lengthen_a_step():
    base = parse_run_row({**RUN, "zero_stage": 1, "pp": 2, "dp": 4, "global_batch": 32})
    for switch in ("overlap_param_gather", "cuda_graphs", "tp_comm_overlap"):
        on = replace(base, parallel=base.parallel.model_copy(update={switch: True}))
        assert _step(on).step_ms <= _step(base).step_ms
    assert _step(replace(base, parallel=base.parallel.model_copy(update={"overlap_param_gather": True}))).dp_sync_ms < (
        _step(base).dp_sync_ms
    )
    np.testing.assert_allclose(param_gather_exposed_ms(np.array([80.0]), np.array([50.0]), np.array([4])), [42.5])
    # a host-bound tiny model: CUDA graphs remove the dispatch floor
    tiny = parse_run_row({"num_layers": 2, "hidden_size": 256, "num_heads": 4, "vocab_size": 1000, "seq_len": 128,
                          "gpu": "h100-sxm5-80gb"})  # fmt: skip
    graphed = replace(tiny, parallel=tiny.parallel.model_copy(update={"cuda_graphs": True}))
    assert _step(graphed).step_ms < _step(tiny).step_ms
    graph = build_workload_graph(tiny.model, tiny.parallel, tiny.cluster)
    times = AnalyticOpPredictor().predict_ops(graph.nodes.assign(gpu=tiny.cluster.gpu.id))[0]
    assert _step(graphed).step_ms == pytest.approx(compose_step(graph, times, host_ms_per_kernel=0.0).step_ms)


def test_framework_rows_compose_the_same_column_wise_and_per_graph():
    rows = [{**RUN, "framework": fw, "recompute": rec, "pp": pp, "vpp": vpp, "global_batch": 64}
            for fw in ("nemo", "torchtitan", "fsdp", "deepspeed") for rec in ("none", "full") for pp, vpp in
            ((1, 1), (2, 2))]  # fmt: skip
    rows.append({**RUN, "model": "llama3.1-405b", "pp": 8, "vpp": 8, "dp": 2, "global_batch": 32, "framework": "nemo"})
    rows.append({**RUN, "model": "llama3.1-405b", "pp": 8, "dp": 2, "global_batch": 32, "framework": "torchtitan"})
    configs = [parse_run_row(r) for r in rows]
    table = StepPredictor.analytic().predict_configs(configs)["step_ms"].to_numpy()
    per_graph = [s.step_ms for s in StepComposer(AnalyticOpPredictor()).compose_many(configs)]
    np.testing.assert_allclose(table, per_graph, rtol=1e-12)


def test_rows_without_a_framework_predict_as_an_explicit_megatron_deepspeed_row():
    rows = [{**RUN, "zero_stage": z, "overlap_grad_reduce": ogr, "recompute": rec}
            for z in (0, 1, 3) for ogr in (False, True) for rec in ("none", "selective")]  # fmt: skip
    plain = StepPredictor.analytic().predict_configs([parse_run_row(r) for r in rows])
    named = StepPredictor.analytic().predict_configs(
        [parse_run_row({**r, "framework": "megatron-deepspeed"}) for r in rows]
    )
    np.testing.assert_array_equal(plain["step_ms"].to_numpy(), named["step_ms"].to_numpy())
