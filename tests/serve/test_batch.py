"""Tests of batch prediction (run and op tables) and the `perfcast predict` and `models` commands."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from fixtures.analytic_step import analytic_step
from typer.testing import CliRunner

import perfcast
from perfcast.data.tables import ERROR_COLUMN, OP_OUTPUT_COLUMNS, RUN_OUTPUT_COLUMNS, read_table
from perfcast.errors import SpecError
from perfcast.features.model import list_models
from perfcast.features.run_config import parse_run_row
from perfcast.models import analytic
from perfcast.models.bundle import PredictorBundle
from perfcast.models.op_model import OpTimeRegressor
from perfcast.serve.batch import predict_ops_table, predict_steps_table
from perfcast.serve.cli import app

runner = CliRunner()

GOOD = {"model": "gpt3-125m", "gpu": "h100-sxm5-80gb", "dp": 2, "micro_batch": 2, "global_batch": 8}
RUNS = pd.DataFrame(
    [
        GOOD,
        {**GOOD, "tp": 5, "dp": 1, "global_batch": 2, "num_gpus": 5},  # 12 heads
        {**GOOD, "gpu": "a100-sxm4-80gb"},
        {**GOOD, "global_batch": 7},
        {**GOOD, "gpu": "v100-sxm2-32gb", "dtype": "bf16"},  # no bf16 on Volta
        {**GOOD, "model": "llama2-7b", "tp": 2, "sequence_parallel": True, "num_gpus": 4},
    ],
    index=[10, 3, 7, 0, 5, 1],
)

OPS = pd.DataFrame(
    [
        {"op": "matmul", "m": 4096, "n": 4096, "k": 4096, "gpu": "h100-sxm5-80gb"},
        {"op": "matmul", "m": 4096, "n": 4096, "k": 4096, "gpu": "rtx-9090"},
        {"op": "allreduce", "bytes": 1 << 28, "n_ranks": 16, "ranks_per_node": 8, "gpu": "h100"},
        {"op": "conv2d", "m": 1, "n": 1, "k": 1, "gpu": "h100"},
        {"op": "layernorm", "rows": 8192, "cols": 4096, "dtype": "bf16", "gpu": "a100-sxm4-80gb"},
        {"op": "matmul", "m": 0, "n": 1, "k": 1, "gpu": "h100"},
        {"op": "matmul", "m": 64, "n": 64, "k": 64, "gpu": "h100-nvl-94gb"},  # catalog has no peaks
        {
            "op": "attention",
            "batch": 1,
            "heads": 8,
            "seq_q": 128,
            "seq_kv": 128,
            "head_dim": 64,
            "causal": True,
            "gpu": "h100",
            "dtype": "bf16",
        },
    ]
)


# ------------------------------------------------------------------ run tables


def test_bad_rows_get_errors_and_good_rows_answers_in_order():
    out = predict_steps_table(RUNS)
    assert list(out.index) == list(RUNS.index)
    pd.testing.assert_frame_equal(out[RUNS.columns], RUNS)
    assert set(RUN_OUTPUT_COLUMNS) | {ERROR_COLUMN} <= set(out.columns)
    errors = out[ERROR_COLUMN].tolist()
    assert errors[0] == errors[2] == errors[5] == ""
    assert "tp=5 does not divide num_heads=12" in errors[1]
    assert "global_batch=7" in errors[3]
    assert "bf16 is not supported on v100" in errors[4]
    good = out[out[ERROR_COLUMN] == ""]
    bad = out[out[ERROR_COLUMN] != ""]
    assert (good["step_ms"] > 0).all() and good["fits_memory"].map(lambda v: isinstance(v, (bool, np.bool_))).all()
    assert bad[["step_ms", "peak_mem_gib", "mfu", "tokens_per_s"]].isna().all().all()
    # the analytic model gives no interval
    assert out[["step_lo_ms", "step_hi_ms"]].isna().all().all()
    # A100 is slower than H100 for the same config
    assert out["step_ms"].iloc[2] > out["step_ms"].iloc[0]


def test_breakdown_columns_sum_to_step():
    out = predict_steps_table(RUNS, breakdown=True)
    assert out.columns[-1] == ERROR_COLUMN
    good = out[out[ERROR_COLUMN] == ""]
    comm = [c for c in out.columns if c.startswith("comm_")]
    assert "comm_tp_ms" in comm
    parts = good[["compute_ms", "attention_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms", *comm]].fillna(0).sum(axis=1)
    np.testing.assert_allclose(parts, good["step_ms"], rtol=1e-9)
    mem = good[["weights_gib", "grads_gib", "optimizer_gib", "activations_gib"]].sum(axis=1)
    np.testing.assert_allclose(mem, good["peak_mem_gib"], rtol=1e-9)


def test_progress_counts_every_row_and_coverage_is_checked():
    seen: list[int] = []
    predict_steps_table(RUNS, progress=seen.append)
    assert sum(seen) == len(RUNS)
    with pytest.raises(SpecError, match="coverage=1.5"):
        predict_steps_table(RUNS, coverage=1.5)


def test_analytic_step_predictor_matches_the_analytic_model():
    good = RUNS.iloc[[0, 2, 5]]
    out = predict_steps_table(good)
    expected = [analytic_step(parse_run_row(r.to_dict())).step_ms for _, r in good.iterrows()]
    np.testing.assert_allclose(out["step_ms"], expected, rtol=1e-9)


def test_learned_step_predictor_gives_an_interval_and_learned_breakdown():
    from perfcast.serve.predictors import load_step_predictor

    predictor = load_step_predictor("composed")
    out = predict_steps_table(RUNS, predictor=predictor, breakdown=True, coverage=0.8)
    good = out[out[ERROR_COLUMN] == ""]
    assert (good["step_lo_ms"] <= good["step_ms"]).all() and (good["step_ms"] <= good["step_hi_ms"]).all()
    assert (good["step_hi_ms"] > good["step_lo_ms"]).any()
    comm = [c for c in out.columns if c.startswith("comm_")]
    parts = good[["compute_ms", "attention_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms", *comm]].fillna(0).sum(axis=1)
    np.testing.assert_allclose(parts, good["step_ms"], rtol=1e-9)


# ------------------------------------------------------------------ op tables


def test_op_table_reports_bad_rows_and_answers_good_ones():
    out = predict_ops_table(OPS)
    assert len(out) == len(OPS) and set(OP_OUTPUT_COLUMNS) <= set(out.columns)
    errors = out[ERROR_COLUMN].tolist()
    assert [i for i, e in enumerate(errors) if e == ""] == [0, 2, 4, 7]
    assert "rtx-9090" in errors[1]
    assert "op='conv2d' is not a known op" in errors[3]
    assert errors[5].startswith("m=0.0 is out of range; allowed: 1..")
    assert "h100-nvl-94gb has no bf16 peak" in errors[6]
    good = out[out[ERROR_COLUMN] == ""]
    assert (good["pred_ms"] > 0).all()
    assert out.loc[out[ERROR_COLUMN] != "", "pred_ms"].isna().all()
    assert out[["pred_lo_ms", "pred_hi_ms"]].isna().all().all()
    # a 4096^3 bf16 GEMM at H100's dense peak: 2*4096^3 / 989.5e12 s
    assert out["pred_ms"].iloc[0] == pytest.approx(2 * 4096**3 / 989.5e12 * 1e3, rel=1e-6)


def test_collective_rows_honour_the_fabric_and_nvlink_bridges():
    pair = {"op": "allreduce", "bytes": 2**28, "n_ranks": 2, "gpu": "a100-pcie-80gb", "dtype": "fp16"}
    ops = pd.DataFrame([
        {**pair, "ranks_per_node": 2},
        {**pair, "ranks_per_node": 2, "nvlink_bridged": "true"},
        {**pair, "ranks_per_node": 1},
        {**pair, "ranks_per_node": 1, "inter_node": "ib-ndr-400-dgx-h100"},
        {**pair, "ranks_per_node": 2, "nvlink_bridged": True, "gpu": "p100-pcie-16gb"},
        {**pair, "ranks_per_node": 1, "inter_node": "ib-ndr-400"},
    ])  # fmt: skip
    out = predict_ops_table(ops)
    pred, errors = out["pred_ms"].to_numpy(), out[ERROR_COLUMN].tolist()
    assert pred[1] < pred[0] / 5  # the bridge (300 GB/s a direction) instead of PCIe (32)
    assert pred[3] < pred[2] / 5  # NDR-400 instead of the card's default EDR-100
    assert "p100-pcie-16gb has no nvlink_bridge_bw_gbps" in errors[4]
    assert "inter_node='ib-ndr-400' is not a known fabric" in errors[5]
    assert errors[:4] == ["", "", "", ""]


def test_op_table_all_bad_rows():
    out = predict_ops_table(OPS.iloc[[1, 3]])
    assert (out[ERROR_COLUMN] != "").all() and out["pred_ms"].isna().all()


# ------------------------------------------------------------------ CLI


@pytest.mark.parametrize(("fmt_in", "fmt_out"), [(".csv", ".csv"), (".parquet", ".parquet"), (".csv", ".parquet")])
def test_cli_predict_steps_round_trip(tmp_path, fmt_in, fmt_out):
    src, dst = tmp_path / f"runs{fmt_in}", tmp_path / f"out{fmt_out}"
    if fmt_in == ".csv":
        RUNS.to_csv(src, index=False)
    else:
        RUNS.to_parquet(src, index=False)
    result = runner.invoke(app, ["predict", "steps", str(src), "-o", str(dst), "--show", "0"])
    assert result.exit_code == 0, result.output
    assert f"wrote {len(RUNS)} rows" in result.stderr and "(3 invalid" in result.stderr
    out = read_table(dst)
    assert len(out) == len(RUNS) and list(out["model"]) == list(RUNS["model"])
    assert (out[ERROR_COLUMN].fillna("") != "").sum() == 3


def test_cli_predict_ops(tmp_path):
    src, dst = tmp_path / "ops.csv", tmp_path / "out.parquet"
    OPS.to_csv(src, index=False)
    result = runner.invoke(app, ["predict", "ops", str(src), "-o", str(dst)])
    assert result.exit_code == 0, result.output
    out = read_table(dst)
    assert len(out) == len(OPS) and out["pred_ms"].notna().sum() == 4
    assert "op predictions" in result.stdout


@pytest.mark.parametrize("cmd", ["steps", "ops"])
def test_cli_missing_input_is_a_one_line_error(tmp_path, cmd):
    result = runner.invoke(app, ["predict", cmd, str(tmp_path / "nope.csv"), "-o", str(tmp_path / "out.csv")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "nope.csv" in lines[0]
    assert not (tmp_path / "out.csv").exists()


def test_cli_bad_output_suffix(tmp_path):
    result = runner.invoke(app, ["predict", "steps", "-o", str(tmp_path / "out.txt"), "--show", "0"])
    assert result.exit_code == 2 and result.stderr.strip().splitlines()[-1].startswith("error:")


@pytest.mark.parametrize(("cmd", "rows"), [("steps", None), ("ops", None)])
def test_cli_without_input_uses_the_packaged_example(tmp_path, cmd, rows):
    dst = tmp_path / "out.csv"
    result = runner.invoke(app, ["predict", cmd, "-o", str(dst), "--show", "0"])
    assert result.exit_code == 0, result.output
    assert "packaged example" in result.stderr
    out = read_table(dst)
    assert len(out) > 5 and (out[ERROR_COLUMN].fillna("") == "").sum() >= len(out) - 2


def test_cli_models_list_and_show():
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0, result.output
    assert "llama2-7b" in result.stdout and len(list_models()) >= 10
    result = runner.invoke(app, ["models", "show", "llama2-7b"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["num_layers"] == 32 and 6.5e9 < data["num_params"] < 7e9
    result = runner.invoke(app, ["models", "show", "nope-7b"])
    assert result.exit_code == 2 and result.stderr.startswith("error:")


def test_learned_steps_flag_extrapolation_per_config():
    from perfcast.errors import OutOfDomainWarning
    from perfcast.serve.predictors import load_step_predictor

    runs = pd.concat([RUNS, RUNS.iloc[[0]].assign(gpu="mi300x")], ignore_index=True)
    with pytest.warns(OutOfDomainWarning, match="out_of_domain"):
        out = predict_steps_table(runs, predictor=load_step_predictor(None))
    flags = out["out_of_domain"]
    valid = out[ERROR_COLUMN] == ""
    assert flags[~valid].isna().all() and flags[valid].notna().all()
    # MI300X's descriptors lie beyond every GPU of the default op data, and gpt3-125m's attention has
    # head_dim 64 where the default measured 128 only; llama2-7b on H100 (between V100 and H200) is inside,
    # and its optimizer step (larger than any measured vector op) does not flag it by itself
    assert flags[valid & (out["gpu"] == "mi300x")].all()
    assert flags[valid & (out["model"] == "gpt3-125m") & (out["gpu"] == "h100-sxm5-80gb")].all()
    assert not flags[valid & (out["model"] == "llama2-7b")].any()
    assert "out_of_domain" not in predict_steps_table(RUNS).columns  # the analytic model does not say


class RefusingPredictor:
    """The analytic step predictor, refusing every batch that holds an A100 config."""

    name = "refusing"
    flags_out_of_domain = False

    def __init__(self):
        from perfcast.models.step_predictor import StepPredictor

        self.base, self.calls = StepPredictor.analytic(), 0

    def predict_configs(self, configs, coverage=0.9):
        self.calls += 1
        if any(c.cluster.gpu.id == "a100-sxm4-80gb" for c in configs):
            raise SpecError("no A100 today")
        return self.base.predict_configs(configs, coverage=coverage)


def test_configs_a_predictor_refuses_get_its_reason_and_the_rest_answers():
    runs = pd.DataFrame([GOOD] * 5 + [{**GOOD, "gpu": "a100-sxm4-80gb"}] + [GOOD] * 10 + [{**GOOD, "tp": 5}])
    predictor = RefusingPredictor()
    out = predict_steps_table(runs, predictor=predictor, breakdown=True)
    assert out[ERROR_COLUMN].tolist() == [""] * 5 + ["no A100 today"] + [""] * 10 + [out[ERROR_COLUMN].iloc[-1]]
    assert out[ERROR_COLUMN].iloc[-1] not in ("", "no A100 today")  # a bad row, reported before predicting
    expected = predict_steps_table(runs.iloc[[0]])["step_ms"].iloc[0]
    np.testing.assert_allclose(out["step_ms"].drop(index=[5, 16]), expected, rtol=1e-12)
    assert predictor.calls < 16  # halved down to the refused config, not one call per config


def test_steps_table_equals_the_per_config_functions():
    """Step time, memory, MFU and tokens/s of every row, against the analytic model's per-config answers."""
    from perfcast.features.memory import peak_memory

    layouts = [{"dp": 2}, {"tp": 2, "pp": 2, "dp": 2, "vpp": 2, "num_gpus": 8, "recompute": "selective"},
               {"pp": 2, "dp": 4, "zero_stage": 3, "recompute": "full", "num_gpus": 8},
               {"tp": 4, "cp": 2, "sequence_parallel": True, "num_gpus": 8, "dp": 1, "global_batch": 4},
               {"dp": 4, "zero_stage": 1, "gpu": "a100-sxm4-80gb", "num_gpus": 4}]  # fmt: skip
    runs = pd.DataFrame([{**GOOD, **layout} for layout in layouts] + [{**GOOD, "global_batch": 7}])
    out = predict_steps_table(runs)
    assert out[ERROR_COLUMN].tolist()[:-1] == [""] * len(layouts) and "global_batch=7" in out[ERROR_COLUMN].iloc[-1]
    for i, (_, row) in enumerate(runs.iloc[:-1].iterrows()):
        config = parse_run_row(row.to_dict())
        step_ms = analytic_step(config).step_ms
        memory = peak_memory(config.model, config.parallel, config.cluster)
        peak_flops = config.cluster.gpu.peak_tflops(config.parallel.dtype) * 1e12 * config.cluster.num_gpus
        assert out["step_ms"].iloc[i] == pytest.approx(step_ms, rel=1e-12)
        assert out["peak_mem_gib"].iloc[i] == pytest.approx(memory.total_gib, rel=1e-15)
        assert out["fits_memory"].iloc[i] == memory.fits(config.cluster.gpu.mem_gib)
        mfu = analytic.model_flops_per_step(config) / (step_ms / 1e3 * peak_flops)
        assert out["mfu"].iloc[i] == pytest.approx(mfu, rel=1e-12)
        assert out["tokens_per_s"].iloc[i] == pytest.approx(config.tokens_per_step / step_ms * 1e3, rel=1e-12)


