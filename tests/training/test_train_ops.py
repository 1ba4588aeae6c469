"""Training with evaluation, tracked in a local SQLite MLflow store."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.make_fixtures import synthetic_op_records

from perfcast.models.bundle import load_bundle
from perfcast.training import tracking
from perfcast.training.train_ops import median_summary, train_op_predictor

pytestmark = pytest.mark.mlflow


def test_evaluate_fit_save_and_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    records = synthetic_op_records(n_per_gpu=60, gpus=("a100-sxm4-80gb", "v100-sxm2-32gb", "t4"))
    params = {"n_estimators": 15, "n_jobs": 1, "max_rows_per_gpu": 200}
    with tracking.tracked_run("unit", run_name="t") as run:
        result = train_op_predictor(records, output=tmp_path / "b", params=params, evaluate=True)
    assert result.logo is not None and set(median_summary(result.logo)["predictor"]) == {
        "model", "roofline", "efficiency"
    }  # fmt: skip
    assert load_bundle(result.bundle_path).op_model is not None

    client = mlflow.MlflowClient(tracking_uri=tracking.tracking_uri())
    logged = client.get_run(run.info.run_id)
    assert logged.data.params["rows.compute"] == str(len(records))
    assert any(k.startswith("logo_median/gemm_fp32/model/") for k in logged.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert {"plots/parity.png", "plots/calibration.png", "plots/error_by_gpu.png"} <= artifacts
    assert "plots/feature_importance.png" in artifacts
    import matplotlib.image

    parity = client.download_artifacts(run.info.run_id, "plots/parity.png", str(tmp_path))
    assert matplotlib.image.imread(parity).shape[0] > 200  # a real picture, not an empty file
    assert [a.path for a in client.list_artifacts(run.info.run_id, "bundle")]
