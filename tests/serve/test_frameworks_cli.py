"""The framework column through ``perfcast predict steps``: Megatron-Core on H100 at tp=8."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from perfcast.data.tables import ERROR_COLUMN, read_table
from perfcast.serve.cli import app

runner = CliRunner()
BASE = {"model": "llama3-70b", "gpu": "h100-sxm5-80gb", "tp": 8, "dp": 4, "micro_batch": 1, "global_batch": 32,
        "sequence_parallel": True, "recompute": "selective"}  # fmt: skip
ROWS = {
    "mcore": {"framework": "megatron-core"},  # tp_comm_overlap on by default
    "mcore_no_tp_overlap": {"framework": "megatron-core", "tp_comm_overlap": False},
    "nemo_spelling": {"framework": "NeMo"},
    "no_framework": {},
    "maxtext": {"framework": "maxtext"},
}


def test_megatron_core_tp8_with_and_without_tp_comm_overlap(tmp_path):
    src, dst = tmp_path / "runs.csv", tmp_path / "out.csv"
    pd.DataFrame([{**BASE, **row} for row in ROWS.values()]).to_csv(src, index=False)
    result = runner.invoke(
        app, ["predict", "steps", str(src), "-o", str(dst), "--model", "analytic", "--breakdown", "--show", "0"]
    )
    assert result.exit_code == 0, result.output
    out = read_table(dst).set_axis(list(ROWS)).fillna({ERROR_COLUMN: "", "defaulted_fields": ""})
    on, off = out.loc["mcore"], out.loc["mcore_no_tp_overlap"]
    assert on[ERROR_COLUMN] == "" and off[ERROR_COLUMN] == ""
    assert on["comm_tp_ms"] < 0.5 * off["comm_tp_ms"]  # the layers' TP collectives hide behind their GEMMs
    assert on["step_ms"] < off["step_ms"]
    assert on["compute_ms"] == pytest.approx(off["compute_ms"])
    assert on["step_ms"] == out.loc["nemo_spelling", "step_ms"]
    defaulted = on["defaulted_fields"].split(",")
    assert {"tp_comm_overlap", "zero_stage", "overlap_grad_reduce", "overlap_param_gather"} <= set(defaulted)
    assert "framework" not in defaulted and "tp_comm_overlap" not in off["defaulted_fields"].split(",")
    assert "framework" in out.loc["no_framework", "defaulted_fields"].split(",")
    assert out.loc["no_framework", "step_ms"] > off["step_ms"]  # nothing overlapped, no sharded optimizer
    assert "JAX/XLA stack" in out.loc["maxtext", ERROR_COLUMN]
