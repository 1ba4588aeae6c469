"""Hugging Face ``config.json`` to :class:`~perfcast.features.model.TransformerSpec` fields.

:func:`hf_model_fields` maps a parsed config to the spec's fields (all but ``seq_len``),
family by family (``model_type``); :meth:`TransformerSpec.from_hf_config` reads the file and
validates the result. Enum fields are returned as their string values.

Families:

- Llama-like (llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, and any
  unknown ``model_type``, with a warning): ``num_hidden_layers``, ``hidden_size``,
  ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``intermediate_size``;
  MoE from ``num_local_experts``/``num_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``, ``decoder_sparse_step``; Qwen2-MoE's shared expert from
  ``shared_expert_intermediate_size``; sliding-window layers from ``layer_types`` and
  ``sliding_window``.
- deepseek_v2, deepseek_v3, kimi_k2: multi-head latent attention (``q_lora_rank``,
  ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``),
  ``n_routed_experts``, ``n_shared_experts``, ``moe_intermediate_size``,
  ``first_k_dense_replace`` dense layers, ``moe_layer_freq``, ``num_nextn_predict_layers``.
- gpt_oss: Llama keys plus alternating sliding-window layers (``layer_types``,
  ``sliding_window``), attention sinks, biases on attention and experts.
- llama4: the ``text_config`` part: ``interleave_moe_layer_step`` MoE layers with one
  shared expert (both ``intermediate_size`` wide), dense layers ``intermediate_size_mlp``
  wide. The vision encoder and Llama-4's chunked attention are not modelled (chunked
  attention equals full attention up to ``attention_chunk_size`` tokens).
- gpt2, gpt_neox, opt: LayerNorm decoders, each family's keys in one table
  (:data:`_LAYERNORM_FAMILIES`); falcon: its own keys.

Refused with a :class:`~perfcast.errors.SpecError`: Mamba hybrids (nemotron_h, jamba,
falcon_h1, ...), MLA keys on a family that has none, dense layers at arbitrary positions
(``mlp_only_layers``), and missing keys (all named, with the ``model_type``).

``bias`` is True only when all attention and MLP projections have biases; partial biases
(Qwen2's Q/K/V biases, Llama's ``attention_bias`` without ``mlp_bias``) are dropped, which
undercounts parameters by well under 0.1%. Falcon-7B's single norm per layer is counted as
two (an overcount of ``h`` per layer); Qwen3's per-head Q/K norms, MLA's router biases and
Qwen2-MoE's shared-expert gate (``h`` weights) are not counted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfcast.errors import SpecError

logger = logging.getLogger(__name__)

HF_DEFAULT_MAX_SEQ_LEN = 4096
"""``from_hf_config`` caps the default ``seq_len`` at this many tokens."""

_HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu",
    "gelu_fast": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_python": "gelu",
    "gelu_accurate": "gelu",
    "gelu_10": "gelu",
    "quick_gelu": "gelu",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
}
"""HF activation names to :class:`~perfcast.features.model.Activation` values."""

_HF_TIED_DEFAULT = {
    "gpt2": True,
    "opt": True,
    "falcon": True,
    "gemma": True,
    "gpt_neox": False,
}
"""``tie_word_embeddings`` when the config omits it (the family's config-class default)."""

_LLAMA_LIKE = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma"})
_MLA_FAMILIES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})
_MAMBA_HYBRIDS = frozenset(
    {"nemotron_h", "jamba", "falcon_h1", "bamba", "zamba", "zamba2", "mamba", "mamba2", "falcon_mamba",
     "granitemoehybrid", "plamo2"}
)  # fmt: skip
"""Families with state-space (Mamba) layers, which the workload graph does not model."""


def looks_like_hf_config(data: Any) -> bool:
    """A JSON object with HF keys (``model_type``/``architectures``) and no perfcast fields."""
    if not isinstance(data, Mapping) or "num_layers" in data:
        return False
    return "model_type" in data or "architectures" in data


def hf_name(cfg: Mapping[str, Any], path: Path | None = None) -> str:
    """The model's name: ``_name_or_path``, else the config's folder, else its ``model_type``."""
    name = cfg.get("_name_or_path")
    if isinstance(name, str) and name:
        return name
    if path is not None:
        return path.parent.name or path.stem
    return str(cfg.get("model_type", "custom"))


