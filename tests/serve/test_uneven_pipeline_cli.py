"""Uneven pipeline stages through ``perfcast predict steps``: Llama 3.1 405B (126 layers) at pp=8."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from perfcast.data.tables import ERROR_COLUMN, read_table
from perfcast.serve.cli import app

runner = CliRunner()
EMB, LOSS = "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"
BASE = {"model": "llama3.1-405b", "tp": 8, "pp": 8, "dp": 2, "micro_batch": 1, "global_batch": 32,
        "sequence_parallel": True, "gpu": "h100-sxm5-80gb", "gpus_per_node": 8}  # fmt: skip
ROWS = {
    "default_vpp8": {"vpp": 8},  # the NeMo recipe's layout: 15, 16 * 6, 15 layers with the switches
    "stated_vpp8": {"vpp": 8, EMB: True, LOSS: True},
    "even64_vpp8": {"vpp": 8, "num_layers": 64},
    "even128_vpp8": {"vpp": 8, "num_layers": 128},
    "default_vpp1": {"vpp": 1},
    "even120_vpp1": {"vpp": 1, "num_layers": 120},
    "even128_vpp1": {"vpp": 1, "num_layers": 128},
    "first12_last12": {"vpp": 1, "first_stage_layers": 12, "last_stage_layers": 12},  # 17 on each middle rank
    "first18_last12": {"vpp": 1, "first_stage_layers": 18, "last_stage_layers": 12},  # 16 on each middle rank
    "bad_split": {"vpp": 8, "first_stage_layers": 12},
}


@pytest.fixture(scope="module")
def predicted(tmp_path_factory) -> pd.DataFrame:
    folder = tmp_path_factory.mktemp("uneven")
    src, dst = folder / "runs.csv", folder / "out.csv"
    pd.DataFrame([{**BASE, **row} for row in ROWS.values()]).to_csv(src, index=False)
    result = runner.invoke(app, ["predict", "steps", str(src), "-o", str(dst), "--show", "0"])
    assert result.exit_code == 0, result.output
    return read_table(dst).set_axis(list(ROWS)).fillna({ERROR_COLUMN: "", "defaulted_fields": ""})


def test_llama_405b_at_pp8_predicts_with_the_default_split_named(predicted):
    ok = predicted.drop(index="bad_split")
    assert (ok[ERROR_COLUMN] == "").all() and ok["step_ms"].gt(0).all()
    for name in ("default_vpp8", "default_vpp1"):
        assert predicted.at[name, "defaulted_fields"].split(",")[-2:] == [EMB, LOSS]
    assert EMB not in predicted.at["stated_vpp8", "defaulted_fields"]
    assert predicted.at["stated_vpp8", "step_ms"] == predicted.at["default_vpp8", "step_ms"]
    assert "first_stage_layers=12 is not a multiple of vpp=8" in predicted.at["bad_split", ERROR_COLUMN]


def test_the_step_is_timed_by_the_slowest_stage(predicted):
    ms = predicted["step_ms"]
    # 126 layers: middle ranks hold 16 like the 128-layer split, the end ranks one less with the embedding/loss
    assert ms["even120_vpp1"] < ms["default_vpp1"] < ms["even128_vpp1"]
    assert ms["even64_vpp8"] < ms["default_vpp8"] < ms["even128_vpp8"]
    # a hypothetical even split of 126 layers (15.75 per stage) sits between 120 and 128 layers
    even_126 = ms["even120_vpp1"] + (ms["even128_vpp1"] - ms["even120_vpp1"]) * 6 / 8
    assert ms["first12_last12"] > even_126 and ms["first12_last12"] > ms["even128_vpp1"]  # 17-layer middle ranks


def test_stated_stage_layers_are_honoured(predicted):
    ms, mem = predicted["step_ms"], predicted["peak_mem_gib"]
    assert ms["first18_last12"] > ms["default_vpp1"]  # rank 0 holds 18 layers and the embedding
    assert mem["first18_last12"] > mem["default_vpp1"]  # and 8 microbatches of 18 layers' activations
    assert "first_stage_layers" not in predicted.at["first18_last12", "defaulted_fields"]
