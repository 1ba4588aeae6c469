"""`perfcast calibrate steps`: per-cluster corrections from measured runs, used by `predict steps`."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from perfcast.errors import SpecError
from perfcast.features.run_config import parse_run_row
from perfcast.models.step_calibration import CALIBRATION_COLUMN, load_step_corrections
from perfcast.models.step_predictor import StepPredictor
from perfcast.serve.batch import predict_steps_table
from perfcast.serve.calibration_store import CALIBRATION_ENV, DEFAULT_CALIBRATION_DIR
from perfcast.serve.cli import app
from perfcast.serve.cli.calibrate_steps_cmd import fit_step_corrections
from perfcast.serve.predictors import default_bundle_path, load_calibrated_predictor

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
    runs.loc[3, "measured_step_ms"] = 100.0  # measured, but not a valid config
    corrections, predicted, refused = fit_step_corrections(runs, StepPredictor.analytic())
    assert [c.cluster for c in corrections] == [KEY]
    assert corrections[0].n_runs == 3  # the tp=5 row is not a valid config
    assert 1.0 < corrections[0].factor < 3.0  # shrunk toward no correction
    assert corrections[0].predictor == "analytic"
    assert "tp=5" in predicted["error"].iloc[3]
    assert len(refused) == 1 and refused[0].startswith("row 3: not a valid config") and "tp=5" in refused[0]


def test_missing_or_unusable_measurements_are_named() -> None:
    runs = _measured(2.0)
    with pytest.raises(SpecError, match="measured_step_ms column"):
        fit_step_corrections(runs.drop(columns="measured_step_ms"), StepPredictor.analytic())
    runs["measured_step_ms"] = np.nan
    with pytest.raises(SpecError, match="no row has a measured_step_ms value"):
        fit_step_corrections(runs, StepPredictor.analytic())
    runs["measured_step_ms"] = ["fast", "0", "-5", "inf"]
    with pytest.raises(SpecError, match="row 0: measured_step_ms='fast' is not a number") as err:
        fit_step_corrections(runs.iloc[:1], StepPredictor.analytic())
    with pytest.raises(SpecError, match="row 1: measured_step_ms=0 is not a positive finite time") as err:
        fit_step_corrections(runs, StepPredictor.analytic())
    assert "row 2: measured_step_ms=-5" in str(err.value)


def test_a_measured_step_faster_than_the_peak_allows_is_refused() -> None:
    runs = _measured(2.0)
    runs.loc[0, "measured_step_ms"] = 1e-3  # microseconds written as ms, say
    corrections, _, refused = fit_step_corrections(runs, StepPredictor.analytic())
    assert corrections[0].n_runs == 2
    assert any(r.startswith("row 0: measured_step_ms=0.001 implies MFU") and "check the unit" in r for r in refused)


def test_cli_stores_the_correction_and_predict_steps_applies_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PERFCAST_CALIBRATION_DIR", str(tmp_path / "cal"))
    runs = _measured(2.0)
    runs_path = tmp_path / "runs.csv"
    runs.to_csv(runs_path, index=False)
    result = runner.invoke(app, ["calibrate", "steps", str(runs_path), "--model", "analytic"])
    assert result.exit_code == 0, result.output
    stored = load_step_corrections(tmp_path / "cal" / "steps", "analytic")
    assert set(stored) == {KEY}

    new = pd.DataFrame([{**BASE, "dp": 8, "num_gpus": 8}, {**BASE, "gpu": "h100-sxm5-80gb", "dp": 8}])
    new_path, out_cal, out_raw = tmp_path / "new.csv", tmp_path / "cal.csv", tmp_path / "raw.csv"
    new.to_csv(new_path, index=False)
    for out, flag in ((out_cal, "--calibration"), (out_raw, "--no-calibration")):
        args = ["predict", "steps", str(new_path), "-o", str(out), "--model", "analytic", flag, "--show", "0"]
        assert runner.invoke(app, [*args, "--breakdown"]).exit_code == 0
    cal, raw = pd.read_csv(out_cal), pd.read_csv(out_raw)
    assert set(stored[KEY].factors) == {"attention", "compute", "communication"}
    factor = stored[KEY].row_factors(raw.iloc[:1])[0]  # the component factors over this config's breakdown
    assert cal["step_ms"].iloc[0] == pytest.approx(raw["step_ms"].iloc[0] * factor)
    timed = [c for c in cal.columns if c.endswith("_ms")]
    parts = [c for c in timed if c not in ("step_ms", "step_lo_ms", "step_hi_ms", "composed_step_ms")]
    assert cal[parts].iloc[0].sum() == pytest.approx(cal["step_ms"].iloc[0])  # the parts still add up
    assert cal["step_ms"].iloc[1] == pytest.approx(raw["step_ms"].iloc[1])  # another cluster


def test_cli_reports_a_table_without_measurements(tmp_path) -> None:
    path = tmp_path / "runs.csv"
    pd.DataFrame([BASE]).to_csv(path, index=False)
    result = runner.invoke(app, ["calibrate", "steps", str(path), "--model", "analytic"])
    assert result.exit_code == 2 and "measured_step_ms" in result.output


def _invoke_calibration(tmp_path, runs: pd.DataFrame, *extra: str):
    path = tmp_path / "runs.csv"
    runs.to_csv(path, index=False)
    return runner.invoke(app, ["calibrate", "steps", str(path), "--model", "analytic", *extra])


def _flat(text: str) -> str:
    """CLI output with rich's box characters and line wraps removed."""
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text))


