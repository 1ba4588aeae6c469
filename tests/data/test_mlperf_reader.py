"""Tests of perfcast.data.readers.mlperf on tiny fixtures and on the real shared files."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest
from fixtures.shared import SHARED_DATA

from perfcast.data.readers.mlperf import (
    BENCHMARK_MODELS,
    read_mlperf_bert_runs,
    read_mlperf_bert_systems,
    read_mlperf_llm_runs,
    read_mlperf_llm_systems,
)
from perfcast.data.records import REASON_COLUMN
from perfcast.data.tables import RUN_COLUMNS
from perfcast.data.validate import check_run_records
from perfcast.errors import DatasetError
from perfcast.features.hardware import resolve_gpu_name

LLM_RUNS_HEADER = (
    "mlperf_version,submitter,system,benchmark,run_file,log_missing_in_snapshot,duplicate_of,run_status,"
    "time_to_train_min,repo,commit,division,availability,system_name_json,submission_platform_log,"
    "number_of_nodes,accelerators_per_node,n_accelerators,accelerator_model_name,"
    "accelerator_memory_capacity,accelerator_interconnect,accelerator_interconnect_topology,"
    "host_networking,host_networking_topology,host_processor_model_name,framework,global_batch_size,"
    "gradient_accumulation_steps,max_sequence_length,lora_rank,run_start_ms,run_stop_ms,"
    "samples_or_tokens_at_stop,step_time_key,n_step_time_records,step_time_s_median,step_time_s_min,"
    "n_throughput_records,throughput_logged_median,config_file,config_match_method,"
    "cfg_fields_from_filename,cfg_nnodes,cfg_gpus_per_node,cfg_tp,cfg_pp,cfg_cp,cfg_vpp_interleave,"
    "cfg_seq_parallel,cfg_micro_batch,cfg_local_batch_MINIBS,cfg_fp8,derived_dp,gbs_check,dp_from_log,"
    "dp_check,config_rejected"
).split(",")
LLM_SYSTEMS_HEADER = (
    "mlperf_version,submitter,system,benchmark,repo,commit,division,availability,system_name_json,"
    "submission_platform_log,number_of_nodes,accelerators_per_node,n_accelerators,accelerator_model_name,"
    "accelerator_memory_capacity,accelerator_interconnect,accelerator_interconnect_topology,"
    "host_networking,host_networking_topology,host_processor_model_name,framework,global_batch_size,"
    "gradient_accumulation_steps,max_sequence_length,lora_rank,config_file,config_match_method,"
    "cfg_fields_from_filename,cfg_nnodes,cfg_gpus_per_node,cfg_tp,cfg_pp,cfg_cp,cfg_vpp_interleave,"
    "cfg_seq_parallel,cfg_micro_batch,cfg_local_batch_MINIBS,cfg_fp8,derived_dp,gbs_check,dp_from_log,"
    "dp_check,config_rejected,n_run_files,n_logs_missing_in_snapshot,n_runs_success,ttt_min_mean_success,"
    "ttt_min_median_success,ttt_min_min_success,ttt_min_max_success,ttt_min_olympic_mean_success,"
    "step_time_key,step_time_s_median_over_runs,throughput_logged_median_over_runs,"
    "all_runs_duplicate_of_another_row"
).split(",")
BERT_RUNS_HEADER = (
    "mlperf_version,submitter,system,benchmark,run_file,log_missing_in_snapshot,duplicate_of,run_status,"
    "time_to_train_min,repo,commit,division,availability,system_name_json,submission_platform_log,"
    "number_of_nodes,accelerators_per_node,n_accelerators,accelerator_model_name,"
    "accelerator_memory_capacity,accelerator_interconnect,accelerator_interconnect_topology,"
    "host_networking,host_networking_topology,host_processor_model_name,framework,global_batch_size,"
    "max_sequence_length,run_start_ms,run_stop_ms,samples_or_tokens_at_stop,n_throughput_records,"
    "throughput_logged_median,config_file,config_match_method,cfg_nnodes,cfg_gpus_per_node,"
    "cfg_local_batch_per_gpu_BATCHSIZE,cfg_fields_from_filename"
).split(",")
BERT_SYSTEMS_HEADER = (
    "mlperf_version,submitter,system,benchmark,repo,commit,division,availability,system_name_json,"
    "submission_platform_log,number_of_nodes,accelerators_per_node,n_accelerators,accelerator_model_name,"
    "accelerator_memory_capacity,accelerator_interconnect,accelerator_interconnect_topology,"
    "host_networking,host_networking_topology,host_processor_model_name,framework,global_batch_size,"
    "max_sequence_length,config_file,config_match_method,cfg_nnodes,cfg_gpus_per_node,"
    "cfg_local_batch_per_gpu_BATCHSIZE,cfg_fields_from_filename,n_run_files,n_logs_missing_in_snapshot,"
    "n_runs_success,ttt_min_mean_success,ttt_min_median_success,ttt_min_min_success,ttt_min_max_success,"
    "ttt_min_olympic_mean_success,throughput_logged_median_over_runs,all_runs_duplicate_of_another_row"
).split(",")

_GPT3 = {
    "mlperf_version": "v3.1", "submitter": "NVIDIA", "system": "eos_n64", "benchmark": "gpt3",
    "run_file": "NVIDIA/results/eos_n64/gpt3/result_0.txt", "log_missing_in_snapshot": "False",
    "run_status": "success", "time_to_train_min": "58.2", "repo": "mlcommons/training_results_v3.1",
    "number_of_nodes": "64", "accelerators_per_node": "8", "n_accelerators": "512",
    "accelerator_model_name": "NVIDIA H100-SXM5-80GB", "global_batch_size": "2048",
    "gradient_accumulation_steps": "128", "max_sequence_length": "2048", "step_time_s_median": "11.04",
    "config_match_method": "README names config", "cfg_tp": "4", "cfg_pp": "8", "cfg_vpp_interleave": "12",
    "cfg_micro_batch": "1", "cfg_fp8": "True", "derived_dp": "16", "config_rejected": "False",
}  # fmt: skip
_LORA = {
    **_GPT3, "benchmark": "llama2_70b_lora", "system": "eos_lora", "run_file": "NVIDIA/results/eos/l/result_1.txt",
    "n_accelerators": "8", "number_of_nodes": "1", "global_batch_size": "8", "gradient_accumulation_steps": "4",
    "max_sequence_length": "", "lora_rank": "16", "step_time_s_median": "", "time_to_train_min": "27.1",
    "cfg_tp": "4", "cfg_pp": "1", "cfg_cp": "1", "cfg_vpp_interleave": "", "cfg_seq_parallel": "1",
    "cfg_micro_batch": "", "cfg_fp8": "", "derived_dp": "2",
}  # fmt: skip
LLM_ROWS = [
    _GPT3,  # 0: step time -> timing_scope step
    _LORA,  # 1: micro batch from the log, dtype/cp/vpp defaults
    {**_GPT3, "cfg_tp": "", "cfg_pp": "", "config_match_method": "", "derived_dp": ""},  # 2: no config
    {**_GPT3, "duplicate_of": "mlcommons/training_results_v3.0:x/result_0.txt"},  # 3: re-listed run
    {**_GPT3, "run_status": "aborted"},  # 4
    {**_GPT3, "log_missing_in_snapshot": "True", "run_status": "", "time_to_train_min": "", "step_time_s_median": ""},
    {**_GPT3, "derived_dp": "15.5"},  # 6: dp not integral
    {**_GPT3, "benchmark": "resnet"},  # 7: unknown benchmark
    {**_GPT3, "n_accelerators": "lots", "time_to_train_min": "-1", "step_time_s_median": "abc"},  # 8: garbage
    {**_LORA, "lora_rank": ""},  # 9: LoRA without rank
]


def _write(tmp_path: Path, header: list[str], rows: list[dict], name: str) -> Path:
    path = tmp_path / name
    pd.DataFrame([{c: row.get(c, "") for c in header} for row in rows], columns=header).to_csv(path, index=False)
    return path


def test_llm_runs_fixture(tmp_path: Path) -> None:
    result = read_mlperf_llm_runs(_write(tmp_path, LLM_RUNS_HEADER, LLM_ROWS, "runs.csv"))
    assert (result.n_records, result.n_rejected) == (2, 8)
    gpt3, lora = result.records.iloc[0], result.records.iloc[1]
    assert list(result.records.columns[: len(RUN_COLUMNS)]) == list(RUN_COLUMNS)
    assert (gpt3["model"], gpt3["num_layers"], gpt3["hidden_size"], gpt3["seq_len"]) == ("gpt3-175b", 96, 12288, 2048)
    assert (gpt3["tp"], gpt3["pp"], gpt3["cp"], gpt3["vpp"], gpt3["dp"], gpt3["micro_batch"]) == (4, 8, 1, 12, 16, 1)
    assert (gpt3["dtype"], gpt3["timing_scope"], gpt3["gpu"]) == ("fp8", "step", "NVIDIA H100-SXM5-80GB")
    assert gpt3["measured_step_ms"] == pytest.approx(11040.0) and gpt3["measured_ttt_min"] == pytest.approx(58.2)
    assert gpt3["defaulted_fields"] == "recompute;zero_stage;overlap_grad_reduce;cp;sequence_parallel"
    assert (gpt3["zero_stage"], gpt3["overlap_grad_reduce"]) == (1, True)  # NeMo's distributed_fused_adam
    assert gpt3["source"] == "mlperf:mlcommons/training_results_v3.1:NVIDIA/results/eos_n64/gpt3/result_0.txt"
    assert (lora["model"], lora["num_kv_heads"], lora["seq_len"], lora["finetune"]) == ("llama2-70b", 8, 8192, "lora")
    assert (lora["lora_rank"], lora["micro_batch"], lora["dtype"], lora["sequence_parallel"]) == (16, 1, "bf16", True)
    assert lora["timing_scope"] == "time_to_train" and pd.isna(lora["measured_step_ms"])
    assert lora["defaulted_fields"] == "seq_len;recompute;zero_stage;overlap_grad_reduce;vpp;micro_batch;dtype"
    reasons = result.rejected[REASON_COLUMN].tolist()
    assert "parallel layout unknown: config not matched (no config found)" in reasons[0]
    assert reasons[1] == "duplicate of mlcommons/training_results_v3.0:x/result_0.txt"
    assert reasons[2] == "run_status=aborted (not success)"
    assert "run log missing from the snapshot" in reasons[3]
    assert "dp=15.5 is not a positive integer" in reasons[4]
    assert "unknown benchmark 'resnet'" in reasons[5]
    assert "n_accelerators is not a positive integer" in reasons[6] and "no measured time" in reasons[6]
    assert reasons[7] == "lora_rank missing from the log"
    checked = check_run_records(result.records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (2, 0)


def test_llm_systems_fixture(tmp_path: Path) -> None:
    base = {**_GPT3, "n_run_files": "3", "n_logs_missing_in_snapshot": "0", "n_runs_success": "3",
            "ttt_min_median_success": "58.0", "step_time_s_median_over_runs": "11.0",
            "all_runs_duplicate_of_another_row": "False"}  # fmt: skip
    rows = [
        base,
        {**base, "all_runs_duplicate_of_another_row": "True"},
        {**base, "n_runs_success": "0", "n_logs_missing_in_snapshot": "3", "ttt_min_median_success": ""},
    ]
    result = read_mlperf_llm_systems(_write(tmp_path, LLM_SYSTEMS_HEADER, rows, "systems.csv"))
    assert (result.n_records, result.n_rejected) == (1, 2)
    rec = result.records.iloc[0]
    assert rec["measured_step_ms"] == pytest.approx(11000.0) and rec["measured_ttt_min"] == pytest.approx(58.0)
    assert rec["source"] == "mlperf:mlcommons/training_results_v3.1:NVIDIA/results/eos_n64/gpt3"
    reasons = result.rejected[REASON_COLUMN].tolist()
    assert reasons[0] == "all runs are duplicates of another row"
    assert "no successful run" in reasons[1] and "every run log missing" in reasons[1]


_BERT = {
    "mlperf_version": "v3.0", "submitter": "Dell", "system": "XE9680", "benchmark": "bert",
    "run_file": "Dell/results/XE9680/bert/result_0.txt", "log_missing_in_snapshot": "False", "run_status": "success",
    "time_to_train_min": "5.4", "repo": "mlcommons/training_results_v3.0", "number_of_nodes": "1",
    "accelerators_per_node": "8", "n_accelerators": "8", "accelerator_model_name": "NVIDIA H100-SXM5-80GB",
    "global_batch_size": "768", "config_match_method": "README names config", "cfg_local_batch_per_gpu_BATCHSIZE": "48",
}  # fmt: skip


def test_bert_runs_fixture(tmp_path: Path) -> None:
    rows = [
        _BERT,
        {**_BERT, "cfg_local_batch_per_gpu_BATCHSIZE": "", "global_batch_size": "256", "max_sequence_length": "512"},
        {**_BERT, "run_status": "aborted"},
        {**_BERT, "accelerator_model_name": "", "n_accelerators": "", "accelerators_per_node": "0"},  # CPU system
        {**_BERT, "duplicate_of": "mlcommons/training_results_v3.0:Dell/results/XE9680-POWER/bert/result_0.txt"},
    ]
    result = read_mlperf_bert_runs(_write(tmp_path, BERT_RUNS_HEADER, rows, "bert.csv"))
    assert (result.n_records, result.n_rejected) == (2, 3)
    first, second = result.records.iloc[0], result.records.iloc[1]
    assert (first["architecture"], first["num_layers"], first["hidden_size"], first["vocab_size"]) == (
        "bert", 24, 1024, 30522,
    )  # fmt: skip
    assert (first["dp"], first["tp"], first["pp"], first["micro_batch"], first["global_batch"]) == (8, 1, 1, 48, 768)
    assert (first["timing_scope"], first["measured_ttt_min"], first["seq_len"]) == ("time_to_train", 5.4, 512)
    assert second["micro_batch"] == 32 and "micro_batch" in second["defaulted_fields"]
    reasons = result.rejected[REASON_COLUMN].tolist()
    assert reasons[0] == "run_status=aborted (not success)"
    assert "accelerator_model_name is missing" in reasons[1]
    assert reasons[2].startswith("duplicate of ")
    checked = check_run_records(result.records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (2, 0)


def test_bert_systems_fixture(tmp_path: Path) -> None:
    base = {**_BERT, "n_run_files": "10", "n_logs_missing_in_snapshot": "0", "n_runs_success": "10",
            "ttt_min_median_success": "5.5", "all_runs_duplicate_of_another_row": "False"}  # fmt: skip
    result = read_mlperf_bert_systems(_write(tmp_path, BERT_SYSTEMS_HEADER, [base], "bs.csv"))
    assert result.n_records == 1 and result.records.loc[0, "measured_ttt_min"] == pytest.approx(5.5)


def test_missing_columns_raise(tmp_path: Path) -> None:
    path = _write(tmp_path, ["mlperf_version", "benchmark"], [{"benchmark": "gpt3"}], "x.csv")
    with pytest.raises(DatasetError, match="cfg_tp"):
        read_mlperf_llm_runs(path)


@pytest.mark.parametrize("benchmark", sorted(set(BENCHMARK_MODELS) - {"bert"}))
def test_benchmark_models_match_the_presets(benchmark: str) -> None:
    spec = BENCHMARK_MODELS[benchmark]
    text = resources.files("perfcast.features.catalog.models").joinpath(f"{spec.model}.json").read_text()
    preset = json.loads(text)
    for field in ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size", "seq_len", "gated_mlp"):
        if benchmark == "llama2_70b_lora" and field == "seq_len":
            continue  # the LoRA benchmark fine-tunes at 8192, the preset's pre-training context is 4096
        assert getattr(spec, field) == preset[field], field
    assert spec.num_kv_heads == preset.get("num_kv_heads", preset["num_heads"])


REAL = [
    # file, reader, (records, rejected), (checked accepted, checked rejected)
    ("mlperf_training_llm_runs.csv", read_mlperf_llm_runs, (377, 240), (377, 0)),
    ("mlperf_training_llm_systems.csv", read_mlperf_llm_systems, (51, 38), (51, 0)),
    ("mlperf_training_bert_runs.csv", read_mlperf_bert_runs, (1088, 292), (970, 118)),
    ("mlperf_training_bert_systems.csv", read_mlperf_bert_systems, (110, 28), (98, 12)),
]


@pytest.mark.parametrize(("name", "reader", "counts", "checked_counts"), REAL, ids=[r[0] for r in REAL])
def test_real_file(name: str, reader, counts: tuple[int, int], checked_counts: tuple[int, int]) -> None:  # noqa: ANN001
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip("shared MLPerf data not available")
    result = reader(path)
    assert (result.n_records, result.n_rejected) == counts
    checked = check_run_records(result.records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == checked_counts
    # only devices the catalog lacks are rejected by the checks
    assert checked.rejected[REASON_COLUMN].str.contains("is not in the hardware catalog").all()
    rec = checked.records
    assert (rec["tp"] * rec["pp"] * rec["cp"] * rec["dp"] == rec["num_gpus"]).all()


def test_real_llm_runs_details() -> None:
    path = SHARED_DATA / "mlperf_training_llm_runs.csv"
    if not path.exists():
        pytest.skip("shared MLPerf data not available")
    result = read_mlperf_llm_runs(path)
    rec = result.records
    assert rec["timing_scope"].value_counts().to_dict() == {"time_to_train": 329, "step": 48}
    assert rec["benchmark"].value_counts().to_dict() == {"llama2_70b_lora": 320, "gpt3": 57}
    assert (rec["global_batch"] % (rec["dp"] * rec["micro_batch"]) == 0).all()
    reasons = result.rejected[REASON_COLUMN]
    assert reasons.str.startswith("parallel layout unknown").sum() == 217
    assert reasons.str.startswith("duplicate of").sum() == 13
    assert reasons.str.startswith("run log missing").sum() == 10


def test_unstated_vpp_comes_from_stated_configs_of_the_same_layout(tmp_path: Path) -> None:
    rows = [
        _GPT3,  # states vpp 12
        {**_GPT3, "run_file": "a/result_1.txt", "cfg_vpp_interleave": ""},  # same layout, vpp unstated -> 12
        {**_GPT3, "run_file": "b/result_2.txt", "cfg_vpp_interleave": "", "cfg_micro_batch": "2"},  # no evidence
        {**_GPT3, "run_file": "c/result_3.txt", "cfg_vpp_interleave": "", "cfg_pp": "1", "cfg_tp": "32"},  # pp=1
    ]
    records = read_mlperf_llm_runs(_write(tmp_path, LLM_RUNS_HEADER, rows, "runs.csv")).records
    assert records["vpp"].tolist() == [12, 12, 1, 1]
    assert ["vpp" in f.split(";") for f in records["defaulted_fields"]] == [False, True, True, True]
