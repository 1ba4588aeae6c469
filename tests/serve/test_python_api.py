"""The Python entry points of ``import perfcast``: the same numbers as the CLI on the same input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import perfcast
from perfcast.data.tables import read_table
from perfcast.serve.cli import app

RUNS = pd.DataFrame(
    [
        {"model": "llama2-7b", "tp": 2, "dp": 4, "global_batch": 32, "gpu": "h100-sxm5-80gb", "num_gpus": 8},
        {"model": "llama3-70b", "tp": 8, "pp": 2, "dp": 2, "global_batch": 64, "gpu": "NVIDIA H100 80GB HBM3",
         "num_gpus": 32, "sequence_parallel": True},
        {"model": "llama2-7b", "tp": 3, "gpu": "h100-sxm5-80gb"},
    ]
)  # fmt: skip
OPS = pd.DataFrame(
    [
        {"op": "matmul", "m": 4096, "n": 4096, "k": 4096, "gpu": "h100-sxm5-80gb", "dtype": "bf16"},
        {"op": "allreduce", "bytes": 2**28, "n_ranks": 8, "gpu": "a100-sxm4-80gb"},
    ]
)


def _cli(kind: str, table: pd.DataFrame, tmp_path, *options: str) -> pd.DataFrame:
    src, dst = tmp_path / f"{kind}.csv", tmp_path / f"{kind}_out.csv"
    table.to_csv(src, index=False)
    result = CliRunner().invoke(app, ["predict", kind, str(src), "-o", str(dst), "--show", "0", *options])
    assert result.exit_code == 0, result.output
    return read_table(dst)


def test_version_is_the_package_metadata() -> None:
    from importlib.metadata import version

    assert perfcast.__version__ == version("perfcast")
    assert CliRunner().invoke(app, ["--version"]).output.strip() == f"perfcast {perfcast.__version__}"


@pytest.mark.parametrize("options", [(), ("--model", "analytic")])
def test_predict_steps_equals_the_cli(tmp_path, options) -> None:
    model = dict(zip(options[::2], options[1::2], strict=True)).get("--model")
    mine = perfcast.predict_steps(RUNS, model=model)
    from_file = perfcast.predict_steps(_write(RUNS, tmp_path / "runs.parquet"), model=model)
    cli = _cli("steps", RUNS, tmp_path, *options)
    for frame in (mine, from_file):
        np.testing.assert_allclose(frame["step_ms"].to_numpy(float), cli["step_ms"].to_numpy(float), rtol=1e-9)
    assert mine["error"].iloc[2] != "" and mine["step_ms"].iloc[:2].gt(0).all()


def test_predict_ops_equals_the_cli(tmp_path) -> None:
    mine = perfcast.predict_ops(OPS)
    cli = _cli("ops", OPS, tmp_path)
    np.testing.assert_allclose(mine["pred_ms"].to_numpy(float), cli["pred_ms"].to_numpy(float), rtol=1e-9)


def test_a_loaded_predictor_is_reused_and_search_ranks(tmp_path) -> None:
    analytic = perfcast.load_predictor("steps", "analytic")
    assert analytic.name == "analytic"
    np.testing.assert_allclose(
        perfcast.predict_steps(RUNS, model=analytic)["step_ms"].to_numpy(float),
        perfcast.predict_steps(RUNS, model="analytic")["step_ms"].to_numpy(float),
    )
    ranked = perfcast.search("gpt3-125m", "a100-sxm4-80gb", 4, 16, predictor="analytic")
    assert ranked["rank"].iloc[0] == 1 and ranked["step_ms"].is_monotonic_increasing
    assert ranked.attrs["n_layouts"] >= len(ranked)


def _write(table: pd.DataFrame, path) -> str:
    table.to_parquet(path, index=False)
    return str(path)