# ------------------------------------------------------------------ hardening


@pytest.mark.parametrize("kind", ["steps", "ops"])
def test_a_prediction_fed_back_in_is_predicted_anew(tmp_path, kind):
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    for source, target in ((None, first), (first, second)):
        args = ["predict", kind, *([str(source)] if source else []), "-o", str(target), "--show", "0",
                "--no-calibration"]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
    a, b = read_table(first), read_table(second)
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    column = "step_ms" if kind == "steps" else "pred_ms"
    np.testing.assert_allclose(a[column].to_numpy(float), b[column].to_numpy(float))
    assert (a[ERROR_COLUMN].fillna("") == b[ERROR_COLUMN].fillna("")).all()


def test_a_huge_value_is_one_rows_error_and_the_batch_is_answered():
    good = {"model": "llama2-7b", "tp": 2, "dp": 4, "global_batch": 32, "gpu": "h100-sxm5-80gb", "num_gpus": 8}
    rows = [good, {**good, "seq_len": 1e30}, {**good, "hidden_size": 2**40}, {**good, "vocab_size": 2**62},
            {**good, "num_gpus": float("inf")}, {**good, "tp": 2.5}, good]  # fmt: skip
    out = predict_steps_table(pd.DataFrame(rows))
    errors = out[ERROR_COLUMN].tolist()
    assert errors[0] == errors[-1] == "" and out["step_ms"].iloc[0] == out["step_ms"].iloc[-1] > 0
    for error, field in zip(errors[1:-1], ["seq_len", "hidden_size", "vocab_size", "num_gpus", "tp"], strict=True):
        assert error.startswith(f"{field}=") and "allowed" in error


