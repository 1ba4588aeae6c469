"""Tests of ``perfcast profile`` through Typer's CliRunner on a small app that registers it."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import typer
from typer.testing import CliRunner

from perfcast.data.validate import check_op_records
from perfcast.serve.cli.profile_cmd import profile_command

app = typer.Typer()
app.command("profile")(profile_command)


@app.callback()
def _main() -> None:
    """A group, so that ``profile`` is a sub-command as in the real CLI."""


runner = CliRunner()


def test_profile_cpu_small_budget(tmp_path):
    out = tmp_path / "prof"
    args = ["profile", "-o", str(out), "--budget-s", "3", "--presets", "gpt3-125m", "--seed", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "records to" in result.output and "collectives need" in result.output
    records = pd.read_parquet(out / "ops.parquet")
    assert len(records) > 0 and check_op_records(records).n_rejected == 0
    assert set(records["dtype"]) == {"fp32"}
    card = json.loads((out / "card.json").read_text())
    assert card["extra"]["budget_s"] == 3 and card["extra"]["elapsed_s"] < 30
    assert set(card["extra"]["families"]) == {"gemm", "attention", "norm", "softmax", "elementwise"}


def test_profile_resume_continues(tmp_path):
    out = tmp_path / "prof"
    args = ["profile", "-o", str(out), "--budget-s", "1", "--presets", "gpt3-125m", "--ops", "norm,add"]
    assert runner.invoke(app, args).exit_code == 0
    first = len(pd.read_parquet(out / "ops.parquet"))
    assert runner.invoke(app, args).exit_code == 0
    second = pd.read_parquet(out / "ops.parquet")
    assert len(second) >= first and second["key"].is_unique


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ops", "conv2d"], "conv2d"),
        (["--dtypes", "int4"], "int4"),
    ],
)
def test_profile_bad_input_exits_2(tmp_path, args, message):
    result = runner.invoke(app, ["profile", "-o", str(tmp_path / "p"), *args])
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present")
def test_profile_cuda_without_cuda_exits_2(tmp_path):
    result = runner.invoke(app, ["profile", "--device", "cuda", "-o", str(tmp_path / "p")])
    assert result.exit_code == 2 and "device=cuda" in result.output
