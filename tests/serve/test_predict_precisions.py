"""``perfcast predict steps`` on low-precision rows: nvfp4 on Blackwell, refused on Hopper."""

from __future__ import annotations

import pandas as pd
from typer.testing import CliRunner

from perfcast.serve.cli import app

ROW = dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336, vocab_size=128256,
           seq_len=8192, tp=1, pp=1, dp=8, micro_batch=1, global_batch=64, num_gpus=8)  # fmt: skip


def test_nvfp4_row_is_answered_on_b200_faster_than_bf16_and_refused_on_h100(tmp_path):
    rows = pd.DataFrame([
        {**ROW, "dtype": "bf16", "gpu": "b200-hgx"},
        {**ROW, "dtype": "nvfp4", "gpu": "b200-hgx"},
        {**ROW, "dtype": "nvfp4", "gpu": "h100-sxm5-80gb"},
        {**ROW, "dtype": "fp8", "fp8_recipe": "tensorwise", "gpu": "h100-sxm5-80gb"},
    ])  # fmt: skip
    src, dst = tmp_path / "runs.csv", tmp_path / "out.csv"
    rows.to_csv(src, index=False)
    result = CliRunner().invoke(app, ["predict", "steps", str(src), "-o", str(dst), "--breakdown", "--show", "0"])
    assert result.exit_code == 0, result.output
    out = pd.read_csv(dst)
    bf16, nvfp4, refused, fp8 = (out.iloc[i] for i in range(4))
    assert pd.isna(bf16["error"]) and pd.isna(nvfp4["error"]) and pd.isna(fp8["error"])
    assert 0 < nvfp4["step_ms"] < bf16["step_ms"]
    assert nvfp4["compute_ms"] < bf16["compute_ms"]
    assert bool(nvfp4["out_of_domain"])
    assert "nvfp4 is not supported on h100-sxm5-80gb" in refused["error"] and pd.isna(refused["step_ms"])
