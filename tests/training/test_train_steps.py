"""Tests of the step-training pipeline: loading, parsing with reasons, splits and metrics."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
from fixtures.analytic_step import analytic_step
from fixtures.shared import shared_file

from perfcast.features.run_config import parse_run_row
from perfcast.models.analytic import AnalyticOpPredictor
from perfcast.models.composer import StepComposer
from perfcast.training.train_steps import (
    ENCODER_DECODER_ARCHITECTURES,
    build_step_table,
    domain_groups,
    evaluate_steps,
    fit_step_model,
    group_spearman,
    load_runs,
    split_mlperf_old_to_new,
    split_mlperf_small_to_large,
    split_vtrain_small_to_large,
)


def _runs() -> tuple[pd.DataFrame, pd.Series]:
    """vTrain-like runs on 2, 4 and 8 A100s with a measured time 1.5x-2x the analytic one, and one bad row."""
    rows = []
    for gpus in (2, 4, 8):
        for tp in (1, 2):
            for mb in (1, 2, 4):
                dp = gpus // tp
                rows.append(
                    {
                        "model": "gpt3-350m",
                        "gpu": "a100-sxm4-80gb",
                        "num_gpus": gpus,
                        "tp": tp,
                        "dp": dp,
                        "micro_batch": mb,
                        "global_batch": 8 * dp,
                        "source": "vtrain",
                        "timing_scope": "step",
                    }
                )
    rows.append({**rows[0], "tp": 3, "dp": 1, "num_gpus": 3})  # tp=3 does not divide the heads
    runs = pd.DataFrame(rows).assign(measured_step_ms=1.0)
    return runs, 1.5 + 0.25 * runs["tp"] / runs["micro_batch"]


@pytest.fixture(scope="module")
def table():
    runs, factor = _runs()
    composer = StepComposer(AnalyticOpPredictor())
    first = build_step_table(runs, composer)
    ok = runs.index.drop(first.errors["row"])
    runs.loc[ok, "measured_step_ms"] = first.runs["step_ms"].to_numpy() * factor[ok].to_numpy()
    return build_step_table(runs, composer)


def test_invalid_rows_are_reported_not_dropped_silently(table):
    assert len(table.errors) == 1
    assert "tp=3" in table.errors["error"].iloc[0]
    assert len(table.runs) == len(table.features) == len(table.configs) == len(table.steps) == 18


def test_composed_columns_match_the_analytic_predictor(table):
    expected = [analytic_step(c).step_ms for c in table.configs]
    np.testing.assert_allclose(table.runs["step_ms"], expected, rtol=1e-12)
    assert table.runs["group"].nunique() == 3  # one model on three cluster sizes


def test_vtrain_split_trains_small_and_tests_large(table):
    train, test = split_vtrain_small_to_large(table.runs)
    assert set(table.runs.loc[train, "num_gpus"]) == {2, 4}
    assert set(table.runs.loc[test, "num_gpus"]) == {8}
    assert not (train & test).any()


def test_mlperf_splits():
    runs = pd.DataFrame(
        {
            "source": ["mlperf"] * 4 + ["vtrain"],
            "num_gpus": [512, 768, 4096, 64, 8],
            "mlperf_version": ["v3.0", "v3.1", "v3.1", "v4.1", None],
        }
    )
    train, test = split_mlperf_small_to_large(runs)
    assert train.tolist() == [True, True, False, True, True] and test.tolist() == [False, False, True, False, False]
    train, test = split_mlperf_old_to_new(runs)
    assert train.tolist() == [True, True, True, False, True] and test.tolist() == [False, False, False, True, False]


def test_gbdt_corrects_the_composed_step(table):
    train, test = split_vtrain_small_to_large(table.runs)
    model = fit_step_model(table, train, n_estimators=80, max_depth=3, n_jobs=1)
    true = table.runs.loc[test, "measured_step_ms"].to_numpy()
    pred = model.predict(table.features[test])
    lo, hi = model.predict_interval(table.features[test]).T
    gbdt = evaluate_steps(pred, true, table.runs.loc[test, "group"], lo, hi)
    composed = evaluate_steps(table.runs.loc[test, "step_ms"], true, table.runs.loc[test, "group"])
    assert gbdt["mape"] < 0.5 * composed["mape"]
    assert {"coverage", "rel_width", "spearman_mean", "spearman_pooled"} <= set(gbdt)
    assert "coverage" not in composed


def test_domain_groups_name_source_gpu_and_round(table):
    labels = domain_groups(table)
    assert labels.shape == (len(table.runs),) and set(labels) == {"vtrain:a100-sxm4-80gb:"}
    runs = table.runs.assign(source="mlperf", mlperf_version=np.where(np.arange(len(table.runs)) % 2, "v3.1", "v4.1"))
    relabeled_table = type(table)(runs, table.features, table.configs, table.steps, table.errors)
    assert set(domain_groups(relabeled_table)) == {"mlperf:a100-sxm4-80gb:v3.1", "mlperf:a100-sxm4-80gb:v4.1"}
    train = np.ones(len(runs), dtype=bool)
    one = fit_step_model(table, train, n_estimators=20, max_depth=2, n_jobs=1)
    assert len(one.domain_residuals_) == 0  # a single domain: nothing to hold out
    two = fit_step_model(relabeled_table, train, n_estimators=20, max_depth=2, n_jobs=1)
    assert len(two.domain_residuals_) == len(runs)
    off = fit_step_model(relabeled_table, train, hold_out_domains=False, n_estimators=20, max_depth=2, n_jobs=1)
    assert len(off.domain_residuals_) == 0


def test_group_spearman_counts_only_groups_large_enough():
    pred = [1, 2, 3, 4, 1, 2, 5]
    true = [1, 2, 3, 4, 2, 1, 7]
    out = group_spearman(pred, true, ["a"] * 4 + ["b"] * 2 + ["c"])
    assert out["spearman_groups"] == 1 and out["spearman_mean"] == pytest.approx(1.0)
    assert group_spearman([1, 1, 1], [1, 2, 3], ["a"] * 3)["spearman_groups"] == 0


def test_real_vtrain_file_loads_parses_and_splits():
    path = shared_file("vtrain_megatron_iteration_time.csv")
    runs = load_runs(path.parent, sources=["vtrain"])
    assert len(runs) == 1440 and set(runs["source"]) == {"vtrain"}
    sample = runs.groupby("num_gpus").head(20).reset_index(drop=True)
    table = build_step_table(sample, StepComposer(AnalyticOpPredictor()))
    assert table.errors.empty
    expected = [analytic_step(c).step_ms for c in table.configs]
    np.testing.assert_allclose(table.runs["step_ms"], expected, rtol=1e-12)
    train, test = split_vtrain_small_to_large(runs.assign(num_gpus=runs["num_gpus"].astype(int)))
    assert (train.sum(), test.sum()) == (720, 720)


def test_rows_flagged_overlap_grad_reduce_hide_the_dp_sync():
    runs, _ = _runs()
    runs = runs[runs["num_gpus"] == 8].reset_index(drop=True)
    flagged = pd.concat([runs, runs.assign(overlap_grad_reduce=True)], ignore_index=True)
    table = build_step_table(flagged, StepComposer(AnalyticOpPredictor()))
    half = len(runs)
    plain, hidden = table.runs["dp_sync_ms"][:half].to_numpy(), table.runs["dp_sync_ms"][half:].to_numpy()
    assert (hidden <= plain).all() and (hidden < plain).any()
    expected = StepComposer(AnalyticOpPredictor(), overlap_grad_reduce=True).compose_many(table.configs[half:])
    np.testing.assert_allclose(table.runs["step_ms"][half:], [s.step_ms for s in expected], rtol=1e-12)


def test_real_mlperf_rows_get_the_interleaving_their_layout_states_elsewhere():
    path = shared_file("mlperf_training_llm_runs.csv")
    runs = load_runs(path.parent, sources=["mlperf"])
    gpt3 = runs[(runs["model"] == "gpt3-175b") & (runs["pp"] == 8) & (runs["micro_batch"] == 1)]
    assert len(gpt3) and (gpt3["vpp"] == 12).all()
    assert (runs["zero_stage"] == 1).all() and runs["overlap_grad_reduce"].all()


@pytest.mark.shared_data
def test_load_runs_keeps_published_tables_apart() -> None:
    runs = load_runs(shared_file("published_llm_training_steps.csv").parent, sources=["published", "vtrain"])
    sources = set(runs["source"])
    assert {"published:llm-foundry", "published:torchtitan", "vtrain"} <= sources and "published" not in sources
    assert set(runs.loc[runs["source"] == "vtrain", "framework_group"]) == {"megatron-deepspeed"}
    assert set(runs.loc[runs["source"] == "published:torchtitan", "framework_group"]) == {"torchtitan"}
    mpt = runs[runs["model_name"] == "mpt-7b"]
    assert len(mpt) and mpt["model"].isna().all()
    # fine-grained MoE models are read as their presets: latent attention, dense first layers, head size
    moe = runs[runs["model_name"].isin(["qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b"])]
    assert len(moe) == 4 and (moe["model"] == moe["model_name"]).all()
    specs = {row["model"]: parse_run_row(row).model for row in moe.to_dict("records")}
    assert specs["deepseek-v3"].mla is not None and specs["deepseek-v3"].first_dense_layers == 3
    assert specs["qwen3-30b-a3b"].head_size == 128 and specs["gpt-oss-120b"].sliding_window == 128


@pytest.mark.mlflow
def test_a_tracked_step_training_logs_its_held_out_parity_plot(table, tmp_path):
    import matplotlib.image
    import mlflow

    from perfcast.training import tracking
    from perfcast.training.train_steps import evaluate_splits, train_step_predictor

    evaluation = evaluate_splits(table, "gbdt", n_estimators=20, max_depth=3, n_jobs=1)
    held_out = evaluation.attrs["predictions"]
    assert len(held_out) == int(evaluation.loc[evaluation["predictor"] == "gbdt", "n_test"].sum())
    assert (held_out["step_lo_ms"] <= held_out["step_ms"]).all() and (held_out["measured_ms"] > 0).all()

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("steps-plots")
    from perfcast.serve.predictors import load_op_predictor

    runs, _ = _runs()
    valid = runs.index.drop(table.errors["row"])
    runs.loc[valid, "measured_step_ms"] = table.runs["measured_step_ms"].to_numpy()
    runs["framework"] = np.where(np.arange(len(runs)) % 2, "torchtitan", "megatron-core")  # two stated stacks
    with mlflow.start_run() as run:
        assert tracking.active()
        train_step_predictor(runs, load_op_predictor(None), output=tmp_path / "bundle",
                             params={"n_estimators": 20, "max_depth": 3, "n_jobs": 1})  # fmt: skip
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="plots/step_parity.png")
    assert matplotlib.image.imread(local).shape[0] > 200
    logged = mlflow.get_run(run.info.run_id).data.params
    assert float(logged["factor.attention"]) > 0  # the fitted physical factor is a tracked parameter
    assert float(logged["factor.attention:flash-attention-2"]) > 0  # and each stack's


@pytest.mark.shared_data
def test_encoder_decoder_runs_are_left_out_and_counted(caplog) -> None:
    path = shared_file("neusight_e2e_latency.csv")
    with caplog.at_level(logging.WARNING, logger="perfcast.training.train_steps"):
        runs = load_runs(path.parent, sources=["neusight"])
    assert len(runs) and not runs["architecture"].isin(ENCODER_DECODER_ARCHITECTURES).any()
    assert "BertLMHeadModel" in set(runs["architecture"])  # an encoder is one stack: kept
    assert any("encoder-decoder" in r.getMessage() and "SwitchTransformers" in r.getMessage() for r in caplog.records)