class _HFReader:
    """Reads keys of one HF config and collects every missing one for a single error."""

    def __init__(self, cfg: Mapping[str, Any], where: str, model_type: str) -> None:
        self.cfg = cfg
        self.where = where
        self.model_type = model_type
        self.missing: list[str] = []

    def req(self, *keys: str) -> Any:
        for key in keys:
            if self.cfg.get(key) is not None:
                return self.cfg[key]
        self.missing.append(" or ".join(keys))
        return None

    def opt(self, *keys: str, default: Any = None) -> Any:
        for key in keys:
            if self.cfg.get(key) is not None:
                return self.cfg[key]
        return default

    def activation(self, *keys: str, default: str) -> str:
        key = next((k for k in keys if self.cfg.get(k) is not None), None)
        raw = default if key is None else self.cfg[key]
        act = _HF_ACTIVATIONS.get(str(raw).lower())
        if act is None:
            allowed = ", ".join(sorted(_HF_ACTIVATIONS))
            raise SpecError(f"{self.where}: {key}={raw!r} is not supported; allowed: {allowed}")
        return act

    def check(self) -> None:
        if self.missing:
            raise SpecError(
                f"{self.where}: missing key(s) for model_type={self.model_type or 'unknown'!r}: "
                + ", ".join(self.missing)
            )