def test_op_rows_with_impossible_sizes_or_flags_are_refused_and_no_time_is_negative_or_infinite():
    gemm = {"op": "matmul", "m": 64, "n": 64, "k": 64, "gpu": "h100-sxm5-80gb", "dtype": "bf16"}
    attention = {"op": "attention", "batch": 1, "heads": 8, "seq_q": 128, "seq_kv": 128, "head_dim": 64,
                 "gpu": "h100-sxm5-80gb"}  # fmt: skip
    allreduce = {"op": "allreduce", "bytes": 1e6, "n_ranks": 8, "ranks_per_node": 8, "gpu": "h100-sxm5-80gb"}
    rows = [
        {**gemm, "m": -3}, {**gemm, "m": 0}, {**gemm, "m": 2.5}, {**gemm, "batch": "abc"},
        {"op": "gelu", "rows": 1e300, "cols": 1e300, "gpu": "h100-sxm5-80gb"},
        {**attention, "kv_heads": 0}, {**attention, "kv_heads": -8}, {**attention, "kv_heads": 7},
        {**attention, "causal": "sometimes"}, {**allreduce, "ranks_per_node": "x"},
        gemm, attention, allreduce,
    ]  # fmt: skip
    for predictor in (None, analytic.AnalyticOpPredictor()):
        out = predict_ops_table(pd.DataFrame(rows), predictor=predictor)
        errors = out[ERROR_COLUMN].tolist()
        assert all(errors[:10]) and errors[10:] == ["", "", ""], errors
        assert (out["pred_ms"].iloc[10:] > 0).all() and np.isfinite(out["pred_ms"].iloc[10:]).all()
    assert "kv_heads=7 does not divide heads=8" in errors[7]


