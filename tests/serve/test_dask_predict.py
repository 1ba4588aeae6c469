"""Batch prediction on a real Dask LocalCluster gives the single-machine answers, in order."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("distributed")

import dask.dataframe as dd  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from perfcast.data.tables import read_table  # noqa: E402
from perfcast.errors import SpecError  # noqa: E402
from perfcast.serve.batch import predict_ops_table  # noqa: E402
from perfcast.serve.cli import app  # noqa: E402
from perfcast.serve.dask_predict import dask_client, predict_table_dask  # noqa: E402
from perfcast.serve.predictors import load_op_predictor  # noqa: E402


def _example(name: str, copies: int, tmp_path: Path) -> Path:
    frame = pd.read_csv(Path(str(resources.files("perfcast.examples").joinpath(name))))
    path = tmp_path / name
    pd.concat([frame] * copies, ignore_index=True).to_csv(path, index=False)
    return path


def test_cli_steps_on_a_local_cluster_match_one_machine(tmp_path: Path) -> None:
    runs = _example("runs.csv", 5, tmp_path)
    runner = CliRunner()
    base = ["predict", "steps", str(runs), "--model", "analytic", "--show", "0", "--no-calibration"]
    assert runner.invoke(app, [*base, "-o", str(tmp_path / "one.csv")]).exit_code == 0
    result = runner.invoke(app, [*base, "-o", str(tmp_path / "dask.csv"), "--dask", "local"])
    assert result.exit_code == 0, result.output
    got, expected = pd.read_csv(tmp_path / "dask.csv"), pd.read_csv(tmp_path / "one.csv")
    assert list(got.columns) == list(expected.columns) and len(got) == len(expected)
    np.testing.assert_allclose(got["step_ms"], expected["step_ms"], rtol=1e-12)
    assert got["error"].fillna("").tolist() == expected["error"].fillna("").tolist()
    refused = runner.invoke(app, [*base, "-o", str(tmp_path / "x.csv"), "--dask", "local", "--breakdown"])
    assert refused.exit_code == 2 and "--breakdown" in refused.output


def test_ops_on_a_local_cluster_match_one_machine(tmp_path: Path) -> None:
    ops = _example("ops.csv", 3, tmp_path)
    assert dd.read_csv(ops, blocksize="1KB").npartitions > 1
    got = predict_table_dask(ops.with_suffix(".csv"), "ops", blocksize="1KB")
    expected = predict_ops_table(read_table(ops), predictor=load_op_predictor(None))
    np.testing.assert_allclose(got["pred_ms"].to_numpy(float), expected["pred_ms"].to_numpy(float), rtol=1e-12)
    np.testing.assert_allclose(got["pred_hi_ms"].to_numpy(float), expected["pred_hi_ms"].to_numpy(float), rtol=1e-12)


def test_unknown_kind_and_file_type_are_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="kind='x'"):
        predict_table_dask(tmp_path / "a.csv", "x")
    with pytest.raises(SpecError, match=".json"):
        predict_table_dask(tmp_path / "a.json", "steps")


def test_unreachable_scheduler_is_named() -> None:
    with pytest.raises(SpecError, match="tcp://127.0.0.1:9"), dask_client("tcp://127.0.0.1:9", timeout_s=1):
        pass


def test_partitions_read_the_calibration_folder_they_are_given(tmp_path: Path) -> None:
    from perfcast.features.run_config import parse_run_row
    from perfcast.models.step_calibration import config_cluster_key, fit_step_correction, save_step_correction
    from perfcast.serve.dask_predict import predict_partition

    runs = pd.DataFrame([{"model": "gpt3-125m", "gpu": "a100-sxm4-80gb", "global_batch": 8},
                         {"model": "gpt3-125m", "gpu": "h100-sxm5-80gb", "global_batch": 8}])  # fmt: skip
    raw = predict_partition(runs, "steps", "analytic", 0.9, False, False)
    key = config_cluster_key(parse_run_row(runs.iloc[0].to_dict()))
    corr = fit_step_correction(key, np.array([3.0]), np.array([1.0]), predictor="analytic")
    save_step_correction(corr, tmp_path / "steps")
    calibrated = predict_partition(runs, "steps", "analytic", 0.9, True, False, str(tmp_path))
    expected = raw["step_ms"].to_numpy() * [corr.factor, 1.0]
    np.testing.assert_allclose(calibrated["step_ms"].to_numpy(), expected)
    unread = predict_partition(runs, "steps", "analytic", 0.9, True, False, str(tmp_path / "other"))
    np.testing.assert_allclose(unread["step_ms"].to_numpy(), raw["step_ms"].to_numpy())
