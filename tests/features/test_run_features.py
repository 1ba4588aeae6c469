"""Tests of the run-level features of the step models."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import SpecError
from perfcast.features.roofline import op_time_ms
from perfcast.features.run_config import parse_run_row
from perfcast.features.run_features import RELEASE_COLUMN, RUN_FEATURE_SPEC, featurize_runs, software_release
from perfcast.features.schedule import compose_step
from perfcast.features.workload import build_workload_graph

BASE = {"model": "llama2-7b", "gpu": "h100-sxm5-80gb", "micro_batch": 1, "global_batch": 32}
LAYOUTS = [
    {"dp": 8},
    {"tp": 2, "pp": 2, "dp": 2, "vpp": 2, "sequence_parallel": True},
    {"tp": 8, "pp": 2, "dp": 1, "num_gpus": 16, "gpus_per_node": 8, "recompute": "selective"},
    {"tp": 2, "dp": 4, "finetune": "lora", "lora_rank": 16, "dtype": "fp8"},
]


def _composed(configs):
    rows = []
    for c in configs:
        graph = build_workload_graph(c.model, c.parallel, c.cluster)
        b = compose_step(graph, op_time_ms(graph.nodes, c.cluster))
        rows.append({"step_ms": b.step_ms, **b.as_row()})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def runs():
    configs = [parse_run_row({**BASE, **layout}) for layout in LAYOUTS]
    return configs, _composed(configs)


def test_columns_follow_the_spec_and_have_no_nan_but_the_unstated_release(runs):
    configs, composed = runs
    feats = featurize_runs(configs, composed)
    assert tuple(feats.columns) == RUN_FEATURE_SPEC.columns
    assert len(feats) == len(configs)
    assert not feats.drop(columns=RELEASE_COLUMN).isna().any().any()
    assert feats[RELEASE_COLUMN].isna().all()  # a query states no software release
    assert all(dtype == np.float64 for dtype in feats.dtypes)


def test_measured_runs_carry_their_mlperf_round_as_the_release(runs):
    configs, composed = runs
    feats = featurize_runs(configs, composed, ["v3.1", "v4.0", None, "unknown"])
    np.testing.assert_array_equal(feats[RELEASE_COLUMN].to_numpy(), [3.1, 4.0, np.nan, np.nan])
    assert software_release("V5.0") == 5.0 and np.isnan(software_release(float("nan")))
    with pytest.raises(SpecError, match="4 configs but 1 releases"):
        featurize_runs(configs, composed, ["v4.1"])


def test_values_describe_the_config(runs):
    configs, composed = runs
    feats = featurize_runs(configs, composed)
    assert feats["tp"].tolist() == [1, 2, 8, 2]
    assert feats["tp_spans_domains"].tolist() == [0, 0, 0, 0]
    assert feats["lora"].tolist() == [0, 0, 0, 1]
    assert feats["dtype_bytes"].tolist() == [2, 2, 2, 1]
    assert feats.loc[1, "sequence_parallel"] == 1 and feats.loc[1, "vpp"] == 2
    assert feats["log2_hidden_per_tp"].tolist() == pytest.approx(np.log2([4096, 2048, 512, 2048]))
    assert feats["log2_num_gpus"].tolist() == pytest.approx(np.log2([8, 8, 16, 8]))
    np.testing.assert_allclose(np.exp(feats["log_composed_step_ms"]), composed["step_ms"])


def test_breakdown_fractions_sum_to_one(runs):
    configs, composed = runs
    feats = featurize_runs(configs, composed)
    fracs = feats[[c for c in feats.columns if c.startswith("frac_")]]
    np.testing.assert_allclose(fracs.sum(axis=1), 1.0, rtol=1e-9)
    assert feats.loc[0, "frac_comm_tp"] == 0 and feats.loc[2, "frac_comm_tp"] > 0
    assert feats.loc[0, "frac_bubble"] == 0 and feats.loc[1, "frac_bubble"] > 0


def test_bad_inputs_are_refused(runs):
    configs, composed = runs
    with pytest.raises(SpecError, match="configs"):
        featurize_runs(configs[:2], composed)
    with pytest.raises(SpecError, match="lacks"):
        featurize_runs(configs, composed.drop(columns="bubble_ms"))
    with pytest.raises(SpecError, match="> 0"):
        featurize_runs(configs, composed.assign(step_ms=0.0))


def _reference_row(c) -> dict[str, float]:
    """The features of one config, spelled out from its specs one by one."""
    m, p, cl = c.model, c.parallel, c.cluster
    tokens = p.micro_batch * m.seq_len / p.cp
    recompute = {"none": 0, "selective": 1, "full": 2}[p.recompute.value]
    return {
        "tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "ep": p.ep, "micro_batch": p.micro_batch,
        "log2_num_microbatches": np.log2(p.num_microbatches), "log2_global_batch": np.log2(p.global_batch),
        "vpp": p.vpp, "sequence_parallel": float(p.sequence_parallel and p.tp > 1), "zero_stage": p.zero_stage,
        "recompute": recompute, "lora": float(p.finetune.value == "lora"), "dtype_bytes": p.dtype.bytes_per_element,
        "flash_attention": float(p.flash_attention), "log2_hidden": np.log2(m.hidden_size),
        "num_layers": m.num_layers, "layers_per_stage": m.num_layers / p.pp, "log2_seq_len": np.log2(m.seq_len),
        "log10_params": np.log10(m.num_params), "head_dim": m.head_size, "ffn_ratio": m.ffn_size / m.hidden_size,
        "is_moe": float(m.is_moe), "gated_mlp": float(m.gated_mlp), "peak_tflops": cl.gpu.peak_tflops(p.dtype),
        "mem_bw_gbps": cl.gpu.mem_bw_gbps, "sm_count": cl.gpu.sm_count, "l2_cache_mib": cl.gpu.l2_cache_mib,
        "intra_node_bw_gbps": cl.intra_node_bw_gbps, "inter_node_bw_gbps": cl.inter_node_bw_gbps,
        "nvlink_domain": cl.nvlink_domain, "log2_num_gpus": np.log2(cl.num_gpus), "num_domains": cl.num_domains,
        "tp_spans_domains": float(p.tp > cl.nvlink_domain), "log2_tokens_per_microbatch": np.log2(tokens),
        "log2_hidden_per_tp": np.log2(m.hidden_size / p.tp), "log2_ffn_per_tp": np.log2(m.ffn_size / p.tp),
        "log2_layer_gflops_per_microbatch": np.log2(2.0 * tokens * m.num_params_per_layer(moe=False) / p.tp / 1e9),
    }  # fmt: skip


def test_column_wise_features_equal_each_configs_own():
    from perfcast.features.run_config import parse_run_table

    rows = [{**BASE, **layout} for layout in LAYOUTS]
    rows += [{**BASE, "model": "mixtral-8x7b", "tp": 2, "dp": 4, "ep": 4, "cp": 2, "num_gpus": 16,
              "gpu": "a100-sxm4-80gb", "zero_stage": 1, "recompute": "full", "flash_attention": False}]  # fmt: skip
    configs = parse_run_table(pd.DataFrame(rows + rows[::-1]))  # rows share specs
    feats = featurize_runs(configs, _composed(configs))
    expected = pd.DataFrame([_reference_row(c) for c in configs], dtype=float)
    pd.testing.assert_frame_equal(feats[expected.columns], expected, rtol=1e-14)


def test_software_switches_count_only_where_the_layout_has_their_mechanism():
    rows = [
        {"dp": 8, "framework": "pytorch-fsdp"},  # ZeRO-3: grad sync overlapped, prefetch
        {"dp": 8, "framework": "megatron-core"},  # ZeRO-1: grad sync and param gather overlapped
        {"tp": 8, "dp": 1, "framework": "megatron-core", "sequence_parallel": True},  # no dp: tp overlap only
        {"dp": 8},  # no framework: megatron-deepspeed, nothing overlapped
        {"dp": 8, "framework": "torchtitan", "cuda_graphs": True},
    ]
    configs = [parse_run_row({**BASE, **row}) for row in rows]
    feats = featurize_runs(configs, _composed(configs))
    cols = ["overlap_grad_reduce", "overlap_param_gather", "fsdp_prefetch", "tp_comm_overlap", "cuda_graphs",
            "torch_compile"]  # fmt: skip
    expected = [[1, 0, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 1, 1]]
    np.testing.assert_array_equal(feats[cols].to_numpy(), expected)
