"""Hugging Face config.json families of 2025-26 (DeepSeek-V3, Kimi-K2, Qwen3-MoE, GPT-OSS, Llama-4) and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfcast.errors import SpecError
from perfcast.features.hardware import ClusterSpec
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import ParallelConfig
from perfcast.features.workload import build_workload_graph, layers_per_rank

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf_configs"


def load(name: str) -> TransformerSpec:
    return TransformerSpec.from_hf_config(FIXTURES / f"{name}.json")


@pytest.mark.parametrize(
    ("name", "total", "active", "rel"),
    [
        ("deepseek_v3", 671e9, 37e9, 0.02),  # model card: 671B total, 37B active (MTP apart)
        ("kimi_k2", 1.04e12, 32e9, 0.03),  # 1.04T total, 32B active
        ("qwen3_moe", 30.5e9, 3.3e9, 0.02),  # Qwen3-30B-A3B
        ("gpt_oss_120b", 116.83e9, 5.13e9 + 201088 * 2880, 0.01),  # card: 5.13B active without the embedding
        ("llama4_maverick", 400e9, 17e9, 0.02),  # text model
    ],
)
def test_published_parameter_counts(name, total, active, rel) -> None:
    spec = load(name)
    assert spec.num_params == pytest.approx(total, rel=rel)
    assert spec.num_active_params == pytest.approx(active, rel=rel)


def test_deepseek_v3_fields_and_layer_kinds() -> None:
    spec = load("deepseek_v3")
    assert spec.mla is not None and spec.mla.kv_lora_rank == 512 and spec.mla.qk_head_dim == 192
    assert (spec.num_dense_layers, spec.num_moe_layers, spec.first_dense_layers) == (3, 58, 3)
    assert spec.num_shared_experts == 1 and spec.shared_expert_ffn_size == 2048
    assert spec.mtp_layers == 1 and spec.num_mtp_params == pytest.approx(11.6e9, rel=0.02)
    assert spec.num_params + spec.num_mtp_params + 2 * 129280 * 7168 == pytest.approx(685e9, rel=0.01)  # HF repo
    # 6 x active matmul weights (MTP included) + attention: ~6 x 37B x 1.1
    assert 250e9 < spec.flops_per_token(4096) < 320e9


def test_gpt_oss_windows_and_sinks() -> None:
    spec = load("gpt_oss_120b")
    assert (spec.sliding_window, spec.sliding_window_layers, spec.attention_sinks, spec.bias) == (128, 18, True, True)
    full = spec.model_copy(update={"sliding_window": None, "sliding_window_layers": 0})
    assert spec.flops_per_token(8192) < full.flops_per_token(8192)
    p = ParallelConfig(tp=1, dp=8, ep=8, global_batch=8)
    graph = build_workload_graph(spec.model_copy(update={"seq_len": 8192}), p, ClusterSpec.build("h100-sxm5-80gb", 8))
    cores = graph.nodes[graph.nodes["name"].str.startswith("attn.core") & (graph.nodes["phase"] == "fwd")]
    assert set(zip(cores["name"], cores["seq_kv"], cores["heads"], strict=True)) == {
        ("attn.core", 8192, 32),
        ("attn.core_window", 127, 32),  # 128 - 128**2 / (2 * 8192) keys per query: a causal window
    }


def test_llama4_interleaved_moe_and_qwen2_shared_expert() -> None:
    spec = load("llama4_maverick")
    assert (spec.num_moe_layers, spec.num_dense_layers, spec.ffn_size, spec.expert_ffn_size) == (24, 24, 16384, 8192)
    assert spec.num_shared_experts == 1 and spec.shared_expert_ffn_size == 8192
    qwen2 = {**load_raw("qwen3_moe"), "model_type": "qwen2_moe", "shared_expert_intermediate_size": 5632}
    assert TransformerSpec.from_hf_config(qwen2).shared_expert_ffn_size == 5632


def load_raw(name: str) -> dict:
    import json

    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_workload_builds_mla_shared_experts_dense_first_and_mtp() -> None:
    spec = load("deepseek_v3").model_copy(update={"seq_len": 4096})
    p = ParallelConfig(tp=2, pp=8, dp=64, ep=64, global_batch=512, sequence_parallel=True)
    ranks = layers_per_rank(spec, p)
    assert ranks[0][0] == 3 and sum(d for d, _ in ranks) == 3  # the dense layers lead on rank 0
    assert ranks[-1][1] == sum(ranks[-1]) and sum(map(sum, ranks)) == 61 + 1  # MTP layer on the last rank
    graph = build_workload_graph(spec, p, ClusterSpec.build("h100-sxm5-80gb", 1024))
    names = set(graph.nodes["name"])
    assert {"attn.q_down", "attn.q_up", "attn.kv_down", "attn.kv_up", "moe.shared_up", "moe.shared_down",
            "mtp.proj", "moe.dispatch"} <= names  # fmt: skip
    shared = graph.nodes[graph.nodes["name"] == "moe.shared_up"].iloc[0]
    assert (shared["m"], shared["n"]) == (4096, 2 * 2048 // 2)  # every token, split over tp


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "nemotron_h", "hidden_size": 4096}, "model_type=nemotron_h: Mamba layers are not modelled"),
        ({"model_type": "jamba"}, "model_type=jamba: Mamba layers"),
        ({"model_type": "falcon_h1"}, "model_type=falcon_h1: Mamba layers"),
        ({"model_type": "brand_new", "hidden_size": 64}, "model_type='brand_new'.*num_hidden_layers"),
        ({"model_type": "deepseek_v3", "hidden_size": 64}, "kv_lora_rank.*qk_nope_head_dim"),
        ({"model_type": "qwen3_moe", "kv_lora_rank": 512}, "multi-head latent attention"),
        ({"model_type": "llama4"}, "text_config"),
    ],
)
def test_refused_families_name_the_missing_part(config, message) -> None:
    with pytest.raises(SpecError, match=message):
        TransformerSpec.from_hf_config(config)


def test_refinement_fields_are_checked() -> None:
    base = {"num_layers": 4, "hidden_size": 64, "num_heads": 4, "vocab_size": 100}
    with pytest.raises(SpecError, match="first_dense_layers=1 needs a mixture-of-experts model"):
        TransformerSpec.from_dict({**base, "first_dense_layers": 1})
    with pytest.raises(SpecError, match="sliding_window=128 and sliding_window_layers=0"):
        TransformerSpec.from_dict({**base, "sliding_window": 128})
    with pytest.raises(SpecError, match="sliding_window_layers=5 exceeds num_layers=4"):
        TransformerSpec.from_dict({**base, "sliding_window": 8, "sliding_window_layers": 5})
    with pytest.raises(SpecError, match="shared_expert_ffn_hidden_size=8 needs num_shared_experts"):
        TransformerSpec.from_dict({**base, "num_experts": 4, "shared_expert_ffn_hidden_size": 8})
