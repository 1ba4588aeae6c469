"""Through a real `mlflow server` on 127.0.0.1: train, log, register, load by `models:/` URI."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fixtures.make_fixtures import synthetic_op_records
from typer.testing import CliRunner

from perfcast.data.dataset import write_dataset
from perfcast.serve.cli import app

pytestmark = [pytest.mark.mlflow, pytest.mark.slow]
SERVER_START_S = 60


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path: Path):
    port = _free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    cmd = [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
           "--default-artifact-root", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
        pytest.fail(f"mlflow server did not listen on {uri} within {SERVER_START_S} s")
    yield uri
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def test_train_register_and_predict_by_models_uri(mlflow_server: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.chdir(tmp_path)
    records = synthetic_op_records(n_per_gpu=80, gpus=("a100-sxm4-80gb", "v100-sxm2-32gb", "t4"))
    data = write_dataset(tmp_path / "ds", source="synthetic", how_measured="generated", ops=records)
    runner = CliRunner()
    trained = runner.invoke(app, ["train", "ops", "--data", str(data), "-o", str(tmp_path / "bundle"),
                                  "--register", "perfcast-test", "--n-estimators", "30", "--no-evaluate"])  # fmt: skip
    assert trained.exit_code == 0, trained.output
    assert "registered as models:/perfcast-test/1" in trained.output

    ops = records.drop(columns=["measured_ms"]).head(12)
    ops.to_csv(tmp_path / "ops.csv", index=False)
    by_uri = runner.invoke(app, ["predict", "ops", str(tmp_path / "ops.csv"), "-o", "uri.csv",
                                 "--model", "models:/perfcast-test/1", "--show", "0"])  # fmt: skip
    assert by_uri.exit_code == 0, by_uri.output
    by_path = runner.invoke(app, ["predict", "ops", str(tmp_path / "ops.csv"), "-o", "path.csv",
                                  "--model", str(tmp_path / "bundle"), "--show", "0"])  # fmt: skip
    assert by_path.exit_code == 0, by_path.output
    a, b = pd.read_csv("uri.csv"), pd.read_csv("path.csv")
    assert a["error"].isna().all()
    np.testing.assert_allclose(a["pred_ms"], b["pred_ms"])
    assert (a["pred_lo_ms"] <= a["pred_ms"]).all() and (a["pred_ms"] <= a["pred_hi_ms"]).all()

    import mlflow

    mlflow.set_tracking_uri(mlflow_server)
    run = mlflow.search_runs(experiment_names=["perfcast"]).iloc[0]
    assert run["params.rows.compute"] == str(len(records))
