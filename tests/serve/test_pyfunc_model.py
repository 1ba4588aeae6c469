"""The MLflow pyfunc wrapper loads its bundle and the stored calibrations through the shared loader."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("mlflow")

from perfcast.models.calibration import (  # noqa: E402
    CalibratedPredictor,
    fit_correction,
    predictor_identity,
    save_correction,
)
from perfcast.serve.calibration_store import CALIBRATION_ENV  # noqa: E402
from perfcast.serve.predictors import default_bundle_path  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (default_bundle_path() / "manifest.json").is_file(), reason="no default bundle in this build"
)
GEMMS = pd.DataFrame({"op": ["matmul"] * 4, "m": [1024, 2048, 4096, 8192], "n": 2048, "k": 2048,
                      "dtype": "bf16", "gpu": "h100-sxm5-80gb"})  # fmt: skip


def _loaded(model_config: dict | None = None):  # type: ignore[no-untyped-def]
    from perfcast.serve.pyfunc_model import PerfcastOpModel

    model = PerfcastOpModel()
    model.load_context(SimpleNamespace(artifacts={"bundle": str(default_bundle_path())}, model_config=model_config))
    return model


def test_pyfunc_applies_the_bundles_own_calibrations_unless_told_not_to(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path))
    bare = _loaded()
    assert bare.ops is bare.bundle  # nothing stored
    pred = bare.bundle.predict_ops(GEMMS)[0]
    corr = fit_correction("h100-sxm5-80gb", GEMMS, 2.0 * pred, pred, predictor=predictor_identity(bare.bundle))
    save_correction(corr, tmp_path)

    model = _loaded()
    assert isinstance(model.ops, CalibratedPredictor) and model.bundle is model.ops.base
    out = model.predict(None, GEMMS)
    assert (out["pred_ms"].to_numpy() > pred * 1.2).all()
    off = _loaded({"calibration": False})
    np.testing.assert_allclose(off.predict(None, GEMMS)["pred_ms"].to_numpy(), pred)


@pytest.mark.mlflow
def test_a_logged_model_has_a_coverage_param_it_honours_and_carries_its_code(tmp_path: Path, monkeypatch) -> None:
    import mlflow

    from perfcast.training.tracking import log_pyfunc_model

    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path / "calibration"))
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("pyfunc-signature")  # not an experiment id another test's store left active
    with mlflow.start_run():
        info = log_pyfunc_model(default_bundle_path(), kind="steps")
    assert [p.name for p in info.signature.params] == ["coverage"]
    model = mlflow.pyfunc.load_model(info.model_uri)
    runs = pd.DataFrame([{"model": "llama2-7b", "tp": 2, "dp": 4, "global_batch": 32, "gpu": "h100-sxm5-80gb",
                          "num_gpus": 8}])  # fmt: skip
    narrow, wide = (model.predict(runs, params={"coverage": c}) for c in (0.5, 0.95))
    assert (wide["step_hi_ms"] - wide["step_lo_ms"]).iloc[0] > (narrow["step_hi_ms"] - narrow["step_lo_ms"]).iloc[0]
    ops = model.predict(GEMMS)
    assert (ops["pred_ms"] > 0).all()  # one model answers both table kinds
    local = Path(mlflow.artifacts.download_artifacts(info.model_uri))
    requirements = (local / "requirements.txt").read_text()
    assert (local / "code" / "perfcast" / "serve" / "batch.py").is_file()
    assert "perfcast" not in requirements and "xgboost-cpu==" in requirements