@pytest.mark.parametrize(
    "extra",
    [
        {"n_ranks": float("inf")},  # was an OverflowError in the analytic predictor's cluster
        {"ranks_per_node": -1},  # was a SpecError escaping the batch
        {"inter_node": "0"},  # was an UnknownEntryError escaping the batch
        {"causal": "abc", "nvlink_bridged": "maybe"},  # was a SpecError from the flag conversion
        {"rows": 10**400, "n_repeats": 10**400},  # was an OverflowError from pd.to_numeric
    ],
    ids=["n_ranks-inf", "ranks_per_node-negative", "inter_node-unknown", "foreign-flags", "int-beyond-float"],
)
def test_fields_of_another_op_class_do_not_reach_the_predictor(extra):
    gemm = {"op": "matmul", "m": 1024, "n": 1024, "k": 1024, "gpu": "h100-sxm5-80gb"}
    out = predict_ops_table(pd.DataFrame([gemm, {**gemm, **extra}]))
    assert out[ERROR_COLUMN].tolist() == ["", ""]
    assert out["pred_ms"].iloc[1] == out["pred_ms"].iloc[0]


def test_an_int_beyond_float_range_is_a_row_error_not_a_crash():
    gemm = {"op": "matmul", "m": 1024, "n": 1024, "k": 1024, "gpu": "h100-sxm5-80gb"}
    out = predict_ops_table(pd.DataFrame([gemm, {**gemm, "m": 10**400}]))
    assert out[ERROR_COLUMN].iloc[0] == "" and "m=" in out[ERROR_COLUMN].iloc[1]


