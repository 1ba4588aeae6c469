"""Tests of perfcast.data.readers.training_logs on synthetic Megatron-LM and NeMo logs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from perfcast.data.readers.training_logs import (
    RECORD_COLUMNS,
    parse_megatron_arguments,
    parse_simple_yaml,
    read_megatron_log,
    read_nemo_log,
)
from perfcast.data.validate import check_run_records
from perfcast.errors import DatasetError
from perfcast.features.hardware import resolve_gpu_name

H100 = "NVIDIA H100 80GB HBM3"

# --------------------------------------------------------------------------- Megatron-LM

MEGATRON_ARGS = {
    "bf16": "True",
    "context_parallel_size": "1",
    "data_parallel_size": "2",
    "expert_model_parallel_size": "1",
    "ffn_hidden_size": "8192",
    "fp16": "False",
    "fp8": "None",
    "global_batch_size": "128",
    "group_query_attention": "False",
    "hidden_size": "2048",
    "log_interval": "10",
    "micro_batch_size": "2",
    "moe_router_topk": "2",
    "num_attention_heads": "16",
    "num_experts": "None",
    "num_layers": "24",
    "num_layers_per_virtual_pipeline_stage": "None",
    "num_query_groups": "1",
    "padded_vocab_size": "None",
    "pipeline_model_parallel_size": "2",
    "recompute_granularity": "selective",
    "recompute_method": "None",
    "seq_length": "2048",
    "sequence_parallel": "True",
    "swiglu": "False",
    "tensor_model_parallel_size": "4",
    "untie_embeddings_and_output_weights": "False",
    "use_distributed_optimizer": "True",
    "use_flash_attn": "True",
    "vocab_size": "None",
    "world_size": "16",
}
ITER_MS = [3000.0, 1500.0, 1250.0, 1210.0, 1190.0, 1200.0, 1205.0, 1195.0]


def _megatron_log(args: dict[str, str] = MEGATRON_ARGS, iter_ms: list[float] = ITER_MS, vocab: bool = True) -> str:
    lines = [
        "using world size: 16, data-parallel size: 2, context-parallel size: 1, tensor-model-parallel size: 4, "
        "pipeline-model-parallel size: 2",
        "------------------------ arguments ------------------------",
    ]
    for name in sorted(args):
        lines.append(f"  {name} {'.' * max(48 - len(name), 0)} {args[name]}")
    lines += ["  a_very_long_argument_name_that_is_longer_than_48_chars  7"]
    lines += [
        "-------------------- end of arguments ---------------------",
        "> building GPT2BPETokenizer tokenizer ...",
    ]
    if vocab:
        lines.append(" > padded vocab (size: 50257) with 431 dummy tokens (new size: 50688)")
    lines.append("[after dataloaders are built] datetime: 2024-05-01 10:00:00 ")
    for i, ms in enumerate(iter_ms, start=1):
        lines.append(
            f" [2024-05-01 10:0{i % 10}:00] iteration {10 * i:8d}/    1000 | consumed samples: {1280 * i:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): 400.1 | "
            f"learning rate: 1.000000E-04 | global batch size:   128 | lm loss: 7.123456E+00 | "
            f"loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |"
        )
        if i == 1:
            lines.append("[Rank 0] (after 10 iterations) memory (MB) | allocated: 1234.5 | max allocated: 2345.6")
    return "\n".join(lines) + "\n"


def _write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_megatron_maps_arguments(tmp_path: Path) -> None:
    result = read_megatron_log(_write(tmp_path, _megatron_log()), gpu=H100)
    assert result.n_records == 1 and result.n_rejected == 0
    rec = result.records
    assert list(rec.columns) == list(RECORD_COLUMNS)
    r = rec.iloc[0]
    expected = {
        "num_layers": 24, "hidden_size": 2048, "num_heads": 16, "num_kv_heads": 16, "ffn_hidden_size": 8192,
        "vocab_size": 50688, "seq_len": 2048, "tp": 4, "pp": 2, "dp": 2, "cp": 1, "ep": 1, "micro_batch": 2,
        "global_batch": 128, "vpp": 1, "sequence_parallel": True, "zero_stage": 1, "recompute": "selective",
        "finetune": "full", "lora_rank": 0, "dtype": "bf16", "gpu": H100, "num_gpus": 16, "gpus_per_node": 8,
        "gated_mlp": False, "tied_embeddings": True, "flash_attention": True, "timing_scope": "step",
        "n_iterations": 5, "log_interval": 10, "framework": "megatron-lm", "source": "megatron_log:train.log",
    }  # fmt: skip
    assert {k: r[k] for k in expected} == expected
    assert r["num_experts"] is None and r["top_k"] is None
    used = ITER_MS[3:]
    assert r["measured_step_ms"] == pytest.approx(sorted(used)[2])
    assert r["measured_step_std_ms"] == pytest.approx(_std(used))
    checked = check_run_records(rec, resolve_gpu=resolve_gpu_name)
    assert checked.n_rejected == 0, checked.rejected


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_megatron_gqa_swiglu_vpp_fp8_moe(tmp_path: Path) -> None:
    args = dict(MEGATRON_ARGS)
    args.update(
        group_query_attention="True", num_query_groups="4", swiglu="True", ffn_hidden_size="None", fp8="hybrid",
        num_layers_per_virtual_pipeline_stage="3", recompute_granularity="full", use_distributed_optimizer="False",
        num_experts="8", expert_model_parallel_size="2", use_flash_attn="False", padded_vocab_size="32000",
        untie_embeddings_and_output_weights="True",
    )  # fmt: skip
    r = read_megatron_log(_write(tmp_path, _megatron_log(args, vocab=False)), gpu=H100, gpus_per_node=4).records.iloc[0]
    assert (r["num_kv_heads"], r["ffn_hidden_size"], r["dtype"], r["vpp"]) == (4, int(8 * 2048 / 3 / 64) * 64, "fp8", 4)
    assert (r["recompute"], r["zero_stage"], r["gated_mlp"], r["flash_attention"]) == ("full", 0, True, False)
    assert (r["num_experts"], r["top_k"], r["ep"], r["vocab_size"]) == (8, 2, 2, 32000)
    assert (r["gpus_per_node"], r["tied_embeddings"]) == (4, False)


def test_megatron_uses_last_run_and_skip_first(tmp_path: Path) -> None:
    first = _megatron_log(iter_ms=[9999.0] * 6)
    second = _megatron_log(dict(MEGATRON_ARGS, micro_batch_size="4"), iter_ms=[5000.0, 100.0, 100.0, 100.0])
    r = read_megatron_log(_write(tmp_path, first + second), gpu=H100, skip_first=1).records.iloc[0]
    assert (r["micro_batch"], r["measured_step_ms"], r["n_iterations"]) == (4, 100.0, 3)
    assert math.isnan(read_megatron_log(_write(tmp_path, second), gpu=H100).records.iloc[0]["measured_step_std_ms"])


def test_megatron_errors(tmp_path: Path) -> None:
    args = {k: v for k, v in MEGATRON_ARGS.items() if k not in ("num_layers", "seq_length")}
    with pytest.raises(DatasetError, match="num_layers, seq_length"):
        read_megatron_log(_write(tmp_path, _megatron_log(args)), gpu=H100)
    with pytest.raises(DatasetError, match="vocab size"):
        read_megatron_log(_write(tmp_path, _megatron_log(vocab=False)), gpu=H100)
    with pytest.raises(DatasetError, match="no 'iteration"):
        read_megatron_log(_write(tmp_path, _megatron_log(iter_ms=[])), gpu=H100)
    with pytest.raises(DatasetError, match="skip_first=3"):
        read_megatron_log(_write(tmp_path, _megatron_log(iter_ms=[1.0, 2.0])), gpu=H100)
    with pytest.raises(DatasetError, match="arguments block"):
        read_megatron_log(_write(tmp_path, "hello\n"), gpu=H100)
    with pytest.raises(DatasetError, match="no such file"):
        read_megatron_log(tmp_path / "absent.log", gpu=H100)
    with pytest.raises(DatasetError, match="tp\\*pp\\*cp"):
        read_megatron_log(_write(tmp_path, _megatron_log(dict(MEGATRON_ARGS, world_size="12"))), gpu=H100)


def test_parse_megatron_arguments_values() -> None:
    args = parse_megatron_arguments(_megatron_log())
    assert args["num_layers"] == 24 and args["bf16"] is True and args["fp8"] is None
    assert args["a_very_long_argument_name_that_is_longer_than_48_chars"] == 7


# --------------------------------------------------------------------------- NeMo

NEMO_CONFIG = """\
    name: megatron_gpt
    restore_from_path: null
    trainer:
      devices: 8
      num_nodes: 2
      accelerator: gpu
      precision: bf16-mixed
      logger: false
      max_steps: 100
      log_every_n_steps: 1
    exp_manager:
      explicit_log_dir: null
      create_checkpoint_callback: true  # keep
    model:
      micro_batch_size: 1
      global_batch_size: 256
      rampup_batch_size: null
      tensor_model_parallel_size: 4
      pipeline_model_parallel_size: 2
      virtual_pipeline_model_parallel_size: 3
      encoder_seq_length: 4096
      max_position_embeddings: ${.encoder_seq_length}
      num_layers: 48
      hidden_size: 6144
      ffn_hidden_size: 24576
      num_attention_heads: 48
      num_query_groups: null
      activation: fast-swiglu
      share_embeddings_and_output_weights: false
      sequence_parallel: true
      activations_checkpoint_granularity: selective
      activations_checkpoint_method: null
      use_flash_attention: true
      tokenizer:
        library: megatron
        type: GPT2BPETokenizer
      data:
        data_prefix:
        - 1.0
        - /data/my_text_document
        seq_length: ${model.encoder_seq_length}
      optim:
        name: distributed_fused_adam
        lr: 0.0001
