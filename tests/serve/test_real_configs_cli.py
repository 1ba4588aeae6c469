"""Configurations production runs use, through ``perfcast predict steps``: a GB200 NVL72 run
whose data parallelism spans racks, and a LoRA fine-tune that states no rank."""

from __future__ import annotations

import pandas as pd
from typer.testing import CliRunner

from perfcast.data.tables import ERROR_COLUMN, read_table
from perfcast.features.run_config import DEFAULT_LORA_RANK
from perfcast.serve.cli import app

GB200_512 = {"model": "llama3-70b", "tp": 4, "pp": 4, "dp": 32, "global_batch": 1024, "micro_batch": 1,
             "sequence_parallel": True, "gpu": "NVIDIA Blackwell GPU (GB200)", "num_gpus": 512}  # fmt: skip
LORA = {"model": "llama2-70b", "tp": 4, "pp": 1, "dp": 2, "global_batch": 8, "micro_batch": 1, "finetune": "lora",
        "gpu": "h100-sxm5-80gb", "num_gpus": 8}  # fmt: skip


def _predict(tmp_path, rows: list[dict], *options: str) -> pd.DataFrame:
    src, dst = tmp_path / "runs.csv", tmp_path / "out.csv"
    pd.DataFrame(rows).to_csv(src, index=False)
    result = CliRunner().invoke(app, ["predict", "steps", str(src), "-o", str(dst), "--show", "0", *options])
    assert result.exit_code == 0, result.output
    return read_table(dst).fillna({ERROR_COLUMN: "", "defaulted_fields": ""})


def test_a_gb200_nvl72_run_of_512_gpus_spans_racks_over_infiniband(tmp_path) -> None:
    rack, trays = _predict(tmp_path, [GB200_512, {**GB200_512, "nvlink_domain": 4}], "--breakdown").to_dict("records")
    assert rack[ERROR_COLUMN] == trays[ERROR_COLUMN] == ""
    assert rack["link_tp"] == "nvlink"  # tensor parallelism stays inside the rack's NVLink
    assert rack["link_dp"] == "nvlink+ib-ndr-400-gb200-nvl72"  # 16 data-parallel ranks per rack, 2 racks
    assert "nvlink_domain" in rack["defaulted_fields"].split(",")
    assert rack["dp_sync_ms"] < trays["dp_sync_ms"] and rack["composed_step_ms"] < trays["composed_step_ms"]
    assert rack["step_ms"] <= trays["step_ms"]  # both may sit on the Blackwell MFU-ceiling floor


def test_a_lora_row_without_a_rank_is_answered_with_the_default_rank_named(tmp_path) -> None:
    lora, ranked = _predict(tmp_path, [LORA, {**LORA, "lora_rank": DEFAULT_LORA_RANK}]).to_dict("records")
    assert lora[ERROR_COLUMN] == "" and lora["step_ms"] > 0
    assert "lora_rank" in lora["defaulted_fields"].split(",")
    assert lora["step_ms"] == ranked["step_ms"]