BAD_TIMING = "timing='wallclock' is not a known timing; allowed: gpu_kernels, cuda_events, loop_mean, cpu_op"
TIMED_GEMM = {"op": "matmul", "m": 256, "n": 256, "k": 256, "gpu": "a100-pcie-40gb", "dtype": "fp16"}
TIMED_ROWS = pd.DataFrame(
    [TIMED_GEMM, {**TIMED_GEMM, "timing": "wallclock"}, {**TIMED_GEMM, "timing": " CUDA_Events "}, TIMED_GEMM]
)  # the last row's timing is missing: the query default


@pytest.fixture(scope="module")
def timed_predictor() -> PredictorBundle:
    """A bundle whose op model reads each row's timing method (fitted on CUDA-event times)."""
    rng = np.random.default_rng(0)
    dims = rng.integers(8, 2048, size=(300, 3))
    gpus = rng.choice(["a100-pcie-40gb", "v100-pcie-32gb", "t4"], 300)
    ops = pd.DataFrame({"op": "matmul", "m": dims[:, 0], "n": dims[:, 1], "k": dims[:, 2], "dtype": "fp16",
                        "gpu": gpus, "timing": "cuda_events"})  # fmt: skip
    t = 0.012 + 2 * dims.prod(axis=1) / 5e10
    model = OpTimeRegressor(n_estimators=10, calibrate=False, n_jobs=1, timing=True).fit(ops, t)
    return PredictorBundle(path=None, manifest={}, op_model=model)


