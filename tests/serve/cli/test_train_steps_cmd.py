"""`perfcast train steps`: train a step model over composed steps, save, track, serve through pyfunc."""

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
from typer.testing import CliRunner

from perfcast.models.bundle import load_bundle
from perfcast.serve.batch import predict_steps_table
from perfcast.serve.cli import app
from perfcast.serve.predictors import load_step_predictor
from perfcast.training.defaults import DEFAULT_CORRECTION_SCALE

runner = CliRunner()


def _measured_runs() -> pd.DataFrame:
    """Runs of one model on 2-8 A100s whose measured step is a layout-dependent multiple of the composed one."""
    rows = [
        {"model": "gpt3-350m", "gpu": "a100-sxm4-80gb", "num_gpus": g, "tp": tp, "dp": g // tp, "micro_batch": mb,
         "global_batch": 8 * (g // tp)}
        for g in (2, 4, 8) for tp in (1, 2) for mb in (1, 2, 4)
    ]  # fmt: skip
    runs = pd.DataFrame(rows)
    composed = predict_steps_table(runs, predictor=load_step_predictor("composed"))["step_ms"]
    runs["measured_step_ms"] = composed * (1.5 + 0.25 * runs["tp"] / runs["micro_batch"])
    return runs


@pytest.fixture(scope="module")
def runs_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("runs") / "runs.csv"
    _measured_runs().to_csv(path, index=False)
    return path


@pytest.mark.parametrize("model_type", ["gbdt", "gnn"])
def test_trained_bundle_predicts_steps_closer_than_composition(runs_csv: Path, tmp_path: Path, model_type: str) -> None:
    out = tmp_path / "bundle"
    scale = ["--correction-scale", "1"] if model_type == "gbdt" else []  # all of the learned correction
    result = runner.invoke(app, ["train", "steps", "--runs", str(runs_csv), "-o", str(out), "--no-track",
                                 "--no-evaluate", "--model-type", model_type, *scale])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert load_bundle(out).step_model is not None
    runs = pd.read_csv(runs_csv)
    learned = predict_steps_table(runs, predictor=load_step_predictor(str(out)))
    composed = predict_steps_table(runs, predictor=load_step_predictor("composed"))
    err = lambda p: np.median(np.abs(p["step_ms"] / runs["measured_step_ms"] - 1))  # noqa: E731
    assert err(learned) < 0.5 * err(composed)
    assert (learned["step_lo_ms"] <= learned["step_ms"]).all() and (learned["step_ms"] <= learned["step_hi_ms"]).all()


def test_bad_arguments_are_named(runs_csv: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "steps", "--no-track", "-o", str(tmp_path / "b")])
    assert result.exit_code == 2 and "--data" in result.output
    bad = runner.invoke(app, ["train", "steps", "--runs", str(runs_csv), "--model-type", "svm", "--no-track",
                              "-o", str(tmp_path / "b")])  # fmt: skip
    assert bad.exit_code == 2 and "model_type='svm'" in bad.output


@pytest.mark.mlflow
def test_tracked_run_registers_a_pyfunc_that_answers_run_tables(runs_csv: Path, tmp_path: Path, monkeypatch) -> None:
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["train", "steps", "--runs", str(runs_csv), "-o", str(tmp_path / "bundle"),
                                 "--register", "steps-test", "--no-evaluate"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "models:/steps-test/1" in result.output
    mlflow.set_tracking_uri(uri)
    run = mlflow.search_runs(experiment_names=["perfcast"]).iloc[0]
    assert run["params.model_type"] == "gbdt" and run["params.n_runs"] == "18"
    model = mlflow.pyfunc.load_model("models:/steps-test/1")
    runs = pd.read_csv(runs_csv).drop(columns="measured_step_ms").head(4)
    answered = model.predict(runs)
    expected = predict_steps_table(runs, predictor=load_step_predictor(str(tmp_path / "bundle")))
    np.testing.assert_allclose(answered["step_ms"], expected["step_ms"])
    assert (answered["error"] == "").all()
    _serve_and_query(uri, "models:/steps-test/1", runs, expected["step_ms"].to_numpy())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_and_query(tracking_uri: str, model_uri: str, runs: pd.DataFrame, expected: np.ndarray) -> None:
    """``mlflow models serve`` the registered model on a real socket and post a run table to it."""
    import httpx

    port = _free_port()
    bin_dir = str(Path(sys.executable).parent)  # mlflow execs `uvicorn` from PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local",
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                if httpx.get(f"{url}/ping", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "mlflow models serve did not start in 180 s"
            time.sleep(1)
        payload = {"dataframe_records": runs.to_dict("records")}
        response = httpx.post(f"{url}/invocations", json=payload, timeout=120)
        assert response.status_code == 200, response.text
        answered = pd.DataFrame(response.json()["predictions"])
        np.testing.assert_allclose(answered["step_ms"], expected, rtol=1e-9)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def test_the_default_applies_the_chosen_share_of_the_learned_correction(runs_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "shipped-share"
    result = runner.invoke(app, ["train", "steps", "--runs", str(runs_csv), "-o", str(out), "--no-track",
                                 "--no-evaluate"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert load_bundle(out).step_model.correction_scale == DEFAULT_CORRECTION_SCALE
