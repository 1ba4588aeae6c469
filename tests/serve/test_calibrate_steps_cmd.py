"""`perfcast calibrate steps`: per-cluster corrections from measured runs, used by `predict steps`."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from perfcast.errors import SpecError
from perfcast.models.step_calibration import load_step_corrections
from perfcast.models.step_predictor import StepPredictor
from perfcast.serve.batch import predict_steps_table
from perfcast.serve.calibrate_steps_cmd import fit_step_corrections
from perfcast.serve.cli import app

runner = CliRunner()
KEY = "a100-sxm4-80gb/ib-hdr-200-dgx-a100"
BASE = {"model": "gpt3-125m", "gpu": "a100-sxm4-80gb", "micro_batch": 2, "global_batch": 16}


def _measured(factor: float) -> pd.DataFrame:
    runs = pd.DataFrame([{**BASE, "dp": 1}, {**BASE, "dp": 2}, {**BASE, "dp": 4}, {**BASE, "tp": 5, "dp": 1}])
    pred = predict_steps_table(runs)
    runs["measured_step_ms"] = pred["step_ms"] * factor
    return runs


def test_corrections_recover_a_cluster_wide_factor() -> None:
    runs = _measured(3.0)
    corrections, predicted = fit_step_corrections(runs, StepPredictor.analytic())
    assert [c.cluster for c in corrections] == [KEY]
    assert corrections[0].n_runs == 3  # the tp=5 row is not a valid config
    assert 1.0 < corrections[0].factor < 3.0  # shrunk toward no correction
    assert "tp=5" in predicted["error"].iloc[3]


def test_missing_or_unusable_measurements_are_named() -> None:
    runs = _measured(2.0)
    with pytest.raises(SpecError, match="measured_step_ms column"):
        fit_step_corrections(runs.drop(columns="measured_step_ms"), StepPredictor.analytic())
    runs["measured_step_ms"] = np.nan
    with pytest.raises(SpecError, match="positive measured_step_ms"):
        fit_step_corrections(runs, StepPredictor.analytic())


def test_cli_stores_the_correction_and_predict_steps_applies_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PERFCAST_CALIBRATION_DIR", str(tmp_path / "cal"))
    runs = _measured(2.0)
    runs_path = tmp_path / "runs.csv"
    runs.to_csv(runs_path, index=False)
    result = runner.invoke(app, ["calibrate", "steps", str(runs_path), "--model", "analytic"])
    assert result.exit_code == 0, result.output
    stored = load_step_corrections(tmp_path / "cal" / "steps")
    assert set(stored) == {KEY}

    new = pd.DataFrame([{**BASE, "dp": 8, "num_gpus": 8}, {**BASE, "gpu": "h100-sxm5-80gb", "dp": 8}])
    new_path, out_cal, out_raw = tmp_path / "new.csv", tmp_path / "cal.csv", tmp_path / "raw.csv"
    new.to_csv(new_path, index=False)
    for out, flag in ((out_cal, "--calibration"), (out_raw, "--no-calibration")):
        args = ["predict", "steps", str(new_path), "-o", str(out), "--model", "analytic", flag, "--show", "0"]
        assert runner.invoke(app, args).exit_code == 0
    cal, raw = pd.read_csv(out_cal), pd.read_csv(out_raw)
    factor = stored[KEY].factor
    assert cal["step_ms"].iloc[0] == pytest.approx(raw["step_ms"].iloc[0] * factor)
    assert cal["step_ms"].iloc[1] == pytest.approx(raw["step_ms"].iloc[1])  # another cluster


def test_cli_reports_a_table_without_measurements(tmp_path) -> None:
    path = tmp_path / "runs.csv"
    pd.DataFrame([BASE]).to_csv(path, index=False)
    result = runner.invoke(app, ["calibrate", "steps", str(path), "--model", "analytic"])
    assert result.exit_code == 2 and "measured_step_ms" in result.output