def test_a_bad_timing_is_that_rows_error_and_the_other_rows_are_answered(timed_predictor):
    with pytest.raises(SpecError, match="timing='wallclock'"):  # the model alone refuses the whole batch
        timed_predictor.op_model.predict(TIMED_ROWS)
    for predictor in (timed_predictor, None):
        out = predict_ops_table(TIMED_ROWS, predictor=predictor)
        assert out[ERROR_COLUMN].tolist() == ["", BAD_TIMING, "", ""]
        assert out["pred_ms"].notna().tolist() == [True, False, True, True]
    pred = predict_ops_table(TIMED_ROWS, predictor=timed_predictor)["pred_ms"]
    assert pred[2] > pred[0] == pred[3]  # the launch-inclusive timing is read; a missing one is the kernel time


def test_a_bad_timing_through_the_python_api_and_the_cli(tmp_path):
    out = perfcast.predict_ops(TIMED_ROWS)
    assert out[ERROR_COLUMN].tolist() == ["", BAD_TIMING, "", ""]
    src, dst = tmp_path / "ops.csv", tmp_path / "out.csv"
    TIMED_ROWS.to_csv(src, index=False)
    result = runner.invoke(app, ["predict", "ops", str(src), "-o", str(dst)])
    assert result.exit_code == 0, result.output
    written = read_table(dst)
    assert written[ERROR_COLUMN].fillna("").tolist() == ["", BAD_TIMING, "", ""]
    assert written["pred_ms"].notna().tolist() == [True, False, True, True]


