"""Tests of perfcast.features.model: counts against published figures, FLOPs, loaders."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from perfcast.errors import SpecError, UnknownEntryError
from perfcast.features.model import (
    Activation,
    NormType,
    PositionEmbedding,
    TransformerSpec,
    list_models,
)

# ---------------------------------------------------------------------- catalog

REQUIRED_PRESETS = {
    "gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b",
    "gpt3-13b", "gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b",
    "llama3-70b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "mixtral-8x7b",
    "mixtral-8x22b", "qwen2.5-7b", "qwen2.5-72b",
}  # fmt: skip


def test_list_models_has_required_presets() -> None:
    models = list_models()
    assert REQUIRED_PRESETS <= set(models)
    assert models == sorted(models)


@pytest.mark.parametrize("model_id", list_models())
def test_every_preset_loads_and_validates(model_id: str) -> None:
    spec = TransformerSpec.from_name(model_id)
    assert spec.name == model_id
    assert spec.num_params > 0
    assert 0 < spec.num_active_params <= spec.num_params
    assert spec.flops_per_token() > 0


def test_preset_files_carry_metadata() -> None:
    from importlib import resources

    root = resources.files("perfcast.features").joinpath("catalog", "models")
    for model_id in list_models():
        data = json.loads(root.joinpath(f"{model_id}.json").read_text(encoding="utf-8"))
        assert data["schema_version"] == 1
        assert data["id"] == model_id
        assert data["source"]
        assert model_id == model_id.lower() and " " not in model_id and "_" not in model_id


def test_from_name_is_cached_and_tolerant() -> None:
    assert TransformerSpec.from_name("llama2-7b") is TransformerSpec.from_name("LLAMA2_7B")
    assert TransformerSpec.from_name(" Llama-2-7B ").name == "llama2-7b"
    assert TransformerSpec.from_name("gpt3_1.3b").name == "gpt3-1.3b"


def test_from_name_unknown_suggests_close_matches() -> None:
    with pytest.raises(UnknownEntryError) as info:
        TransformerSpec.from_name("lama2-7b")
    msg = str(info.value)
    assert "'lama2-7b'" in msg
    assert "llama2-7b" in msg
    assert msg.count(",") <= 2  # at most three suggestions
    assert isinstance(info.value, SpecError) and isinstance(info.value, KeyError)


# ---------------------------------------------------------------------- published counts

# (preset, published total parameters, relative tolerance). Exact figures are the sums of
# the Hugging Face checkpoints' tensors; rounded ones are model-card / paper figures.
PUBLISHED_TOTALS = [
    ("llama2-7b", 6_738_415_616, 0.0),
    ("llama2-13b", 13_015_864_320, 0.0),
    ("llama2-70b", 68_976_648_192, 0.0),
    ("llama3-8b", 8_030_261_248, 0.0),
    ("llama3-70b", 70_553_706_496, 0.0),
    ("llama3.1-405b", 405_853_388_800, 0.0),
    ("mixtral-8x7b", 46_702_792_704, 0.0),
    ("mixtral-8x22b", 140.6e9, 0.01),
    ("qwen2.5-7b", 7.62e9, 0.01),  # 7,615,616,512 with Q/K/V biases
    ("qwen2.5-72b", 72.7e9, 0.01),
    ("gpt3-175b", 175.0e9, 0.01),
    ("gpt3-1.3b", 1.3e9, 0.015),  # paper rounds 1.316B to "1.3B"
    ("gpt3-125m", 125.0e6, 0.01),
    ("gpt3-6.7b", 6.7e9, 0.01),
]


@pytest.mark.parametrize(("model_id", "published", "rel"), PUBLISHED_TOTALS)
def test_num_params_matches_published(model_id: str, published: float, rel: float) -> None:
    spec = TransformerSpec.from_name(model_id)
    if rel == 0.0:
        assert spec.num_params == published
    else:
        assert spec.num_params == pytest.approx(published, rel=rel)


def test_qwen_undercount_is_only_qkv_biases() -> None:
    spec = TransformerSpec.from_name("qwen2.5-7b")
    qkv_biases = spec.num_layers * (spec.num_heads + 2 * spec.kv_heads) * spec.head_size
    assert spec.num_params + qkv_biases == 7_615_616_512


@pytest.mark.parametrize(
    ("model_id", "active", "rel"),
    [("mixtral-8x7b", 12.9e9, 0.005), ("mixtral-8x22b", 39.1e9, 0.005)],
)
def test_moe_active_params(model_id: str, active: float, rel: float) -> None:
    spec = TransformerSpec.from_name(model_id)
    assert spec.is_moe and spec.num_moe_layers == spec.num_layers
    assert spec.num_active_params == pytest.approx(active, rel=rel)


def test_gpt2_small_counts_exactly() -> None:
    # openai-community/gpt2 has 124,439,808 parameters (tied LM head).
    spec = TransformerSpec(
        num_layers=12, hidden_size=768, num_heads=12, vocab_size=50257,
        seq_len=1024, max_position_embeddings=1024, tied_embeddings=True,
    )  # fmt: skip
    assert spec.num_params == 124_439_808
    assert spec.output_params == 0
    assert spec.embedding_params == (50257 + 1024) * 768


def test_components_add_up() -> None:
    spec = TransformerSpec.from_name("llama2-70b")
    h, f = spec.hidden_size, spec.ffn_size
    assert spec.attention_params_per_layer == 2 * h * h + 2 * h * 8 * 128
    assert spec.mlp_params_per_layer == 3 * h * f
    assert spec.norm_params_per_layer == 2 * h
    assert spec.num_params_per_layer() == (
        spec.attention_params_per_layer + spec.mlp_params_per_layer + spec.norm_params_per_layer
    )
    assert spec.num_params == (
        spec.embedding_params
        + spec.num_layers * spec.num_params_per_layer()
        + spec.final_norm_params
        + spec.output_params
    )
    with pytest.raises(SpecError, match="num_experts=1"):
        spec.num_params_per_layer(moe=True)


def test_bias_and_layernorm_counts() -> None:
    base = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=256,
                vocab_size=100, position_embedding="rope")  # fmt: skip
    with_bias = TransformerSpec(**base, bias=True, norm="layernorm")
    no_bias = TransformerSpec(**base, bias=False, norm="rmsnorm")
    hd, h, f = 16, 64, 256
    assert with_bias.attention_params_per_layer - no_bias.attention_params_per_layer == (4 * hd + 2 * 2 * hd + h)
    assert with_bias.mlp_params_per_layer - no_bias.mlp_params_per_layer == f + h
    assert with_bias.norm_params_per_layer == 4 * h and no_bias.norm_params_per_layer == 2 * h
    assert with_bias.embedding_params == 100 * h  # rope has no parameters
    gated = TransformerSpec(**base, bias=True, gated_mlp=True)
    assert gated.mlp_params_per_layer == 3 * h * f + 2 * f + h


def test_moe_layer_freq_and_router() -> None:
    spec = TransformerSpec(
        num_layers=8, hidden_size=64, num_heads=4, vocab_size=100, num_experts=4, top_k=2,
        moe_ffn_hidden_size=128, moe_layer_freq=2, bias=False, gated_mlp=True,
        ffn_hidden_size=256,
    )  # fmt: skip
    assert spec.num_moe_layers == 4 and spec.num_dense_layers == 4
    assert spec.expert_ffn_size == 128
    assert spec.moe_params_per_layer == 4 * 3 * 64 * 128 + 64 * 4
    total = (
        spec.embedding_params + spec.final_norm_params + spec.output_params
        + 4 * spec.num_params_per_layer(moe=False) + 4 * spec.num_params_per_layer(moe=True)
    )  # fmt: skip
    assert spec.num_params == total
    assert spec.num_params - spec.num_active_params == 4 * 2 * 3 * 64 * 128


def test_resolved_defaults() -> None:
    spec = TransformerSpec(num_layers=2, hidden_size=4096, num_heads=32, vocab_size=1000)
    assert spec.kv_heads == 32 and spec.head_size == 128 and spec.ffn_size == 4 * 4096
    assert spec.expert_ffn_size == spec.ffn_size and not spec.is_moe and spec.num_moe_layers == 0
    gated = spec.model_copy(update={"gated_mlp": True})
    assert gated.ffn_size == 10880  # Megatron-LM SwiGLU default
    assert TransformerSpec(num_layers=2, hidden_size=3072, num_heads=16, head_dim=256,
                     vocab_size=10).head_size == 256  # fmt: skip


# ---------------------------------------------------------------------- FLOPs


def _narayanan_per_token(L: int, h: int, s: int, V: int) -> float:
    # Narayanan et al. 2021: 72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)) per iteration, no
    # recomputation; per token divide by B·s.
    return 72.0 * L * h**2 * (1 + s / (6 * h) + V / (12 * h * L))


@pytest.mark.parametrize("model_id", ["gpt3-175b", "gpt3-1.3b", "gpt3-6.7b"])
def test_flops_match_narayanan_closed_form(model_id: str) -> None:
    spec = TransformerSpec.from_name(model_id)
    L, h, s, V = spec.num_layers, spec.hidden_size, spec.seq_len, spec.vocab_size
    closed = _narayanan_per_token(L, h, s, V)
    assert spec.flops_per_token() == pytest.approx(closed, rel=0.005)
    # and 6N + 12·L·s·h with N the non-embedding matmul weights plus the LM head
    assert spec.flops_per_token() == pytest.approx(6 * spec.num_matmul_params + 12 * L * s * h)


def test_flops_forward_only_is_a_third_and_seq_len_override() -> None:
    spec = TransformerSpec.from_name("llama3-8b")
    assert spec.flops_per_token(training=False) == pytest.approx(spec.flops_per_token() / 3)
    attn_delta = 12 * spec.num_layers * 1024 * spec.num_heads * spec.head_size
    assert spec.flops_per_token(9216) - spec.flops_per_token() == pytest.approx(attn_delta)
    with pytest.raises(SpecError, match="seq_len=0"):
        spec.flops_per_token(0)
    with pytest.raises(SpecError, match="seq_len=True"):
        spec.flops_per_token(True)  # type: ignore[arg-type]
    assert spec.flops_per_token(np.int64(8192)) == spec.flops_per_token()


def test_moe_flops_count_only_active_experts() -> None:
    spec = TransformerSpec.from_name("mixtral-8x7b")
    dense_twin = spec.model_copy(update={"num_experts": 1, "top_k": 1})
    h, f = spec.hidden_size, spec.ffn_size
    extra = spec.num_layers * (3 * h * f + h * spec.num_experts)  # 2nd expert + router
    assert spec.flops_per_token() - dense_twin.flops_per_token() == pytest.approx(6 * extra)
    # about 6 · active non-embedding parameters + attention
    non_embed_active = spec.num_active_params - spec.embedding_params
    assert spec.flops_per_token(1) == pytest.approx(6 * non_embed_active, rel=0.001)


# ---------------------------------------------------------------------- validation

BASE = dict(num_layers=4, hidden_size=4096, num_heads=32, vocab_size=32000)


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"num_kv_heads": 3}, "num_kv_heads=3 does not divide num_heads=32"),
        ({"hidden_size": 4000, "num_heads": 48}, "num_heads=48 does not divide hidden_size=4000"),
        ({"num_experts": 4, "top_k": 5}, "top_k=5 exceeds num_experts=4"),
        ({"top_k": 2}, "top_k=2 exceeds num_experts=1"),
        ({"num_experts": 4, "moe_layer_freq": 3}, "moe_layer_freq=3 does not divide num_layers=4"),
        ({"seq_len": 4096, "max_position_embeddings": 2048}, "seq_len=4096 exceeds"),
    ],
)
def test_validation_errors_name_field_and_value(update: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TransformerSpec(**{**BASE, **update})
    with pytest.raises(SpecError, match=message):
        TransformerSpec.from_dict({**BASE, **update})


def test_field_constraints_and_frozen() -> None:
    with pytest.raises(SpecError, match="num_layers=0"):
        TransformerSpec.from_dict({**BASE, "num_layers": 0})
    with pytest.raises(SpecError, match="num_layer: unknown field"):
        TransformerSpec.from_dict({**BASE, "num_layer": 4})
    with pytest.raises(SpecError, match="activation='swiglu'"):
        TransformerSpec.from_dict({**BASE, "activation": "swiglu"})
    with pytest.raises(SpecError, match="schema_version=2"):
        TransformerSpec.from_dict({**BASE, "schema_version": 2})
    spec = TransformerSpec(**BASE)
    with pytest.raises(ValidationError):
        spec.num_layers = 8  # type: ignore[misc]
    assert TransformerSpec(**{**BASE, "hidden_size": 4000}, head_dim=100).head_size == 100
    assert TransformerSpec(**BASE, num_experts=1, top_k=1).num_active_params == spec.num_params


# ---------------------------------------------------------------------- files


def test_from_file_round_trip(tmp_path) -> None:
    spec = TransformerSpec.from_name("mixtral-8x7b")
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json(), encoding="utf-8")
    assert TransformerSpec.from_file(path) == spec
    assert TransformerSpec.load(str(path)) == spec

    meta = {"schema_version": 1, "source": "mine", "id": "x", **BASE}
    path.write_text(json.dumps(meta), encoding="utf-8")
    assert TransformerSpec.from_file(path).num_layers == 4

    path.write_text(json.dumps({**BASE, "hiden_size": 1}), encoding="utf-8")
    with pytest.raises(SpecError, match="hiden_size"):
        TransformerSpec.from_file(path)
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(SpecError, match="invalid JSON"):
        TransformerSpec.from_file(path)
    with pytest.raises(SpecError, match="no such file"):
        TransformerSpec.from_file(tmp_path / "missing.json")


def test_load_dispatches(tmp_path) -> None:
    assert TransformerSpec.load("Llama2-7B") == TransformerSpec.from_name("llama2-7b")
    with pytest.raises(UnknownEntryError):
        TransformerSpec.load("not-a-model")
    with pytest.raises(SpecError, match="no such file"):
        TransformerSpec.load(str(tmp_path / "nope" / "config.json"))
    d = tmp_path / "Llama-2-7b-hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA2_7B_HF), encoding="utf-8")
    via_dir = TransformerSpec.load(str(d))
    via_file = TransformerSpec.load(str(d / "config.json"))
    assert via_dir == via_file and via_dir.num_params == 6_738_415_616
    assert via_dir.name == "Llama-2-7b-hf"
    with pytest.raises(SpecError, match="Hugging Face"):
        TransformerSpec.from_file(d / "config.json")


# ---------------------------------------------------------------------- Hugging Face configs

LLAMA2_7B_HF = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
    "torch_dtype": "float16",
}

GPT2_HF = {
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
}

MIXTRAL_HF = {
    "model_type": "mixtral",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


def test_from_hf_llama() -> None:
    spec = TransformerSpec.from_hf_config(LLAMA2_7B_HF)
    assert spec.num_params == 6_738_415_616
    assert spec.norm is NormType.RMSNORM and spec.activation is Activation.SILU
    assert spec.gated_mlp and not spec.bias and not spec.tied_embeddings
    assert spec.position_embedding is PositionEmbedding.ROPE
    assert spec.seq_len == 4096  # min(max_position_embeddings, 4096)
    assert TransformerSpec.from_hf_config(LLAMA2_7B_HF, seq_len=1024).seq_len == 1024
    long_ctx = {**LLAMA2_7B_HF, "max_position_embeddings": 131072}
    assert TransformerSpec.from_hf_config(long_ctx).seq_len == 4096


def test_from_hf_gpt2() -> None:
    spec = TransformerSpec.from_hf_config(GPT2_HF)
    assert spec.num_params == 124_439_808
    assert spec.position_embedding is PositionEmbedding.LEARNED and spec.tied_embeddings
    assert spec.activation is Activation.GELU and spec.norm is NormType.LAYERNORM
    assert spec.seq_len == 1024 and spec.ffn_size == 3072


def test_from_hf_mixtral_matches_preset() -> None:
    spec = TransformerSpec.from_hf_config(MIXTRAL_HF, seq_len=32768)
    preset = TransformerSpec.from_name("mixtral-8x7b")
    assert spec.num_params == preset.num_params == 46_702_792_704
    assert spec.num_active_params == preset.num_active_params
    assert spec.flops_per_token() == preset.flops_per_token()


def test_from_hf_other_families() -> None:
    neox = TransformerSpec.from_hf_config({
        "model_type": "gpt_neox", "hidden_act": "gelu", "hidden_size": 512,
        "intermediate_size": 2048, "max_position_embeddings": 2048, "num_attention_heads": 8,
        "num_hidden_layers": 6, "vocab_size": 50304, "tie_word_embeddings": False,
    })  # fmt: skip
    assert neox.num_params == 70_426_624  # EleutherAI/pythia-70m
    falcon = TransformerSpec.from_hf_config({
        "model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
        "num_hidden_layers": 32, "vocab_size": 65024, "multi_query": True,
        "parallel_attn": True, "bias": False, "alibi": False,
    })  # fmt: skip
    assert falcon.kv_heads == 1 and falcon.seq_len == 2048
    # tiiuae/falcon-7b: 6,921,720,704; one norm per layer is counted as two
    assert falcon.num_params - 6_921_720_704 == 32 * 2 * 4544
    gemma = TransformerSpec.from_hf_config({
        "model_type": "gemma", "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 3072, "intermediate_size": 24576, "max_position_embeddings": 8192,
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 16,
        "vocab_size": 256000,
    })  # fmt: skip
    assert gemma.tied_embeddings and gemma.head_size == 256
    assert gemma.num_params == 8_537_680_896  # google/gemma-7b
    opt = TransformerSpec.from_hf_config({
        "model_type": "opt", "activation_function": "relu", "ffn_dim": 3072,
        "hidden_size": 768, "max_position_embeddings": 2048, "num_attention_heads": 12,
        "num_hidden_layers": 12, "vocab_size": 50272, "word_embed_proj_dim": 768,
    })  # fmt: skip
    # facebook/opt-125m: 125,239,296 (its position table has 2 extra rows)
    assert opt.num_params + 2 * 768 == 125_239_296
    assert opt.activation is Activation.RELU


def test_from_hf_qwen3_moe_and_unsupported() -> None:
    qwen3_moe = {
        "model_type": "qwen3_moe", "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
        "max_position_embeddings": 40960, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "tie_word_embeddings": False,
    }  # fmt: skip
    spec = TransformerSpec.from_hf_config(qwen3_moe)
    # Qwen/Qwen3-30B-A3B: 30.5B total, 3.3B active (Q/K norms, 2·128 per layer, not counted)
    assert spec.num_params == pytest.approx(30.5e9, rel=0.01)
    assert spec.num_active_params == pytest.approx(3.3e9, rel=0.02)
    shared = {**qwen3_moe, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 5632}
    assert TransformerSpec.from_hf_config(shared).shared_expert_ffn_size == 5632
    with pytest.raises(SpecError, match="kv_lora_rank"):
        TransformerSpec.from_hf_config({**qwen3_moe, "kv_lora_rank": 512})


def test_from_hf_missing_keys_and_bad_values(caplog) -> None:
    broken = {k: v for k, v in LLAMA2_7B_HF.items() if k not in ("hidden_size", "vocab_size")}
    with pytest.raises(SpecError) as info:
        TransformerSpec.from_hf_config(broken)
    assert "hidden_size" in str(info.value) and "vocab_size" in str(info.value)
    gpt2_broken = {k: v for k, v in GPT2_HF.items() if k != "n_layer"}
    with pytest.raises(SpecError, match="n_layer or num_hidden_layers"):
        TransformerSpec.from_hf_config(gpt2_broken)
    with pytest.raises(SpecError, match="hidden_act='tanhshrink'"):
        TransformerSpec.from_hf_config({**LLAMA2_7B_HF, "hidden_act": "tanhshrink"})
    with pytest.raises(SpecError, match="num_key_value_heads|num_kv_heads=5"):
        TransformerSpec.from_hf_config({**LLAMA2_7B_HF, "num_key_value_heads": 5})
    with caplog.at_level(logging.WARNING, logger="perfcast.features.hf_config"):
        spec = TransformerSpec.from_hf_config({**LLAMA2_7B_HF, "model_type": "new_llama_clone"})
    assert spec.num_params == 6_738_415_616
    assert "new_llama_clone" in caplog.text


def test_from_hf_written_file(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL_HF), encoding="utf-8")
    spec = TransformerSpec.from_hf_config(path)
    assert spec.num_experts == 8 and spec.top_k == 2 and spec.seq_len == 4096
    assert TransformerSpec.from_hf_config(str(tmp_path)) == spec
    with pytest.raises(SpecError, match="no such file"):
        TransformerSpec.from_hf_config(tmp_path / "absent.json")


# ---------------------------------------------------------------------- properties


@st.composite
def model_specs(draw: st.DrawFn) -> dict:
    num_heads = draw(st.sampled_from([1, 2, 4, 8, 16]))
    head_dim = draw(st.sampled_from([8, 16, 64]))
    kv_heads = draw(st.sampled_from([k for k in (1, 2, 4, 8, 16) if num_heads % k == 0]))
    num_experts = draw(st.sampled_from([1, 1, 2, 8]))
    freq = draw(st.sampled_from([1, 2])) if num_experts > 1 else 1
    return {
        "num_layers": freq * draw(st.integers(1, 24)),
        "hidden_size": num_heads * head_dim,
        "num_heads": num_heads,
        "num_kv_heads": kv_heads,
        "ffn_hidden_size": draw(st.one_of(st.none(), st.integers(1, 4096))),
        "vocab_size": draw(st.integers(1, 100_000)),
        "seq_len": draw(st.integers(1, 8192)),
        "gated_mlp": draw(st.booleans()),
        "norm": draw(st.sampled_from(list(NormType))),
        "position_embedding": draw(st.sampled_from(list(PositionEmbedding))),
        "tied_embeddings": draw(st.booleans()),
        "bias": draw(st.booleans()),
        "num_experts": num_experts,
        "top_k": draw(st.integers(1, num_experts)),
        "moe_layer_freq": freq,
    }


@settings(max_examples=200, deadline=None)
@given(model_specs())
def test_num_params_positive_and_monotone_in_layers(fields: dict) -> None:
    spec = TransformerSpec(**fields)
    deeper = TransformerSpec(**{**fields, "num_layers": fields["num_layers"] + fields["moe_layer_freq"]})
    assert spec.num_params > 0
    assert deeper.num_params > spec.num_params
    assert 0 < spec.num_active_params <= spec.num_params
    assert deeper.flops_per_token() > spec.flops_per_token() > 0
    if not spec.is_moe:
        assert spec.num_active_params == spec.num_params


def test_a_name_too_long_for_a_path_is_an_unknown_preset_not_an_os_error():
    from perfcast.errors import UnknownEntryError

    with pytest.raises(UnknownEntryError):
        TransformerSpec.load("x" * 5000)