def hf_model_fields(cfg: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Map a Hugging Face config to TransformerSpec fields (all but ``name`` and ``seq_len``).

    Raises:
        SpecError: a family perfcast cannot represent (naming the part), missing keys (all
            named, with the ``model_type``) or an unknown activation.
    """
    model_type = str(cfg.get("model_type", "")).lower()
    if model_type in ("refinedweb", "refinedwebmodel"):
        model_type = "falcon"
    if model_type in _MAMBA_HYBRIDS:
        raise SpecError(f"{where}: model_type={model_type}: Mamba layers are not modelled (attention and MLP only)")
    if model_type == "llama4":
        text = cfg.get("text_config")
        if not isinstance(text, Mapping):
            raise SpecError(f"{where}: model_type=llama4: missing key text_config (the language model's config)")
        cfg, model_type = text, "llama4"
    if ("kv_lora_rank" in cfg or "q_lora_rank" in cfg) and model_type not in _MLA_FAMILIES:
        raise SpecError(
            f"{where}: model_type={model_type!r} has kv_lora_rank/q_lora_rank: multi-head latent attention is "
            f"read for model_type {', '.join(sorted(_MLA_FAMILIES))} only"
        )
    r = _HFReader(cfg, where, model_type)
    readers = {"falcon": _hf_falcon, "gpt_oss": _hf_gpt_oss, "llama4": _hf_llama4,
               **dict.fromkeys(_LAYERNORM_FAMILIES, _hf_layernorm_decoder),
               **dict.fromkeys(_MLA_FAMILIES, _hf_deepseek)}  # fmt: skip
    if model_type in readers:
        fields = readers[model_type](r)
    else:
        if model_type not in _LLAMA_LIKE:
            logger.warning(
                "%s: model_type=%r is not a known family; reading it as Llama-like", where, model_type or None
            )
        fields = _hf_llama_like(r, model_type)
    r.check()
    return {k: v for k, v in fields.items() if v is not None}


def _hf_llama_like(r: _HFReader, model_type: str) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "num_layers": r.req("num_hidden_layers"),
        "hidden_size": r.req("hidden_size"),
        "num_heads": r.req("num_attention_heads"),
        "num_kv_heads": r.opt("num_key_value_heads"),
        "head_dim": r.opt("head_dim"),
        "ffn_hidden_size": r.req("intermediate_size"),
        "vocab_size": r.req("vocab_size"),
        "max_position_embeddings": r.opt("max_position_embeddings"),
        "gated_mlp": True,
        "activation": r.activation("hidden_activation", "hidden_act", default="silu"),
        "norm": "rmsnorm",
        "position_embedding": "rope",
        "tied_embeddings": bool(r.opt("tie_word_embeddings", default=_HF_TIED_DEFAULT.get(model_type, False))),
        "bias": bool(r.opt("attention_bias", default=False)) and bool(r.opt("mlp_bias", default=False)),
        **_sliding_window(r),
    }
    num_experts = r.opt("num_local_experts", "num_experts", default=1)
    if isinstance(num_experts, int) and num_experts > 1:
        dense_only = r.opt("mlp_only_layers", default=[])
        if dense_only:
            raise SpecError(
                f"{r.where}: mlp_only_layers={dense_only!r}: dense layers at arbitrary positions are not "
                "representable; allowed: first_dense_layers (leading ones) and moe_layer_freq"
            )
        shared = r.opt("shared_expert_intermediate_size", default=0)
        fields.update(
            num_experts=num_experts,
            top_k=r.req("num_experts_per_tok"),
            moe_ffn_hidden_size=r.opt("moe_intermediate_size"),
            moe_layer_freq=r.opt("decoder_sparse_step", default=1),
            num_shared_experts=1 if shared else 0,
            shared_expert_ffn_hidden_size=shared or None,
        )
    return fields


def _sliding_window(r: _HFReader) -> dict[str, Any]:
    """``sliding_window`` and ``sliding_window_layers`` from ``layer_types`` (none when absent)."""
    layer_types = r.opt("layer_types", default=None)
    if not isinstance(layer_types, list):
        return {}
    windowed = sum(1 for t in layer_types if t == "sliding_attention")
    if not windowed:
        return {}
    return {"sliding_window": r.req("sliding_window"), "sliding_window_layers": windowed}


def _hf_gpt_oss(r: _HFReader) -> dict[str, Any]:
    fields = _hf_llama_like(r, "gpt_oss")
    fields.update(
        bias=bool(r.opt("attention_bias", default=True)),  # the experts carry biases too
        attention_sinks=True,
        moe_ffn_hidden_size=None,  # the experts are intermediate_size wide
    )
    return fields


def _hf_deepseek(r: _HFReader) -> dict[str, Any]:
    num_heads = r.req("num_attention_heads")
    num_experts = r.opt("n_routed_experts", default=1)
    fields: dict[str, Any] = {
        "num_layers": r.req("num_hidden_layers"),
        "hidden_size": r.req("hidden_size"),
        "num_heads": num_heads,
        "ffn_hidden_size": r.req("intermediate_size"),
        "vocab_size": r.req("vocab_size"),
        "max_position_embeddings": r.opt("max_position_embeddings"),
        "gated_mlp": True,
        "activation": r.activation("hidden_act", default="silu"),
        "norm": "rmsnorm",
        "position_embedding": "rope",
        "tied_embeddings": bool(r.opt("tie_word_embeddings", default=False)),
        "bias": False,
        "mla": {
            "q_lora_rank": r.opt("q_lora_rank"),
            "kv_lora_rank": r.req("kv_lora_rank"),
            "qk_nope_head_dim": r.req("qk_nope_head_dim"),
            "qk_rope_head_dim": r.req("qk_rope_head_dim"),
            "v_head_dim": r.req("v_head_dim"),
        },
        "mtp_layers": r.opt("num_nextn_predict_layers", default=0),
    }
    if isinstance(num_experts, int) and num_experts > 1:
        fields.update(
            num_experts=num_experts,
            top_k=r.req("num_experts_per_tok"),
            moe_ffn_hidden_size=r.req("moe_intermediate_size"),
            moe_layer_freq=r.opt("moe_layer_freq", default=1),
            num_shared_experts=r.opt("n_shared_experts", default=0),
            first_dense_layers=r.opt("first_k_dense_replace", default=0),
        )
    return fields


def _hf_llama4(r: _HFReader) -> dict[str, Any]:
    fields = _hf_llama_like(r, "llama4")
    expert = r.req("intermediate_size")
    fields.update(
        ffn_hidden_size=r.req("intermediate_size_mlp"),
        num_experts=r.req("num_local_experts"),
        top_k=r.req("num_experts_per_tok"),
        moe_ffn_hidden_size=expert,
        moe_layer_freq=r.opt("interleave_moe_layer_step", default=1),
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=expert,
    )
    return fields


@dataclass(frozen=True)
class _LayerNormKeys:
    """Where a GPT-style family (LayerNorm, plain MLP) keeps each field: the keys tried in
    order, whether the field is required, and the defaults of its config class."""

    ffn: tuple[str, ...]
    activation: str
    activation_default: str
    position_embedding: str
    bias: str | bool
    """The key of the biases flag (default True), or the fixed value."""
    positions: tuple[str, ...] = ("max_position_embeddings",)
    positions_required: bool = False
    ffn_required: bool = True
    layers: tuple[str, ...] = ("num_hidden_layers",)
    hidden: tuple[str, ...] = ("hidden_size",)
    heads: tuple[str, ...] = ("num_attention_heads",)


_LAYERNORM_FAMILIES: dict[str, _LayerNormKeys] = {
    "gpt2": _LayerNormKeys(
        layers=("n_layer", "num_hidden_layers"),
        hidden=("n_embd", "hidden_size"),
        heads=("n_head", "num_attention_heads"),
        ffn=("n_inner",),
        ffn_required=False,
        positions=("n_positions", "n_ctx", "max_position_embeddings"),
        positions_required=True,
        activation="activation_function",
        activation_default="gelu_new",
        position_embedding="learned",
        bias=True,
    ),
    "gpt_neox": _LayerNormKeys(
        ffn=("intermediate_size",), activation="hidden_act", activation_default="gelu", position_embedding="rope",
        bias="attention_bias",
    ),
    # OPT's learned position table has 2 extra rows (padding offset) and opt-350m projects
    # a 512-wide embedding in and out; both are ignored (< 0.2% of parameters).
    "opt": _LayerNormKeys(
        ffn=("ffn_dim",), positions_required=True, activation="activation_function", activation_default="relu",
        position_embedding="learned", bias="enable_bias",
    ),
}
"""The GPT-style families read by :func:`_hf_layernorm_decoder`, by ``model_type``."""


def _hf_layernorm_decoder(r: _HFReader) -> dict[str, Any]:
    """The fields of a family of :data:`_LAYERNORM_FAMILIES` (``r.model_type``)."""
    keys = _LAYERNORM_FAMILIES[r.model_type]
    return {
        "num_layers": r.req(*keys.layers),
        "hidden_size": r.req(*keys.hidden),
        "num_heads": r.req(*keys.heads),
        "ffn_hidden_size": r.req(*keys.ffn) if keys.ffn_required else r.opt(*keys.ffn),
        "vocab_size": r.req("vocab_size"),
        "max_position_embeddings": r.req(*keys.positions) if keys.positions_required else r.opt(*keys.positions),
        "gated_mlp": False,
        "activation": r.activation(keys.activation, default=keys.activation_default),
        "norm": "layernorm",
        "position_embedding": keys.position_embedding,
        "tied_embeddings": bool(r.opt("tie_word_embeddings", default=_HF_TIED_DEFAULT[r.model_type])),
        "bias": keys.bias if isinstance(keys.bias, bool) else bool(r.opt(keys.bias, default=True)),
    }


def _hf_falcon(r: _HFReader) -> dict[str, Any]:
    num_heads = r.req("num_attention_heads", "n_head")
    hidden = r.req("hidden_size")
    if r.opt("new_decoder_architecture", default=False):
        kv_heads = r.opt("num_kv_heads", "n_head_kv", default=num_heads)
    elif r.opt("multi_query", default=True):
        kv_heads = 1
    else:
        kv_heads = num_heads
    ffn = r.opt("ffn_hidden_size", default=4 * hidden if isinstance(hidden, int) else None)
    return {
        "num_layers": r.req("num_hidden_layers", "n_layer"),
        "hidden_size": hidden,
        "num_heads": num_heads,
        "num_kv_heads": kv_heads,
        "ffn_hidden_size": ffn,
        "vocab_size": r.req("vocab_size"),
        "max_position_embeddings": r.opt("max_position_embeddings"),
        "gated_mlp": False,
        "activation": r.activation("activation", default="gelu"),
        "norm": "layernorm",
        "position_embedding": "alibi" if r.opt("alibi", default=False) else "rope",
        "tied_embeddings": bool(r.opt("tie_word_embeddings", default=_HF_TIED_DEFAULT["falcon"])),
        "bias": bool(r.opt("bias", default=False)),
    }
