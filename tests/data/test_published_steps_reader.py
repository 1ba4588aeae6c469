"""Tests of perfcast.data.readers.published_steps on an inline fixture and on the real shared file."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest
from fixtures.shared import shared_file

from perfcast.data.readers.published_steps import (
    GPU_STAND_INS,
    PACKED_DOCUMENT_TOKENS,
    PRESET_FILLS,
    PRESET_MODELS,
    PRESET_STATED_COLUMNS,
    SOURCE_TABLES,
    read_published_steps,
    source_table,
)
from perfcast.data.records import REASON_COLUMN
from perfcast.data.sources import detect_reader, read_source
from perfcast.data.tables import RUN_COLUMNS
from perfcast.data.validate import check_run_records
from perfcast.errors import DatasetError
from perfcast.features.hardware import resolve_gpu_name

REAL_NAME = "published_llm_training_steps.csv"

HEADER = (
    "source,source_commit,source_path,model,num_layers,hidden_size,num_heads,num_kv_heads,ffn_hidden_size,"
    "vocab_size,seq_len,num_experts,top_k,tp,pp,dp,cp,ep,vpp,micro_batch,global_batch,sequence_parallel,"
    "zero_stage,recompute,finetune,lora_rank,dtype,gpu,num_gpus,gpus_per_node,measured_step_ms,"
    "measured_tokens_per_s_per_gpu,measured_tflops_per_gpu,measured_mfu,notes"
)
_NEMO = '"NeMo performance summary (NeMo 24.07, DGX-H100)",c1,docs/perf.md'
_TITAN = "PyTorch torchtitan performance docs,c2,benchmarks/b.md"
_AUTO = '"NeMo AutoModel performance summary (PyTorch backend, DGX-H100, BF16)",c3,docs/p.mdx'
ROWS = [
    # 0: GPT3-175B, vocab not stated -> filled from the preset; step derived in the file
    _NEMO + ",gpt3-175b,96,12288,96,96,49152,,2048,,,4,8,4,1,,6,1,256,,,,,,fp8,H100 80GB,128,8,"
    "5720.67,716.0,771.0,,vocab not stated; step_ms derived from tokens/s",
    # 1: step time empty, tokens/s given -> the reader derives it
    _TITAN + ",llama3.1-8b,32,4096,32,8,14336,128256,8192,,,1,1,8,1,,,2,16,,3,selective,,,bf16,"
    '"A100 SXM 80GB",8,8,,5762.0,,,eager',
    # 2: printed step time, sft, MoE columns
    _AUTO + ",qwen3-30b-a3b,48,2048,32,4,768,151936,4096,128,8,1,1,8,1,8,1,4,512,,3,,sft,,bf16,"
    "H100 80GB,8,8,21773.0,12040.0,277.0,0.31,measured: time per global step",
    # 3: a model shape the source does not state (no preset either)
    _AUTO + ",nemotron-3-nano,,,,,,,4096,,,1,1,8,1,8,1,4,512,,3,,,,bf16,H100 80GB,8,8,15614.0,,,,shape not stated",
    # 4: TFLOP/s only, no time; a table SOURCE_TABLES does not list; a model that is not a preset
    "Some New Table (v2),c4,README.md,acme-7b,32,4096,32,32,11008,32000,4096,,,1,1,8,1,,,4,32,,3,,,,bf16,"
    "H100 80GB,8,8,,,492.0,,only TFLOP/s",
    # 5: garbage in a number column -> rejected by the reader
    _TITAN + ",llama3.1-8b,32,4096,32,8,14336,128256,8192,,,x,1,8,1,,,2,16,,3,,,,bf16,H100 80GB,8,8,100.0,,,,bad tp",
]


def _write(tmp_path: Path, rows: list[str] = ROWS, header: str = HEADER) -> Path:
    path = tmp_path / "published_llm_training_steps.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_fixture_maps_one_record_per_row(tmp_path: Path) -> None:
    result = read_published_steps(_write(tmp_path))
    assert (result.n_records, result.n_rejected) == (5, 1)
    assert result.rejected["source_row"].tolist() == [5]
    assert result.rejected[REASON_COLUMN].iloc[0] == "tp='x' is not a number"
    rec = result.records
    assert list(rec.columns[: len(RUN_COLUMNS)]) == list(RUN_COLUMNS)
    assert rec["source_row"].tolist() == [0, 1, 2, 3, 4]
    assert rec["source"].tolist() == [
        "published:nemo-24.07",
        "published:torchtitan",
        "published:nemo-automodel",
        "published:nemo-automodel",
        "published:some-new-table-v2",
    ]
    assert rec["framework"].tolist()[:4] == ["megatron-core", "torchtitan", "pytorch-fsdp", "pytorch-fsdp"]
    assert pd.isna(rec["framework"].iloc[4])
    assert rec["source_text"].iloc[0] == "NeMo performance summary (NeMo 24.07, DGX-H100)"
    assert (rec["timing_scope"] == "step").all()


def test_fixture_times_and_their_basis(tmp_path: Path) -> None:
    rec = read_published_steps(_write(tmp_path)).records
    assert rec["measured_step_ms"].iloc[0] == pytest.approx(5720.67)
    assert rec["measured_step_ms"].iloc[1] == pytest.approx(16 * 8192 / (5762.0 * 8) * 1000)
    assert rec["measured_step_ms"].iloc[2] == pytest.approx(21773.0)
    assert pd.isna(rec["measured_step_ms"].iloc[4])
    assert rec["step_ms_basis"].tolist()[:4] == ["tokens_per_s", "tokens_per_s_by_reader", "printed", "printed"]
    assert pd.isna(rec["step_ms_basis"].iloc[4])
    assert rec["measured_tflops_per_gpu"].iloc[4] == pytest.approx(492.0)
    assert rec["measured_mfu"].iloc[2] == pytest.approx(0.31)


def test_fixture_keeps_unstated_fields_empty(tmp_path: Path) -> None:
    rec = read_published_steps(_write(tmp_path)).records
    assert rec["vocab_size"].iloc[0] == 50257 and rec["defaulted_fields"].iloc[0] == "vocab_size"
    assert rec["defaulted_fields"].iloc[1] == "recompute"  # torchtitan's selective, its option unstated
    assert (rec["defaulted_fields"].iloc[2:] == "").all()
    nano = rec.iloc[3]
    assert all(pd.isna(nano[c]) for c in ("num_layers", "hidden_size", "num_heads", "vocab_size"))
    assert pd.isna(rec["ep"].iloc[0]) and pd.isna(rec["vpp"].iloc[1]) and pd.isna(rec["lora_rank"]).all()
    assert pd.isna(rec["finetune"].iloc[0]) and rec["finetune"].iloc[2] == "sft"
    assert rec["sequence_parallel"].isna().all()
    # a row naming a preset leaves the columns the preset states to it; its layout stays
    assert all(pd.isna(rec[c].iloc[2]) for c in PRESET_STATED_COLUMNS) and rec["ep"].iloc[2] == 8
    assert rec["ffn_hidden_size"].iloc[4] == 11008  # not a preset: as given
    assert rec["model_name"].tolist()[2] == "qwen3-30b-a3b" and rec["notes"].iloc[1] == "eager"


def test_torchtitan_rows_read_its_checkpointing_and_compile(tmp_path: Path) -> None:
    """torchtitan's selective checkpointing is op-sac, named where the notes do not say the op-level
    policy; eager / torch.compile is read from the notes (async TP is not)."""
    shape = ",llama3.1-8b,32,4096,32,8,14336,128256,8192,,,{tp},1,8,1,,,2,16,,3,{rc},,,bf16,H100 80GB,{n},8,100.0,,,,"
    rows = [
        _TITAN + shape.format(tp=8, rc="selective", n=64) + "async TP; torch.compile; per-op SAC",
        _TITAN + shape.format(tp=8, rc="full", n=64) + "vanilla TP; eager",
        _TITAN + shape.format(tp=1, rc="selective", n=8) + "selective layer AC",
        _NEMO + shape.format(tp=8, rc="selective", n=64) + "async TP; eager",  # not torchtitan: as given
    ]
    rec = read_published_steps(_write(tmp_path, rows)).records
    assert rec["recompute"].tolist() == ["op-sac", "full", "op-sac", "selective"]
    assert "tp_comm_overlap" not in rec
    assert rec["torch_compile"].tolist()[:2] == [True, False] and rec["torch_compile"].iloc[2:].isna().all()
    assert rec["defaulted_fields"].tolist() == ["", "", "recompute", ""]


def test_fixture_stand_in_gpu_and_pipeline_microbatches(tmp_path: Path) -> None:
    """A listed board reads as its stand-in part; torchtitan 1F1B rows without a microbatch get its default."""
    board = next(iter(GPU_STAND_INS))
    rows = [
        # global batch 256 over dp 8 and pp 8 -> 4 sequences per pipeline microbatch
        _TITAN + f",llama3.1-8b,32,4096,32,8,14336,128256,8192,,,1,8,8,1,,1,,256,,3,,,,bf16,\"{board}\",64,8,"
        "4096.0,,,,1F1B",
        # interleaved stages unstated (vpp empty): left empty
        _TITAN + ",llama3.1-8b,32,4096,32,8,14336,128256,8192,,,1,8,8,1,,,,256,,3,,,,bf16,H100 80GB,64,8,"
        "4096.0,,,,interleaved",
        # not torchtitan: left empty
        _NEMO + ",llama3.1-8b,32,4096,32,8,14336,128256,8192,,,1,8,8,1,,1,,256,,3,,,,bf16,H100 80GB,64,8,"
        "4096.0,,,,1F1B",
        # 100 sequences over dp 8 and pp 8 do not split evenly: left empty
        _TITAN + ",llama3.1-8b,32,4096,32,8,14336,128256,8192,,,1,8,8,1,,1,,100,,3,,,,bf16,H100 80GB,64,8,"
        "4096.0,,,,1F1B",
        # a stated microbatch is kept
        _TITAN + ",llama3.1-8b,32,4096,32,8,14336,128256,8192,,,1,8,8,1,,1,2,256,,3,,,,bf16,H100 80GB,64,8,"
        "4096.0,,,,1F1B",
    ]
    rec = read_published_steps(_write(tmp_path, rows)).records
    assert rec["micro_batch"].iloc[0] == 4 and rec["micro_batch"].iloc[1:4].isna().all()
    assert rec["micro_batch"].iloc[4] == 2
    assert rec["defaulted_fields"].tolist() == ["micro_batch;gpu", "", "", "", ""]
    assert (rec["gpu"].iloc[0], rec["device_name"].iloc[0]) == (GPU_STAND_INS[board], board)
    for part in set(GPU_STAND_INS.values()):
        assert resolve_gpu_name(part) == part


def test_fixture_expert_parallel_kernels_without_an_ep(tmp_path: Path) -> None:
    """An MoE row listing DeepEP with ep 1 ran expert parallelism: the largest ep dividing dp * cp and the
    experts, named as defaulted."""
    row = (
        _AUTO + ",gpt-oss-120b,36,2880,64,8,2880,201088,4096,{experts},4,1,1,64,1,{ep},1,2,512,,3,,,,bf16,"
        "H100 80GB,64,8,4300.0,,,,{note}"
    )
    rows = [
        row.format(experts=128, ep=1, note="kernels: TE + DeepEP"),  # -> 64
        row.format(experts=128, ep=1, note="kernels: TE"),  # no expert-parallel kernels: as given
        row.format(experts=128, ep=8, note="kernels: TE + DeepEP"),  # stated: as given
        row.format(experts=96, ep=1, note="kernels: TE + DeepEP"),  # 32 divides both 64 and 96
        row.format(experts=63, ep=1, note="kernels: TE + DeepEP"),  # nothing above 1 divides 64 and 63
        row.format(experts="", ep=1, note="kernels: TE + DeepEP"),  # experts not stated: as given
    ]
    rec = read_published_steps(_write(tmp_path, rows)).records
    assert rec["ep"].tolist() == [64, 1, 8, 32, 1, 1]
    assert rec["defaulted_fields"].tolist() == ["ep", "", "", "ep", "", ""]


def test_fixture_model_names(tmp_path: Path) -> None:
    rec = read_published_steps(_write(tmp_path)).records
    assert rec["model_name"].tolist() == ["gpt3-175b", "llama3.1-8b", "qwen3-30b-a3b", "nemotron-3-nano", "acme-7b"]
    # presets stay; a non-preset name with its shape spelled out leaves ``model``; one without a shape keeps it
    assert rec["model"].tolist()[:4] == ["gpt3-175b", "llama3.1-8b", "qwen3-30b-a3b", "nemotron-3-nano"]
    assert pd.isna(rec["model"].iloc[4])


def test_fixture_through_the_record_checks(tmp_path: Path) -> None:
    checked = check_run_records(read_published_steps(_write(tmp_path)).records, resolve_gpu=resolve_gpu_name)
    assert checked.records["source_row"].tolist() == [0, 1, 2]  # sft is full-parameter fine-tuning
    assert checked.records["gpu"].tolist()[:2] == ["h100-sxm5-80gb", "a100-sxm4-80gb"]
    assert checked.records["device_name"].tolist()[:2] == ["H100 80GB", "A100 SXM 80GB"]
    assert checked.records["finetune"].tolist()[2] == "sft"
    reasons = dict(zip(checked.rejected["source_row"], checked.rejected[REASON_COLUMN], strict=True))
    assert "num_layers must be a positive integer" in reasons[3]
    assert "no measured time" in reasons[4]


def test_missing_columns_raise(tmp_path: Path) -> None:
    path = _write(tmp_path, [], HEADER.replace(",measured_mfu", ""))
    with pytest.raises(DatasetError, match="measured_mfu"):
        read_published_steps(path)


def test_registered_by_file_name() -> None:
    assert detect_reader("published_llm_training_steps.csv").name == "published-steps"


def test_source_table_falls_back_to_a_slug() -> None:
    for needle, source_id, framework in SOURCE_TABLES:
        assert source_table(f"x {needle} y") == (source_id, framework)
    assert source_table("Vendor X: New Table / 2026") == ("published:vendor-x-new-table-2026", None)


@pytest.mark.parametrize("model", sorted(PRESET_FILLS))
def test_preset_fills_match_the_presets(model: str) -> None:
    text = resources.files("perfcast.features.catalog.models").joinpath(f"{model}.json").read_text()
    preset = json.loads(text)
    for field, value in PRESET_FILLS[model].items():
        assert preset[field] == value, field


def test_preset_models_are_the_presets() -> None:
    from perfcast.features.model_presets import list_models

    assert sorted(PRESET_MODELS) == list_models()


@pytest.mark.shared_data
def test_real_file() -> None:
    result = read_published_steps(shared_file(REAL_NAME))
    assert (result.n_records, result.n_rejected) == (307, 0)
    rec = result.records
    assert rec["source"].value_counts().to_dict() == {
        "published:llm-foundry": 216,
        "published:torchtitan": 43,
        "published:nemo-24.07": 18,
        "published:nemo-automodel": 16,
        "published:nemo-24.03-long-seq": 9,
        "published:maxtext": 5,
    }
    assert rec["framework"].value_counts().to_dict() == {
        "pytorch-fsdp": 232,
        "torchtitan": 43,
        "megatron-core": 27,
        "maxtext": 5,
    }
    assert rec["step_ms_basis"].value_counts().to_dict() == {"tokens_per_s": 286, "printed": 16}
    timed = rec[rec["measured_tokens_per_s_per_gpu"].notna()]
    from_tps = timed["global_batch"] * timed["seq_len"] / (timed["measured_tokens_per_s_per_gpu"] * timed["num_gpus"])
    assert (timed["measured_step_ms"] / (from_tps * 1000)).between(0.99, 1.01).all()
    defaulted = rec.set_index("model")["defaulted_fields"]
    assert defaulted[defaulted.str.contains("vocab_size")].index.tolist() == ["gpt3-175b", "gpt3-175b"]
    stand_in = rec["device_name"].isin(GPU_STAND_INS)
    assert stand_in.sum() == 33 and (rec.loc[stand_in, "gpu"] == "h100-sxm5-80gb").all()
    assert rec.loc[stand_in, "defaulted_fields"].str.endswith("gpu").all()
    assert rec["defaulted_fields"].str.contains("micro_batch").sum() == 5  # torchtitan 1F1B PP rows
    expert_parallel = rec["defaulted_fields"].str.split(";").map(lambda names: "ep" in names)
    assert rec.loc[expert_parallel, "model_name"].tolist() == ["gpt-oss-20b", "gpt-oss-120b"]
    assert rec.loc[expert_parallel, "ep"].tolist() == [8, 64]
    packed = rec["document_tokens"].notna()
    assert set(rec.loc[packed, "finetune"]) == {"sft", "lora"} and packed.sum() == 6  # NeMo 24.07 on SQuAD
    assert rec.loc[packed, "defaulted_fields"].str.contains("document_tokens").all()
    moved = rec["model"].isna() & rec["model_name"].notna()
    assert moved.sum() > 200 and not rec.loc[moved, "model_name"].isin(PRESET_MODELS).any()  # mpt-7b ...
    assert (rec["tp"] * rec["pp"] * rec["dp"] * rec["cp"] == rec["num_gpus"]).all()

    # schema checks without GPU resolution: what the rows themselves lack
    checked = check_run_records(rec)
    reasons = checked.rejected[REASON_COLUMN]
    assert (checked.n_records, checked.n_rejected) == (296, 11)
    assert reasons.str.contains("micro_batch must be a positive integer").sum() == 1  # torchtitan interleaved PP
    assert reasons.str.contains("no measured time").sum() == 5  # MaxText: TFLOP/s only
    assert "sft" in set(checked.records["finetune"])  # full-parameter fine-tuning: accepted
    assert reasons.str.contains("vocab_size must be a positive integer").sum() == 5  # 3 without a shape, 2 vocab


@pytest.mark.shared_data
def test_packed_document_tokens_are_what_nemos_flop_counts_imply() -> None:
    """NeMo's FLOPs per token (TFLOP/s over tokens/s) solved for the attention length: the
    pre-training rows give back their seq_len, the SQuAD rows at most PACKED_DOCUMENT_TOKENS."""
    from perfcast.features.model import TransformerSpec

    rec = read_published_steps(shared_file(REAL_NAME)).records
    nemo = rec[(rec["source"] == "published:nemo-24.07") & (rec["finetune"].isna() | (rec["finetune"] == "sft"))]
    implied = {}
    for row in nemo.itertuples():
        if row.model not in PRESET_MODELS or row.vocab_size != TransformerSpec.from_name(row.model).vocab_size:
            continue
        model = TransformerSpec.from_name(row.model)
        per_token = row.measured_tflops_per_gpu * 1e12 / row.measured_tokens_per_s_per_gpu
        slope = model.flops_per_token(2) - model.flops_per_token(1)
        implied[(row.model, row.finetune)] = 1 + (per_token - model.flops_per_token(1)) / slope
    pretraining = {k: v for k, v in implied.items() if k[1] is None}
    sft = [v for k, v in implied.items() if k[1] == "sft"]
    assert len(pretraining) >= 4 and len(sft) == 3
    for (name, _), tokens in pretraining.items():
        assert tokens == pytest.approx(TransformerSpec.from_name(name).seq_len, rel=0.01), name
    assert round(max(sft)) == PACKED_DOCUMENT_TOKENS["SQuAD-v1.1 packed"]


@pytest.mark.shared_data
def test_real_file_through_read_source() -> None:
    loaded = read_source(shared_file(REAL_NAME), resolve_gpu=resolve_gpu_name)
    assert loaded.kind == "runs" and loaded.n_read == 307
    assert len(loaded.records) + len(loaded.rejected) == 307
    assert all(resolve_gpu_name(gpu) == gpu for gpu in set(loaded.records["gpu"]))  # catalog ids
    # every spelling the catalog resolves today is accepted unless the row lacks a field
    assert len(loaded.records) >= 85


@pytest.mark.shared_data
def test_real_file_non_preset_rows_parse() -> None:
    from perfcast.features.run_config import parse_run_row

    loaded = read_source(shared_file(REAL_NAME), resolve_gpu=resolve_gpu_name)
    mpt = loaded.records[loaded.records["model_name"] == "mpt-7b"]
    config = parse_run_row(mpt.iloc[0].to_dict())
    assert config.model.num_layers == mpt["num_layers"].iloc[0]


@pytest.mark.shared_data
def test_real_rows_naming_a_preset_agree_with_it() -> None:
    """What the file states of a preset-named row's shape is what the preset states: the required
    columns equal, the columns left to the preset equal or the flat reading the file's notes give
    (the routed experts' FFN as ``ffn_hidden_size``, latent attention's heads as ``num_kv_heads``)."""
    from perfcast.features.model import TransformerSpec

    raw = pd.read_csv(shared_file(REAL_NAME))
    named = raw[raw["model"].isin(PRESET_MODELS) & raw["num_layers"].notna()]
    assert named["model"].nunique() >= 15 and {"deepseek-v3", "gpt-oss-120b", "qwen3-30b-a3b"} <= set(named["model"])
    for row in named.itertuples():
        spec = TransformerSpec.from_name(row.model)
        stated = {"num_layers": spec.num_layers, "hidden_size": spec.hidden_size, "num_heads": spec.num_heads}
        assert {k: getattr(row, k) for k in stated} == stated, row.model
        assert pd.isna(row.vocab_size) or row.vocab_size == spec.vocab_size, row.model
        assert pd.isna(row.ffn_hidden_size) or row.ffn_hidden_size in (spec.ffn_size, spec.expert_ffn_size), row.model
        assert pd.isna(row.num_kv_heads) or row.num_kv_heads == (spec.num_heads if spec.mla else spec.kv_heads)
        assert pd.isna(row.num_experts) or (row.num_experts, row.top_k) == (spec.num_experts, spec.top_k), row.model


@pytest.mark.shared_data
def test_automodel_flop_counts_match_the_presets() -> None:
    """NeMo AutoModel's FLOPs per token (its TFLOP/s over its tokens/s) against the presets' count with
    causal attention (half the score and context FLOPs, as AutoModel counts them): the fine-grained MoE
    presets (latent attention, shared experts, dense first layers, 128-wide Qwen3 heads) reproduce the
    source's own count, which the file's flat shape columns do not."""
    from perfcast.features.model import TransformerSpec

    rec = read_published_steps(shared_file(REAL_NAME)).records
    auto = rec[(rec["source"] == "published:nemo-automodel") & rec["model"].isin(PRESET_MODELS)]
    auto = auto[auto["finetune"].isna()]
    ratios = {}
    for row in auto.itertuples():
        spec, seq = TransformerSpec.from_name(row.model), int(row.seq_len)
        attention = (spec.flops_per_token(seq) - spec.flops_per_token(1)) * seq / (seq - 1)
        causal = spec.flops_per_token(seq) - attention / 2
        ratios[row.model] = row.measured_tflops_per_gpu * 1e12 / row.measured_tokens_per_s_per_gpu / causal
    assert {"deepseek-v3", "kimi-k2", "qwen3-30b-a3b", "gpt-oss-20b", "gpt-oss-120b", "llama3-70b"} <= set(ratios)
    for model in ("kimi-k2", "qwen3-30b-a3b", "llama3-70b"):
        assert ratios[model] == pytest.approx(1.0, abs=0.01), model
    assert ratios["deepseek-v3"] == pytest.approx(0.96, abs=0.01)  # 0.997 without the MTP module: see docs/readers.md
    for model in ("gpt-oss-20b", "gpt-oss-120b"):  # windowed layers: AutoModel's count is not stated
        assert 0.9 < ratios[model] < 1.0, model


def test_torchtitan_fp8_rows_read_their_scaling_recipe(tmp_path: Path) -> None:
    shape = ",llama3.1-8b,32,4096,32,8,14336,128256,8192,,,8,1,8,1,,,2,16,,3,none,,,{dt},H100 80GB,64,8,100.0,,,,"
    rows = [
        _TITAN + shape.format(dt="fp8") + "vanilla TP; quantization float8 rowwise; torch.compile",
        _TITAN + shape.format(dt="fp8") + '"torch.compile + Float8 (tensorwise, fp8 FSDP all-gather)"',
        _TITAN + shape.format(dt="fp8") + "torch.compile + Float8",  # no recipe stated: the dtype's default
        _TITAN + shape.format(dt="bf16") + "quantization float8 rowwise",  # not an fp8 run: no recipe
        _NEMO + shape.format(dt="fp8") + "float8 rowwise",  # not torchtitan: as given
    ]
    recipes = read_published_steps(_write(tmp_path, rows)).records["fp8_recipe"].tolist()
    assert recipes[:2] == ["rowwise", "tensorwise"] and all(pd.isna(r) for r in recipes[2:])
