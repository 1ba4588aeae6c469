"""`perfcast calibrate --device cpu` end to end, then predictions that use the correction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from perfcast.features import hardware
from perfcast.models.calibration import GpuCorrection, fit_correction, predictor_identity, save_correction
from perfcast.serve.cli import app
from perfcast.serve.predictors import default_bundle_path, load_calibrated_predictor, load_op_predictor


@pytest.fixture
def user_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    hw, cal = tmp_path / "hw", tmp_path / "cal"
    monkeypatch.setenv("PERFCAST_HARDWARE_DIR", str(hw))
    monkeypatch.setenv("PERFCAST_CALIBRATION_DIR", str(cal))
    for cached in (hardware._load_hardware, hardware._alias_index, hardware._suggestion_candidates):
        cached.cache_clear()
    yield hw, cal
    monkeypatch.delenv("PERFCAST_HARDWARE_DIR")
    for cached in (hardware._load_hardware, hardware._alias_index, hardware._suggestion_candidates):
        cached.cache_clear()


def test_calibrate_cpu_then_predict_uses_the_correction(user_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    hw, cal = user_dirs
    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", "--device", "cpu", "--budget-s", "8", "--model", "analytic"])
    assert result.exit_code == 0, result.output
    (host_file,) = hw.glob("host-*.json")
    host = host_file.stem
    stored = cal / f"{host}--analytic.json"
    correction = json.loads(stored.read_text())
    assert correction["gpu"] == host and correction["shifts"] and correction["predictor"] == "analytic"

    ops = pd.DataFrame({"op": ["add"], "rows": [1024], "cols": [1024], "dtype": ["fp32"], "gpu": [host]})
    ops.to_csv(tmp_path / "ops.csv", index=False)
    args = ["predict", "ops", str(tmp_path / "ops.csv"), "--model", "analytic", "--show", "0"]
    with_cal = runner.invoke(app, [*args, "-o", str(tmp_path / "a.csv")])
    without = runner.invoke(app, [*args, "-o", str(tmp_path / "b.csv"), "--no-calibration"])
    assert with_cal.exit_code == 0 and without.exit_code == 0, with_cal.output + without.output
    a, b = pd.read_csv(tmp_path / "a.csv"), pd.read_csv(tmp_path / "b.csv")
    if "vector" in correction["shifts"]:  # the stored correction (shift and shape residual) scales the row
        factor = np.exp(GpuCorrection.from_json(stored.read_text()).log_factors(ops))
        assert a["pred_ms"].iloc[0] == pytest.approx(b["pred_ms"].iloc[0] * factor[0])
        assert factor[0] != pytest.approx(1.0) or correction["shifts"]["vector"] == pytest.approx(0.0, abs=1e-3)


def test_user_entries_cannot_shadow_the_catalog(user_dirs: tuple[Path, Path]) -> None:
    spec = hardware.HardwareSpec.from_name("h100")
    with pytest.raises(hardware.SpecError, match="catalog entry"):
        hardware.add_user_hardware(spec)
    mine = spec.model_copy(update={"id": "my-h100-variant", "name": "My H100 variant", "aliases": ("My H100",)})
    hardware.add_user_hardware(mine)
    assert hardware.resolve_gpu_name("My H100") == "my-h100-variant"


OPS = pd.DataFrame(
    {"op": ["matmul", "matmul"], "m": [2048, 2048], "n": [2048, 2048], "k": [2048, 2048], "dtype": ["bf16", "bf16"],
     "gpu": ["h100-sxm5-80gb", "a100-sxm4-80gb"]}
)  # fmt: skip


def _predict_ops(tmp_path: Path, *args: str) -> tuple[int, str, pd.DataFrame | None]:
    OPS.to_csv(tmp_path / "ops.csv", index=False)
    out = tmp_path / "out.csv"
    out.unlink(missing_ok=True)
    result = CliRunner().invoke(
        app, ["predict", "ops", str(tmp_path / "ops.csv"), "-o", str(out), "--show", "0", *args]
    )
    return result.exit_code, result.output, pd.read_csv(out) if out.exists() else None


@pytest.mark.skipif(not (default_bundle_path() / "manifest.json").is_file(), reason="no default bundle in this build")
def test_a_correction_fitted_for_the_default_is_not_applied_to_analytic(user_dirs, tmp_path: Path) -> None:
    _, cal = user_dirs
    default = load_op_predictor(None)
    gemms = pd.concat([OPS.iloc[:1]] * 5, ignore_index=True)
    pred = default.predict_ops(gemms)[0]
    corr = fit_correction("h100-sxm5-80gb", gemms, 3.0 * pred, pred, model=default.name,
                          predictor=predictor_identity(default))  # fmt: skip
    save_correction(corr, cal)
    calibrated = load_calibrated_predictor("ops", None)
    assert calibrated.applied_calibrations(OPS).tolist() == [corr.label, ""]
    assert load_calibrated_predictor("ops", "analytic").name == "analytic"  # nothing applies to it

    code, _, with_cal = _predict_ops(tmp_path, "--model", "analytic")
    code_raw, _, raw = _predict_ops(tmp_path, "--model", "analytic", "--no-calibration")
    assert code == code_raw == 0
    np.testing.assert_allclose(with_cal["pred_ms"], raw["pred_ms"])
    factor = np.exp(corr.log_factors(OPS.iloc[:1]))[0]
    assert factor > 1.5 and calibrated.predict_ops(OPS)[0][0] == pytest.approx(pred[0] * factor)


@pytest.mark.parametrize(
    "text", ["{", '{"schema_version": 5, "gpu": "t4", "shifts": {"gemm": NaN}, "n_ops": {"gemm": 2}}']
)
def test_a_corrupt_stored_correction_is_one_error_line_and_exit_2(user_dirs, tmp_path: Path, text: str) -> None:
    _, cal = user_dirs
    cal.mkdir(parents=True)
    (cal / "t4--analytic.json").write_text(text)
    code, output, out = _predict_ops(tmp_path, "--model", "analytic")
    assert code == 2 and out is None
    line = " ".join(output.split())
    assert "t4--analytic.json" in line and ("invalid JSON" in line or "'shifts.gemm' = nan" in line)
    code, _, out = _predict_ops(tmp_path, "--model", "analytic", "--no-calibration")
    assert code == 0 and len(out) == 2
