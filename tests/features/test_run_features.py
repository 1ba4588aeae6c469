"""Tests of the run-level features of the step models."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import SpecError
from perfcast.features.roofline import op_time_ms
from perfcast.features.run_config import parse_run_row
from perfcast.features.run_features import RUN_FEATURE_SPEC, featurize_runs
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


def test_columns_follow_the_spec_and_have_no_nan(runs):
    configs, composed = runs
    feats = featurize_runs(configs, composed)
    assert tuple(feats.columns) == RUN_FEATURE_SPEC.columns
    assert len(feats) == len(configs)
    assert not feats.isna().any().any()
    assert all(dtype == np.float64 for dtype in feats.dtypes)


def test_values_describe_the_config(runs):
    configs, composed = runs
    feats = featurize_runs(configs, composed)
    assert feats["tp"].tolist() == [1, 2, 8, 2]
    assert feats["tp_spans_nodes"].tolist() == [0, 0, 0, 0]
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
