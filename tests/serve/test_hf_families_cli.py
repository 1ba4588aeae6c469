"""A DeepSeek-V3 config.json row through ``perfcast predict steps`` at a Megatron-like folded layout."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from perfcast.data.tables import ERROR_COLUMN, read_table
from perfcast.serve.cli import app

runner = CliRunner()
DEEPSEEK = Path(__file__).parents[1] / "fixtures" / "hf_configs" / "deepseek_v3.json"


def test_deepseek_v3_at_tp2_pp8_ep64_on_1024_gpus_is_answered(tmp_path) -> None:
    base = {"model": str(DEEPSEEK), "seq_len": 4096, "tp": 2, "pp": 8, "dp": 64, "ep": 64, "etp": 1,
            "micro_batch": 1, "global_batch": 2048, "sequence_parallel": True, "recompute": "full",
            "gpu": "h100-sxm5-80gb", "num_gpus": 1024}  # fmt: skip
    # ep*etp must divide tp*cp*dp=128: 256 does not; ep=128 > dp*cp=64 folds over tp
    rows = [base, {**base, "ep": 256}, {**base, "ep": 64, "etp": 4}, {**base, "ep": 128}]
    src, dst = tmp_path / "runs.csv", tmp_path / "out.csv"
    pd.DataFrame(rows).to_csv(src, index=False)
    result = runner.invoke(app, ["predict", "steps", str(src), "-o", str(dst), "--model", "analytic", "--breakdown",
                                 "--show", "0"])  # fmt: skip
    assert result.exit_code == 0, result.output
    out = read_table(dst).fillna({ERROR_COLUMN: ""})
    assert out.loc[0, ERROR_COLUMN] == "" and out.loc[0, "step_ms"] > 0
    level = next(c for c in out.columns if c.endswith("_ep") or c == "comm_ep_level")  # the ep group's links
    assert out.loc[0, level].startswith("nvlink+")  # 64 ep ranks at stride etp=1: 8 per node, then the fabric
    assert "ep*etp=256*1=256 does not divide tp*cp*dp=2*1*64=128" in out.loc[1, ERROR_COLUMN]
    assert "ep*etp=64*4=256 does not divide tp*cp*dp=2*1*64=128" in out.loc[2, ERROR_COLUMN]
    assert out.loc[3, ERROR_COLUMN] == "" and out.loc[3, "step_ms"] > 0
