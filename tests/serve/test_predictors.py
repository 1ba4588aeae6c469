"""`--model` resolution and the shipped default op predictor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import BundleError, OutOfDomainWarning, SpecError
from perfcast.models.analytic import AnalyticOpPredictor
from perfcast.models.bundle import PredictorBundle
from perfcast.models.calibration import fit_correction, save_correction
from perfcast.serve.batch import OUT_OF_DOMAIN_COLUMN, predict_ops_table
from perfcast.serve.calibration_store import CALIBRATION_ENV
from perfcast.serve.predictors import (
    default_bundle_path,
    load_calibrated_predictor,
    load_op_predictor,
    with_calibrations,
)

OPS = pd.DataFrame(
    {
        "op": ["matmul", "layernorm", "allreduce", "matmul"],
        "batch": [1, None, None, 1],
        "m": [4096, None, None, 4096],
        "n": [4096, None, None, 4096],
        "k": [4096, None, None, 4096],
        "rows": [None, 8192, None, None],
        "cols": [None, 4096, None, None],
        "bytes": [None, None, 1 << 26, None],
        "n_ranks": [None, None, 8, None],
        "dtype": ["fp16", "fp16", "fp16", "fp16"],
        "gpu": ["a100-sxm4-80gb", "a100-sxm4-80gb", "a100-sxm4-80gb", "no-such-gpu"],
    }
)


@pytest.mark.skipif(not (default_bundle_path() / "manifest.json").is_file(), reason="no default bundle in this build")
def test_default_bundle_answers_with_intervals_and_flags() -> None:
    predictor = load_op_predictor(None)
    assert isinstance(predictor, PredictorBundle)
    out = predict_ops_table(OPS, predictor=predictor)
    good = out.iloc[:3]
    assert (good["pred_ms"] > 0).all()
    assert (good["pred_lo_ms"].iloc[:2] <= good["pred_ms"].iloc[:2]).all()
    assert np.isnan(good["pred_lo_ms"].iloc[2])  # collectives: alpha-beta, no interval
    assert out[OUT_OF_DOMAIN_COLUMN].iloc[:3].notna().all() and pd.isna(out[OUT_OF_DOMAIN_COLUMN].iloc[3])
    assert "not in the hardware catalog" in out["error"].iloc[3]


@pytest.mark.skipif(not (default_bundle_path() / "manifest.json").is_file(), reason="no default bundle in this build")
def test_default_bundle_scales_gemms_to_a_catalog_only_gpu_with_missing_descriptors() -> None:
    """B200 has no SM count or L2 in the catalog: its GEMMs follow its 2.27x tensor peak over the
    H100, not the arbitrary branches a NaN descriptor takes (a 512^3 GEMM 2.7x slower than on H100)."""
    shapes = [(512, 512, 512), (2048, 3072, 12288), (8192, 12288, 49152)]
    rows = [
        {"op": "matmul", "batch": 1, "m": m, "n": n, "k": k, "dtype": dtype, "gpu": gpu}
        for gpu in ("h100-sxm5-80gb", "b200-hgx") for dtype in ("bf16", "fp8") for m, n, k in shapes
    ]  # fmt: skip
    with pytest.warns(OutOfDomainWarning, match="6 of 12 op rows"):  # the B200 rows: beyond the training GPUs
        pred = load_op_predictor(None).predict_ops(pd.DataFrame(rows))[0].reshape(2, 2, len(shapes))
    speedup = pred[0] / pred[1]  # H100 time / B200 time, per dtype and shape
    assert (speedup >= 0.9).all()  # never clearly slower than the part it outruns on every figure
    assert (speedup[:, -1] >= 1.8).all()  # the largest GEMM is compute-bound: near the peak ratio


def test_analytic_and_bad_references(tmp_path: Path) -> None:
    assert isinstance(load_op_predictor("analytic"), AnalyticOpPredictor)
    with pytest.raises(BundleError, match="not 'analytic', a bundle folder or an MLflow URI"):
        load_op_predictor(str(tmp_path / "missing"))
    with pytest.raises(BundleError):
        load_op_predictor(str(tmp_path))  # a folder without a manifest


def test_the_loader_sits_below_the_cli_commands() -> None:
    code = (
        "import sys, perfcast.serve.predictors, perfcast.serve.pyfunc_model, perfcast.serve.dask_predict; "
        "print(sorted(m for m in sys.modules if m.startswith('perfcast.serve.calibrate')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_load_calibrated_predictor_reads_the_store_only_when_asked(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path))
    with pytest.raises(SpecError, match="kind='op' unknown; allowed: ops, steps"):
        load_calibrated_predictor("op", "analytic")
    assert isinstance(load_calibrated_predictor("ops", "analytic"), AnalyticOpPredictor)  # nothing stored
    (tmp_path / "steps").mkdir()
    for folder in (tmp_path, tmp_path / "steps"):
        (folder / "bad--analytic.json").write_text('{"schema_version": 2, "cluster": "x", "shift": Infinity}')
    assert isinstance(load_calibrated_predictor("ops", "analytic", calibration=False), AnalyticOpPredictor)
    assert load_calibrated_predictor("steps", "analytic", calibration=False).name == "analytic"
    with pytest.raises(BundleError, match="bad--analytic.json"):
        load_calibrated_predictor("ops", "analytic")
    with pytest.raises(BundleError, match="bad--analytic.json: field 'n_runs' is missing"):
        load_calibrated_predictor("steps", "analytic")


def test_with_calibrations_applies_only_the_predictors_own(tmp_path: Path) -> None:
    ops = OPS.iloc[:2]
    analytic = AnalyticOpPredictor()
    pred = analytic.predict_ops(ops)[0]
    corr = fit_correction("a100-sxm4-80gb", ops, 2.0 * pred, pred, model="analytic", predictor="analytic")
    save_correction(corr, tmp_path)
    calibrated = with_calibrations(analytic, "ops", folder=tmp_path)
    assert calibrated.name == "analytic+calibrated"
    assert calibrated.applied_calibrations(OPS).tolist() == [corr.label, corr.label, "", ""]
    assert (calibrated.predict_ops(ops)[0] > pred).all()
    assert with_calibrations(analytic, "ops", calibration=False, folder=tmp_path) is analytic
    assert with_calibrations(analytic, "ops", folder=tmp_path / "elsewhere") is analytic