# ------------------------------------------------------------------ output formats


def test_predictions_go_to_stdout_as_json_jsonl_or_csv(tmp_path):
    for fmt in ("json", "jsonl", "csv"):
        result = CliRunner().invoke(app, ["predict", "steps", "-o", "-", "--format", fmt, "--model", "analytic"])
        assert result.exit_code == 0, result.output
        text = result.stdout
        if fmt == "json":
            rows = json.loads(text)
        elif fmt == "jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            rows = pd.read_csv(__import__("io").StringIO(text)).to_dict("records")
        assert len(rows) == 12 and rows[0]["step_ms"] > 0 and rows[-1]["error"]
    refused = CliRunner().invoke(app, ["predict", "steps", "-o", "-", "--format", "parquet"])
    assert refused.exit_code == 2 and "standard output" in refused.output
    clash = CliRunner().invoke(app, ["predict", "steps", "-o", str(tmp_path / "x.csv"), "--format", "json"])
    assert clash.exit_code == 2 and "contradicts" in clash.output


def test_a_human_table_shows_plain_numbers_units_and_every_row():
    result = CliRunner().invoke(app, ["predict", "steps", "-o", "-", "--format", "table", "--model", "analytic"])
    assert result.exit_code == 0, result.output
    assert "e+0" not in result.stdout and "e-0" not in result.stdout
    assert " s " in result.stdout or " ms " in result.stdout
    assert "mi300x" in result.stdout and "tp=3 does not" in result.stdout  # the last rows are shown too


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_json_tables_in_and_out(tmp_path, suffix):
    src, dst = tmp_path / f"runs{suffix}", tmp_path / f"out{suffix}"
    RUNS.head(3).to_json(src, orient="records", lines=suffix == ".jsonl")
    result = CliRunner().invoke(app, ["predict", "steps", str(src), "-o", str(dst), "--model", "analytic"])
    assert result.exit_code == 0, result.output
    assert (read_table(dst)["step_ms"].notna()).sum() >= 1 and len(read_table(dst)) == 3


