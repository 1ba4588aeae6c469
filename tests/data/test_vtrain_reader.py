"""Tests of perfcast.data.readers.vtrain on a tiny fixture and on the real shared file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from fixtures.shared import SHARED_DATA

from perfcast.data.readers.vtrain import megatron_padded_vocab, read_vtrain_iterations
from perfcast.data.records import REASON_COLUMN, ReadResult
from perfcast.data.tables import RUN_COLUMNS
from perfcast.errors import DatasetError

REAL_FILE = SHARED_DATA / "vtrain_megatron_iteration_time.csv"

HEADER = (
    "setting,params_billion,num_gpus,global_batch,micro_batch,hidden_size,num_heads,num_layers,"
    "seq_len,tp,dp,pp,iteration_time_ms,gpu_in_config,gpus_per_node_in_config,"
    "activation_checkpointing_in_config,pipeline_schedule_in_config,sim_inter_node_bw_param,"
    "sim_intra_node_bw_param,matched_config,source_path,source_row"
)
_TAIL = "1f1b,800,150,config/validation/single/config_val_single_{i:04d}.json,data/ground_truth_single.csv,{i}"
ROWS = [
    # setting, params, gpus, gb, mb, h, heads, layers, seq, tp, dp, pp, time, gpu, gpn, ckpt
    "single_node,,2,16,8,1024,16,24,1024,1,1,2,372.160408,A100,8,True,",
    "single_node,,8,32,4,1024,16,24,1024,2,2,2,219.732754,A100,8,True,",
    "single_node,,8,64,2,2048,16,12,1024,8,1,1,100.5,A100,8,False,",
    "single_node,,4,16,4,2048,16,12,1024,4,1,1,,A100,8,True,",  # NaN time
    "single_node,,4,16,4,2048,16,12,1024,2,2,1,-3.0,A100,8,True,",  # negative time
]


def _write_fixture(tmp_path: Path, rows: list[str] = ROWS) -> Path:
    lines = [HEADER] + [row + _TAIL.format(i=i) for i, row in enumerate(rows)]
    path = tmp_path / "vtrain.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_fixture_accepts_valid_and_rejects_bad_times(tmp_path: Path) -> None:
    result = read_vtrain_iterations(_write_fixture(tmp_path))
    assert isinstance(result, ReadResult)
    assert (result.n_records, result.n_rejected) == (3, 2)
    reasons = result.rejected[REASON_COLUMN].tolist()
    assert "iteration_time_ms is missing" in reasons[0]
    assert "iteration_time_ms is not positive" in reasons[1]
    assert result.rejected["source_row"].tolist() == [3, 4]


def test_fixture_maps_to_run_table(tmp_path: Path) -> None:
    rec = read_vtrain_iterations(_write_fixture(tmp_path)).records
    assert list(rec.columns) == [
        *RUN_COLUMNS,
        "tied_embeddings",
        "flash_attention",
        "timing_scope",
        "measured_step_ms",
        "source",
        "setting",
        "source_row",
    ]
    assert rec["tied_embeddings"].all() and not rec["flash_attention"].any()
    first = rec.iloc[0]
    assert first["num_kv_heads"] == first["num_heads"] == 16
    assert first["ffn_hidden_size"] == 4 * 1024
    assert (first["tp"], first["pp"], first["dp"], first["cp"], first["ep"]) == (1, 2, 1, 1, 1)
    assert first["gpus_per_node"] == 2  # capped at num_gpus
    assert first["measured_step_ms"] == pytest.approx(372.160408)
    assert first["recompute"] == "full" and first["dtype"] == "fp16"
    assert first["source"] == "vtrain:data/ground_truth_single.csv"
    assert rec["recompute"].tolist() == ["full", "full", "none"]
    assert rec["vocab_size"].tolist() == [50304, 50432, 51200]
    assert rec["gpus_per_node"].tolist() == [2, 8, 8]
    assert rec["source_row"].tolist() == [0, 1, 2]
    assert not rec["sequence_parallel"].any()
    assert (rec["zero_stage"] == 0).all() and (rec["finetune"] == "full").all()


def test_megatron_padding() -> None:
    assert megatron_padded_vocab(50257, [1, 2, 4, 8]).tolist() == [50304, 50432, 50688, 51200]
    assert megatron_padded_vocab(51200, [8]).tolist() == [51200]


def test_missing_columns_are_named(tmp_path: Path) -> None:
    path = _write_fixture(tmp_path)
    df = pd.read_csv(path).drop(columns=["tp", "iteration_time_ms"])
    df.to_csv(path, index=False)
    with pytest.raises(DatasetError, match="iteration_time_ms") as err:
        read_vtrain_iterations(path)
    assert "tp" in str(err.value)


def test_bad_integer_field_is_rejected(tmp_path: Path) -> None:
    rows = [ROWS[0], ROWS[1].replace(",2,2,2,219", ",0,2,2,219")]
    result = read_vtrain_iterations(_write_fixture(tmp_path, rows))
    assert result.n_records == 1
    assert result.rejected[REASON_COLUMN].tolist() == ["tp is not a positive integer"]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        read_vtrain_iterations(tmp_path / "absent.csv")


@pytest.mark.shared_data
@pytest.mark.skipif(not REAL_FILE.is_file(), reason=f"{REAL_FILE} not present")
def test_real_file_loads_all_rows() -> None:
    result = read_vtrain_iterations(REAL_FILE)
    assert result.n_records == 1440
    assert result.n_rejected == 0
    rec = result.records
    assert (rec["tp"] * rec["pp"] * rec["dp"] == rec["num_gpus"]).all()
    assert (rec["measured_step_ms"] > 0).all()
    assert rec["source_row"].is_unique