"""


def _nemo_log(config: str = NEMO_CONFIG, steps: list[float] | None = None, mllog: list[float] | None = None) -> str:
    head = (
        "[NeMo I 2024-05-01 10:00:00 megatron_gpt_pretraining:37] \n    \n"
        "    ************** Experiment configuration ***********\n"
        "[NeMo I 2024-05-01 10:00:00 megatron_gpt_pretraining:38] \n"
    )
    body = [
        "[NeMo W 2024-05-01 10:00:01 exp_manager:123] No version folders would be created under the log folder",
        "GPU available: True (cuda), used: True",
        "[NeMo I 2024-05-01 10:00:02 tokenizer_utils:182] Getting Megatron tokenizer for pretrained model name: gpt2",
        "[NeMo I 2024-05-01 10:00:03 megatron_base_model:315] Padded vocab_size: 50688, original vocab_size: 50257, "
        "dummy tokens: 431.",
    ]
    bar = []
    for i, s in enumerate(steps or []):
        for refresh in range(2):  # progress-bar refreshes repeat a step
            bar.append(
                f"Epoch 0: :   {i}%|▏| {i + 1}/100 [00:{i:02d}<01:40, reduced_train_loss=7.{refresh}, "
                f"global_step={float(i)}, consumed_samples={256.0 * (i + 1)}, train_step_timing in s={s}]"
            )
    text = head + config + "\n".join(body) + "\n" + "\r".join(bar) + "\n"
    for i, s in enumerate(mllog or []):
        entry = {
            "namespace": "",
            "time_ms": 1,
            "event_type": "POINT_IN_TIME",
            "key": "tracked_stats",
            "value": {"throughput": {"train_step_time": s}},
            "metadata": {"file": "x.py", "lineno": 1, "step": i},
        }
        text += f":::MLLOG {json.dumps(entry)}\n"
    return text


NEMO_STEPS = [9.0, 4.0, 3.3, 3.1, 3.0, 3.2, 3.05]


def test_nemo_maps_config(tmp_path: Path) -> None:
    result = read_nemo_log(_write(tmp_path, _nemo_log(steps=NEMO_STEPS), "nemo.log"), gpu=H100)
    rec = result.records
    assert list(rec.columns) == list(RECORD_COLUMNS)
    r = rec.iloc[0]
    expected = {
        "num_layers": 48, "hidden_size": 6144, "num_heads": 48, "num_kv_heads": 48, "ffn_hidden_size": 24576,
        "vocab_size": 50688, "seq_len": 4096, "tp": 4, "pp": 2, "dp": 2, "cp": 1, "ep": 1, "micro_batch": 1,
        "global_batch": 256, "vpp": 3, "sequence_parallel": True, "zero_stage": 1, "recompute": "selective",
        "dtype": "bf16", "gpu": H100, "num_gpus": 16, "gpus_per_node": 8, "gated_mlp": True,
        "tied_embeddings": False, "flash_attention": True, "timing_scope": "step", "n_iterations": 4,
        "framework": "nemo", "source": "nemo_log:nemo.log",
    }  # fmt: skip
    assert {k: r[k] for k in expected} == expected
    assert r["measured_step_ms"] == pytest.approx(3075.0)  # median of 3.1, 3.0, 3.2, 3.05 s
    checked = check_run_records(rec, resolve_gpu=resolve_gpu_name)
    assert checked.n_rejected == 0, checked.rejected


def test_nemo_mllog_step_times(tmp_path: Path) -> None:
    log = _nemo_log(mllog=[5.0, 2.0, 2.0, 1.5, 1.6, 1.7])
    r = read_nemo_log(_write(tmp_path, log), gpu=H100, skip_first=2).records.iloc[0]
    assert (r["measured_step_ms"], r["n_iterations"]) == (pytest.approx(1650.0), 4)


def test_nemo_errors(tmp_path: Path) -> None:
    broken = NEMO_CONFIG.replace("      num_layers: 48\n", "").replace("      hidden_size: 6144\n", "")
    with pytest.raises(DatasetError, match="model.num_layers, model.hidden_size"):
        read_nemo_log(_write(tmp_path, _nemo_log(broken, steps=NEMO_STEPS)), gpu=H100)
    with pytest.raises(DatasetError, match="no step times"):
        read_nemo_log(_write(tmp_path, _nemo_log()), gpu=H100)
    with pytest.raises(DatasetError, match="no NeMo config"):
        read_nemo_log(_write(tmp_path, "train_step_timing in s=1.0\n"), gpu=H100)
    no_vocab = _nemo_log(steps=NEMO_STEPS).replace("Padded vocab_size", "Unpadded")
    with pytest.raises(DatasetError, match="vocab size"):
        read_nemo_log(_write(tmp_path, no_vocab), gpu=H100)
    r = read_nemo_log(_write(tmp_path, no_vocab), gpu=H100, vocab_size=32000).records.iloc[0]
    assert r["vocab_size"] == 32000


def test_parse_simple_yaml() -> None:
    cfg = parse_simple_yaml(["a:", "  b: 1", "  c:", "    d: true", "  - item", "e: 'x y'  # note", "f: null"])
    assert cfg == {"a": {"b": 1, "c": {"d": True}}, "e": "x y", "f": None}
