"""`perfcast evaluate ops` on a small synthetic dataset."""

from __future__ import annotations

from pathlib import Path

from fixtures.make_fixtures import synthetic_op_records
from typer.testing import CliRunner

from perfcast.data.dataset import write_dataset
from perfcast.serve.cli import app


def test_evaluate_ops_prints_and_writes_the_table(tmp_path: Path) -> None:
    records = synthetic_op_records(n_per_gpu=40, gpus=("a100-sxm4-80gb", "t4", "v100-sxm2-32gb"))
    data = write_dataset(tmp_path / "ds", source="synthetic", how_measured="generated", ops=records)
    out = tmp_path / "logo.md"
    result = CliRunner().invoke(
        app, ["evaluate", "logo", "--data", str(data), "-o", str(out), "--n-estimators", "10",
              "--max-rows-per-gpu", "100"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "| gemm_fp32 | t4 |" in result.output and out.read_text().startswith("| class |")


def test_one_gpu_is_not_enough(tmp_path: Path) -> None:
    records = synthetic_op_records(n_per_gpu=40, gpus=("t4",))
    data = write_dataset(tmp_path / "ds", source="synthetic", how_measured="generated", ops=records)
    result = CliRunner().invoke(app, ["evaluate", "logo", "--data", str(data)])
    assert result.exit_code == 2 and "at least two GPUs" in result.output
