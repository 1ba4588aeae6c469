"""`perfcast calibrate --device cpu` end to end, then predictions that use the correction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from perfcast.features import hardware
from perfcast.models.calibration import GpuCorrection
from perfcast.serve.cli import app


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
    correction = json.loads((cal / f"{host}.json").read_text())
    assert correction["gpu"] == host and correction["shifts"]

    ops = pd.DataFrame({"op": ["add"], "rows": [1024], "cols": [1024], "dtype": ["fp32"], "gpu": [host]})
    ops.to_csv(tmp_path / "ops.csv", index=False)
    args = ["predict", "ops", str(tmp_path / "ops.csv"), "--model", "analytic", "--show", "0"]
    with_cal = runner.invoke(app, [*args, "-o", str(tmp_path / "a.csv")])
    without = runner.invoke(app, [*args, "-o", str(tmp_path / "b.csv"), "--no-calibration"])
    assert with_cal.exit_code == 0 and without.exit_code == 0, with_cal.output + without.output
    a, b = pd.read_csv(tmp_path / "a.csv"), pd.read_csv(tmp_path / "b.csv")
    if "vector" in correction["shifts"]:  # the stored correction (shift and shape residual) scales the row
        factor = np.exp(GpuCorrection.from_json((cal / f"{host}.json").read_text()).log_factors(ops))
        assert a["pred_ms"].iloc[0] == pytest.approx(b["pred_ms"].iloc[0] * factor[0])
        assert factor[0] != pytest.approx(1.0) or correction["shifts"]["vector"] == pytest.approx(0.0, abs=1e-3)


def test_user_entries_cannot_shadow_the_catalog(user_dirs: tuple[Path, Path]) -> None:
    spec = hardware.HardwareSpec.from_name("h100")
    with pytest.raises(hardware.SpecError, match="catalog entry"):
        hardware.add_user_hardware(spec)
    mine = spec.model_copy(update={"id": "my-h100-variant", "name": "My H100 variant", "aliases": ("My H100",)})
    hardware.add_user_hardware(mine)
    assert hardware.resolve_gpu_name("My H100") == "my-h100-variant"