def test_cli_names_implausible_and_outlying_rows_and_fits_without_them(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PERFCAST_CALIBRATION_DIR", str(tmp_path / "cal"))
    runs = pd.concat([_measured(2.0).iloc[:3]] * 2, ignore_index=True)
    runs.loc[3, "measured_step_ms"] = 1e-300
    runs.loc[4, "measured_step_ms"] *= 172
    runs.loc[5, "measured_step_ms"] *= 5  # plausible alone, an outlier beside three x2 runs
    result = _invoke_calibration(tmp_path, runs)
    assert result.exit_code == 0, result.output
    out = _flat(result.output)
    assert "row 3: measured_step_ms=1e-300 implies MFU" in out  # faster than the GPU's peak
    assert "row 4: measured_step_ms=" in out and "344x" in out and "row 5: outlier" in out
    (corr,) = load_step_corrections(tmp_path / "cal" / "steps", "analytic").values()
    assert corr.n_runs == 3 and corr.log_residuals == pytest.approx([np.log(2.0)] * 3)
    assert len(corr.excluded) == 2  # row 3 was refused before the cluster's fit


def test_cli_refuses_a_table_where_no_row_is_plausible(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PERFCAST_CALIBRATION_DIR", str(tmp_path / "cal"))
    runs = _measured(2.0).iloc[:1].assign(measured_step_ms=1e-300)
    result = _invoke_calibration(tmp_path, runs)
    assert result.exit_code == 2
    assert (
        "error: no measured row is a plausible step of a valid config" in result.output
        and "row 0: measured_step_ms=1e-300 implies MFU" in result.output
    )
    assert not (tmp_path / "cal").exists()


def test_a_correction_fitted_for_one_predictor_is_not_applied_to_another(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PERFCAST_CALIBRATION_DIR", str(tmp_path / "cal"))
    assert _invoke_calibration(tmp_path, _measured(3.0)).exit_code == 0
    configs = [parse_run_row({**BASE, "dp": 8}), parse_run_row({**BASE, "gpu": "h100-sxm5-80gb", "dp": 8})]
    calibrated = load_calibrated_predictor("steps", "analytic")
    frame = calibrated.predict_configs(configs)
    (corr,) = load_step_corrections(tmp_path / "cal" / "steps", "analytic").values()
    assert frame[CALIBRATION_COLUMN].tolist() == [corr.label, ""]
    bare = load_calibrated_predictor("steps", "analytic", calibration=False)
    assert not hasattr(bare, "corrections")
    plain = bare.predict_configs(configs)
    assert frame["step_ms"].iloc[0] == pytest.approx(plain["step_ms"].iloc[0] * corr.row_factors(plain.iloc[:1])[0])
    if (default_bundle_path() / "manifest.json").is_file():  # the shipped default is another predictor
        composed = load_calibrated_predictor("steps", "composed")
        assert not hasattr(composed, "corrections")


def test_a_stored_nan_shift_is_an_error_naming_file_and_field(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PERFCAST_CALIBRATION_DIR", str(tmp_path / "cal"))
    assert _invoke_calibration(tmp_path, _measured(2.0)).exit_code == 0
    (path,) = (tmp_path / "cal" / "steps").glob("*.json")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "shift": float("nan")}))
    new_path = tmp_path / "new.csv"
    pd.DataFrame([{**BASE, "dp": 8}]).to_csv(new_path, index=False)
    args = ["predict", "steps", str(new_path), "-o", str(tmp_path / "out.csv"), "--model", "analytic", "--show", "0"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert str(path) in _flat(result.output) and "'shift' = nan" in result.output
    assert not (tmp_path / "out.csv").exists()
    assert runner.invoke(app, [*args, "--no-calibration"]).exit_code == 0  # not read at all


def test_help_names_the_folder_actually_used(tmp_path, monkeypatch) -> None:
    for command in (["calibrate", "steps", "--help"], ["calibrate", "--help"]):
        out = _flat(runner.invoke(app, command, env={"COLUMNS": "200"}).output)
        assert f"${CALIBRATION_ENV}" in out and DEFAULT_CALIBRATION_DIR in out, out
    from perfcast.serve.calibration_store import calibration_dir, step_calibration_dir

    monkeypatch.delenv(CALIBRATION_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert calibration_dir() == tmp_path / ".config" / "perfcast" / "calibration"
    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path / "mine"))
    assert step_calibration_dir() == tmp_path / "mine" / "steps"