def test_predict_steps_plot_draws_the_breakdown(tmp_path):
    import matplotlib.image

    plot = tmp_path / "breakdown.png"
    args = [
        "predict",
        "steps",
        "-o",
        str(tmp_path / "p.csv"),
        "--model",
        "analytic",
        "--plot",
        str(plot),
        "--show",
        "0",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert matplotlib.image.imread(plot).shape[0] > 200
    assert "compute_ms" in read_table(tmp_path / "p.csv").columns  # --plot turns the breakdown on


def test_a_stated_framework_gets_its_stacks_attention_factor_and_an_unstated_one_the_global():
    from perfcast.serve.predictors import load_step_predictor

    predictor = load_step_predictor(None)
    factors = predictor.step_model.factors_
    row = {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "dp": 8, "micro_batch": 1, "global_batch": 64,
           "seq_len": 8192, "dtype": "bf16"}  # fmt: skip
    stated = pd.DataFrame([row, {**row, "framework": "torchtitan"}])
    composed = predict_steps_table(stated, predictor=load_step_predictor("composed"), breakdown=True)
    learned = predict_steps_table(stated, predictor=predictor, breakdown=True)
    assert (learned[ERROR_COLUMN] == "").all()
    # each part's own factor first, then every part scaled alike to the step: the share ratio shows their quotient
    ratio = (learned["attention_ms"] / learned["step_ms"]) / (composed["attention_ms"] / composed["step_ms"])
    others = (learned["compute_ms"] / learned["step_ms"]) / (composed["compute_ms"] / composed["step_ms"])
    expected = [factors.of_stack(s)["attention"] for s in (None, "flash-attention-2")]  # the compute is not rescaled
    np.testing.assert_allclose(ratio / others, expected, rtol=1e-6)


class _Capped:
    """The analytic step predictor under MFU ceilings of 20% on Hopper and 95% on Ampere (tensor cores)."""

    name = "capped"
    flags_out_of_domain = False

    def __init__(self) -> None:
        from perfcast.models.physics_bounds import MFUCeiling
        from perfcast.models.step_predictor import StepPredictor

        self.base = StepPredictor.analytic()
        self.mfu_ceiling = MFUCeiling(margin=0.0)
        self.mfu_ceiling.best_ = {("hopper", "tensor"): 0.2, ("ampere", "tensor"): 0.95}

    def ceilings(self, configs):
        return self.mfu_ceiling.ceiling(configs)

    def predict_configs(self, configs, *, coverage=0.9):
        from perfcast.models.physics_bounds import apply_floor

        frame = self.base.predict_configs(configs, coverage=coverage)
        frame["step_ms"], frame["step_lo_ms"], frame["step_hi_ms"], _ = apply_floor(
            frame["step_ms"], frame["step_lo_ms"], frame["step_hi_ms"], self.mfu_ceiling.floor_ms(configs)
        )
        return frame


def test_steps_on_their_mfu_ceiling_are_flagged_and_warned_about():
    from perfcast.errors import AtMFUCeilingWarning

    runs = pd.DataFrame([{**GOOD, "model": "llama2-7b"}, {**GOOD, "gpu": "a100-sxm4-80gb"}, {**GOOD, "tp": 5}])
    with pytest.warns(AtMFUCeilingWarning, match="1 of 2 configs"):
        out = predict_steps_table(runs, predictor=_Capped())
    assert out["at_mfu_ceiling"].tolist()[:2] == [True, False] and pd.isna(out["at_mfu_ceiling"].iloc[2])
    assert out["mfu"].iloc[0] == pytest.approx(0.2)  # raised to the ceiling, and said so
    plain = predict_steps_table(runs.iloc[:2], predictor=_Capped().base)  # 100% of peak: nothing reaches it
    assert not plain["at_mfu_ceiling"].any()


def test_an_op_input_spelt_in_another_case_is_its_rows_error():
    gemm = {"op": "matmul", "m": 1024, "n": 1024, "k": 1024, "gpu": "h100-sxm5-80gb"}
    ops = pd.DataFrame([{**gemm, "Batch": 8}, {**gemm, "batch": 8, "Batch": 8}, {**gemm, "batch": 8, "Batch": 4}, gemm])
    errors = predict_ops_table(ops, predictor=analytic.AnalyticOpPredictor())[ERROR_COLUMN].tolist()
    assert "'Batch' as 'batch'" in errors[0] and errors[1] == "" and errors[3] == ""
    assert "column 'Batch'=4 conflicts with batch=8" in errors[2]
