"""Model spec: the shape of a decoder-only transformer, dense or mixture-of-experts.

:class:`ModelSpec` is the one checked description of a model that the workload graph,
the analytic estimates and the run table read. It stores only the shape; parameter counts
and FLOPs are derived properties.

Construction:

- ``ModelSpec(num_layers=..., hidden_size=..., ...)`` from fields;
- ``ModelSpec.from_name("llama2-7b")`` from the preset catalog (:func:`list_models`);
- ``ModelSpec.from_hf_config("config.json")`` from a Hugging Face ``config.json``;
- ``ModelSpec.from_file("spec.json")`` from a perfcast JSON spec;
- ``ModelSpec.load(ref)`` from any of the above.

Direct construction raises :class:`pydantic.ValidationError` (a ``ValueError``, with field
paths); the ``from_*`` constructors and :meth:`ModelSpec.load` raise
:class:`~perfcast.errors.SpecError` instead.

Notation in the docstrings: ``L`` layers, ``h`` hidden size, ``nh`` query heads, ``nkv``
key/value heads, ``hd`` head size, ``f`` dense FFN size, ``fe`` expert FFN size, ``E``
experts, ``k`` experts per token, ``V`` vocabulary, ``s`` sequence length (tokens).
"""

from __future__ import annotations

import difflib
import json
import logging
import operator
from collections.abc import Mapping
from enum import Enum
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from perfcast.data.schema import FIELD_MAX
from perfcast.errors import SpecError, UnknownEntryError
from perfcast.features._spec_io import read_json, to_spec_error

__all__ = [
    "Activation",
    "ModelSpec",
    "NormType",
    "PositionEmbedding",
    "list_models",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""Version of the perfcast model-spec JSON layout (presets and user files)."""

_METADATA_KEYS = ("schema_version", "source", "id")
"""Keys of a spec JSON file that describe the file, not the model; dropped on load."""

_CATALOG_PACKAGE = "perfcast.features"

_HF_DEFAULT_MAX_SEQ_LEN = 4096
"""``from_hf_config`` caps the default ``seq_len`` at this many tokens."""


class NormType(str, Enum):
    """Normalisation layer type."""

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class Activation(str, Enum):
    """MLP activation function (of the gate branch, for gated MLPs)."""

    GELU = "gelu"
    SILU = "silu"
    RELU = "relu"


class PositionEmbedding(str, Enum):
    """How positions enter the model; only ``learned`` has parameters."""

    LEARNED = "learned"
    ROPE = "rope"
    ALIBI = "alibi"
    NONE = "none"


class ModelSpec(BaseModel):
    """Shape of a decoder-only transformer language model, dense or MoE.

    Sizes are element counts (not bytes); ``seq_len`` and ``max_position_embeddings``
    are tokens. ``None`` in an optional size means "derive it": see the properties
    :attr:`kv_heads`, :attr:`head_size`, :attr:`ffn_size` and :attr:`expert_ffn_size`.

    A layer is: norm, self-attention (Q, K, V, O projections), norm, MLP. With
    ``num_experts > 1`` every ``moe_layer_freq``-th layer replaces its MLP by ``num_experts``
    expert MLPs and a bias-free linear router, of which ``top_k`` run per token. The MoE
    fields (``top_k``, ``moe_ffn_hidden_size``, ``moe_layer_freq``) are ignored by dense
    models, except that ``top_k`` may not exceed ``num_experts``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    num_layers: int = Field(gt=0, le=FIELD_MAX["num_layers"], description="Transformer layers (blocks).")
    hidden_size: int = Field(gt=0, le=FIELD_MAX["hidden_size"], description="Model width h, elements.")
    num_heads: int = Field(gt=0, le=FIELD_MAX["num_heads"], description="Query attention heads.")
    num_kv_heads: int | None = Field(
        default=None,
        gt=0,
        le=FIELD_MAX["num_kv_heads"],
        description="Key/value heads; None = num_heads (MHA), 1 = MQA.",
    )
    head_dim: int | None = Field(
        default=None, gt=0, le=FIELD_MAX["head_dim"], description="Size of one head; None = hidden_size // num_heads."
    )
    ffn_hidden_size: int | None = Field(
        default=None,
        gt=0,
        le=FIELD_MAX["ffn_hidden_size"],
        description="Dense MLP inner size; None = 4h (see ffn_size).",
    )
    vocab_size: int = Field(gt=0, le=FIELD_MAX["vocab_size"], description="Vocabulary size, tokens.")
    seq_len: int = Field(default=2048, gt=0, le=FIELD_MAX["seq_len"], description="Training sequence length, tokens.")
    max_position_embeddings: int | None = Field(
        default=None,
        gt=0,
        le=FIELD_MAX["max_position_embeddings"],
        description="Longest supported sequence, tokens; None = seq_len.",
    )
    gated_mlp: bool = Field(default=False, description="Gated MLP (SwiGLU/GeGLU): 3 matrices.")
    activation: Activation = Activation.GELU
    norm: NormType = NormType.LAYERNORM
    position_embedding: PositionEmbedding = PositionEmbedding.LEARNED
    tied_embeddings: bool = Field(default=False, description="LM head shares the input embedding.")
    bias: bool = Field(default=True, description="Biases on attention and MLP linears.")
    num_experts: int = Field(
        default=1, ge=1, le=FIELD_MAX["num_experts"], description="Experts per MoE layer; 1 = dense."
    )
    top_k: int = Field(default=1, ge=1, le=FIELD_MAX["top_k"], description="Experts each token is routed to.")
    moe_ffn_hidden_size: int | None = Field(
        default=None, gt=0, le=FIELD_MAX["moe_ffn_hidden_size"], description="Expert MLP inner size; None = ffn_size."
    )
    moe_layer_freq: int = Field(
        default=1, ge=1, le=FIELD_MAX["moe_layer_freq"], description="Every k-th layer is an MoE layer."
    )

    # ------------------------------------------------------------------ validation

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads={self.num_heads} does not divide hidden_size={self.hidden_size}; "
                "give head_dim explicitly for such models"
            )
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}")
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k={self.top_k} exceeds num_experts={self.num_experts}; allowed: 1 <= top_k <= num_experts"
            )
        if self.num_experts > 1 and self.num_layers % self.moe_layer_freq:
            raise ValueError(f"moe_layer_freq={self.moe_layer_freq} does not divide num_layers={self.num_layers}")
        if (
            self.position_embedding is PositionEmbedding.LEARNED
            and self.max_position_embeddings is not None
            and self.seq_len > self.max_position_embeddings
        ):
            raise ValueError(
                f"seq_len={self.seq_len} exceeds max_position_embeddings="
                f"{self.max_position_embeddings} of learned position embeddings"
            )
        return self

    # ------------------------------------------------------------------ resolved shape

    @property
    def kv_heads(self) -> int:
        """Key/value heads, resolved (``num_kv_heads`` or ``num_heads``)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_size(self) -> int:
        """Size of one attention head ``hd``, elements (``head_dim`` or ``h // nh``)."""
        return self.hidden_size // self.num_heads if self.head_dim is None else self.head_dim

    @property
    def ffn_size(self) -> int:
        """Dense MLP inner size ``f``, elements.

        ``ffn_hidden_size`` when given. Otherwise ``4h`` for a plain MLP, and for a gated one
        Megatron-LM's SwiGLU default ``floor(8h/3 / 64) * 64`` (same parameters as ``4h``
        plain, rounded down to a multiple of 64).
        """
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.gated_mlp:
            return int(8 * self.hidden_size / 3 / 64) * 64 or 64
        return 4 * self.hidden_size

    @property
    def expert_ffn_size(self) -> int:
        """Inner size ``fe`` of one expert MLP, elements (``moe_ffn_hidden_size`` or ``f``)."""
        return self.ffn_size if self.moe_ffn_hidden_size is None else self.moe_ffn_hidden_size

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model (``num_experts > 1``)."""
        return self.num_experts > 1

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a set of experts: ``L // moe_layer_freq``, 0 when dense."""
        return self.num_layers // self.moe_layer_freq if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP: ``L - num_moe_layers``."""
        return self.num_layers - self.num_moe_layers

    @property
    def positions(self) -> int:
        """Rows of a learned position table, tokens (``max_position_embeddings`` or ``seq_len``)."""
        if self.max_position_embeddings is None:
            return self.seq_len
        return self.max_position_embeddings

    # ------------------------------------------------------------------ parameter counts

    @property
    def _q_width(self) -> int:
        return self.num_heads * self.head_size

    @property
    def _kv_width(self) -> int:
        return self.kv_heads * self.head_size

    @property
    def attention_matmul_params_per_layer(self) -> int:
        """Attention projection weights of one layer, parameters (no biases).

        ``Q: h·(nh·hd)``, ``K, V: h·(nkv·hd)`` each, ``O: (nh·hd)·h``.
        """
        h = self.hidden_size
        return 2 * h * self._q_width + 2 * h * self._kv_width

    @property
    def attention_params_per_layer(self) -> int:
        """Attention parameters of one layer: projection weights plus, with ``bias``,
        the Q, K, V, O biases ``nh·hd + 2·nkv·hd + h``."""
        params = self.attention_matmul_params_per_layer
        if self.bias:
            params += self._q_width + 2 * self._kv_width + self.hidden_size
        return params

    def _mlp_weights(self, ffn: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * ffn

    def _mlp_params(self, ffn: int) -> int:
        params = self._mlp_weights(ffn)
        if self.bias:
            params += (2 if self.gated_mlp else 1) * ffn + self.hidden_size
        return params

    @property
    def mlp_params_per_layer(self) -> int:
        """Parameters of one dense MLP: ``3·h·f`` gated or ``2·h·f`` plain, plus biases
        (``2f + h`` gated, ``f + h`` plain) with ``bias``."""
        return self._mlp_params(self.ffn_size)

    @property
    def expert_params(self) -> int:
        """Parameters of one expert MLP (the MLP formula with ``fe`` for ``f``)."""
        return self._mlp_params(self.expert_ffn_size)

    @property
    def router_params_per_layer(self) -> int:
        """Router weights of one MoE layer ``h·E`` (no bias); 0 for a dense model."""
        return self.hidden_size * self.num_experts if self.is_moe else 0

    @property
    def moe_params_per_layer(self) -> int:
        """Parameters of one MoE block: all ``E`` experts plus the router; 0 when dense."""
        if not self.is_moe:
            return 0
        return self.num_experts * self.expert_params + self.router_params_per_layer

    @property
    def _norm_params(self) -> int:
        h = self.hidden_size
        return 2 * h if self.norm is NormType.LAYERNORM else h

    @property
    def norm_params_per_layer(self) -> int:
        """Parameters of the two norms of one layer: ``2·2h`` layernorm, ``2·h`` rmsnorm."""
        return 2 * self._norm_params

    @property
    def final_norm_params(self) -> int:
        """Parameters of the norm after the last layer: ``2h`` layernorm, ``h`` rmsnorm."""
        return self._norm_params

    @property
    def embedding_params(self) -> int:
        """Input embedding ``V·h`` plus, for learned positions, ``positions·h``."""
        params = self.vocab_size * self.hidden_size
        if self.position_embedding is PositionEmbedding.LEARNED:
            params += self.positions * self.hidden_size
        return params

    @property
    def output_params(self) -> int:
        """LM head weights ``V·h`` (no bias); 0 when tied to the input embedding."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    def num_params_per_layer(self, moe: bool = False) -> int:
        """Parameters of one layer: attention, two norms and its MLP (or MoE block).

        Args:
            moe: count an MoE layer (all experts and the router) instead of a dense one.

        Raises:
            SpecError: ``moe=True`` on a dense model.
        """
        if moe and not self.is_moe:
            raise SpecError(f"moe=True but num_experts={self.num_experts}: the model is dense")
        mlp = self.moe_params_per_layer if moe else self.mlp_params_per_layer
        return self.attention_params_per_layer + self.norm_params_per_layer + mlp

    @property
    def num_params(self) -> int:
        """Total parameters: embeddings, all layers, final norm and (untied) LM head."""
        layers = self.num_dense_layers * self.num_params_per_layer(moe=False)
        if self.is_moe:
            layers += self.num_moe_layers * self.num_params_per_layer(moe=True)
        return self.embedding_params + layers + self.final_norm_params + self.output_params

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses: as :attr:`num_params`, but each MoE layer counts only
        ``top_k`` experts (plus the router). Equals :attr:`num_params` for a dense model."""
        if not self.is_moe:
            return self.num_params
        inactive = (self.num_experts - self.top_k) * self.expert_params
        return self.num_params - self.num_moe_layers * inactive

    @property
    def num_matmul_params(self) -> int:
        """Weights one token multiplies through, parameters: attention projections, the
        dense MLPs, the ``top_k`` active experts and routers of MoE layers, and the LM head
        (counted even when tied). Excludes biases, norms and input/position embeddings."""
        per_layer_attn = self.attention_matmul_params_per_layer
        dense = self._mlp_weights(self.ffn_size)
        moe = self.top_k * self._mlp_weights(self.expert_ffn_size) + self.router_params_per_layer
        return (
            self.num_layers * per_layer_attn
            + self.num_dense_layers * dense
            + self.num_moe_layers * moe
            + self.vocab_size * self.hidden_size
        )

    # ------------------------------------------------------------------ FLOPs

    def flops_per_token(self, seq_len: int | None = None, *, training: bool = True) -> float:
        """Model FLOPs per token of one training (or forward-only) step, FLOP/token.

        The count of Narayanan et al. 2021 ("Efficient large-scale language model training
        on GPU clusters using Megatron-LM"), without activation recomputation (their
        ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))`` per iteration includes one recomputed
        forward pass), generalised to GQA/MQA, gated MLPs and MoE::

            training:  6·N_mm + 12·L·s·(nh·hd)
            forward:   2·N_mm +  4·L·s·(nh·hd)

        ``N_mm`` is :attr:`num_matmul_params`: every matmul weight costs 2 FLOPs per token
        forward and 4 backward (input and weight gradients). The second term is attention
        scores ``QKᵀ`` and context ``AV`` (``2·s·nh·hd`` each per token and layer forward),
        counted, as Megatron does, for full non-causal attention: causal masking is not
        subtracted. Biases, norms, activations, softmax and the optimizer are left out, and
        activation recomputation is not counted (it is a property of the run, not the
        model). For a dense GPT with ``nh·hd = h`` and ``f = 4h`` this is
        ``72·L·h²·(1 + s/(6h) + V/(12·h·L))`` per token.

        Args:
            seq_len: tokens per sequence for the attention term; default :attr:`seq_len`.
            training: forward + backward (True) or forward only (False).

        Raises:
            SpecError: ``seq_len`` not positive.
        """
        s = self.seq_len if seq_len is None else seq_len
        try:
            s = operator.index(s)  # int, numpy integer
        except TypeError:
            s = -1
        if isinstance(seq_len, bool) or s <= 0:
            raise SpecError(f"seq_len={seq_len!r} is not allowed; expected a positive integer")
        attention = self.num_layers * s * self._q_width
        if training:
            return 6.0 * self.num_matmul_params + 12.0 * attention
        return 2.0 * self.num_matmul_params + 4.0 * attention

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "model spec") -> ModelSpec:
        """Build a spec from a mapping of fields, as in a perfcast JSON spec.

        The file-metadata keys ``schema_version`` (must be 1 when present), ``source`` and
        ``id`` are dropped; any other unknown key is an error.

        Raises:
            SpecError: wrong schema version, unknown keys or invalid values, naming the
                field and the value received.
        """
        if not isinstance(data, Mapping):
            raise SpecError(f"{where}: expected a JSON object, got {type(data).__name__}")
        version = data.get("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise SpecError(f"{where}: schema_version={version!r} is not supported; allowed: {SCHEMA_VERSION}")
        fields = {k: v for k, v in data.items() if k not in _METADATA_KEYS}
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise to_spec_error(exc, where) from None

    @classmethod
    def from_file(cls, path: str | Path) -> ModelSpec:
        """Read a perfcast model-spec JSON file (see :meth:`from_dict`).

        Raises:
            SpecError: unreadable file, invalid JSON, a Hugging Face config (use
                :meth:`from_hf_config` or :meth:`load`), or invalid fields.
        """
        path = Path(path)
        data = read_json(path)
        if looks_like_hf_config(data):
            raise SpecError(
                f"{path}: looks like a Hugging Face config.json (has model_type/architectures); "
                "use ModelSpec.from_hf_config or ModelSpec.load"
            )
        return cls.from_dict(data, where=str(path))

    @classmethod
    def from_name(cls, name: str) -> ModelSpec:
        """Load a preset from the catalog by id, e.g. ``"llama2-7b"``.

        Matching ignores case, surrounding space and ``_``/space vs ``-``; when that finds
        nothing, ids are also compared with all separators removed (``"Llama-2-7B"``).

        Raises:
            UnknownEntryError: no such preset; suggests up to 3 close ids.
        """
        return _load_preset(_resolve_preset_id(name))

    @classmethod
    def from_hf_config(cls, path_or_dict: str | Path | Mapping[str, Any], *, seq_len: int | None = None) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (a path, a directory holding one, or its dict).

        Families read by ``model_type``: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe
        (and qwen2_moe without shared experts), gemma, gpt2, gpt_neox, opt, falcon. Any
        other ``model_type`` is read with the Llama keys and logs a warning.

        Mapping: layers/width/heads from ``num_hidden_layers``/``hidden_size``/
        ``num_attention_heads`` (gpt2: ``n_layer``/``n_embd``/``n_head``); ``num_key_value_heads``;
        ``head_dim``; ``intermediate_size`` (gpt2 ``n_inner``, opt ``ffn_dim``);
        ``num_local_experts``/``num_experts`` and ``num_experts_per_tok``;
        ``moe_intermediate_size``; ``decoder_sparse_step``; ``tie_word_embeddings`` (family
        default when absent); ``hidden_act``/``activation_function`` to :class:`Activation`;
        RMSNorm for Llama-like families (``rms_norm_eps``), LayerNorm otherwise;
        ``max_position_embeddings`` (gpt2 ``n_positions``).

        ``bias`` is True only when all attention and MLP projections have biases; partial
        biases (Qwen2's Q/K/V biases, Llama's ``attention_bias`` without ``mlp_bias``) are
        dropped, which undercounts parameters by well under 0.1%. Falcon-7B's single norm
        per layer is counted as two (an overcount of ``h`` per layer).

        Args:
            path_or_dict: the config, as a file path, a directory or a parsed mapping.
            seq_len: training sequence length, tokens. Default
                ``min(max_position_embeddings, 4096)``, or 2048 when the config has no
                maximum.

        Raises:
            SpecError: unreadable file, missing keys (all named), an unknown activation, or
                an architecture perfcast cannot represent (shared experts, MLA, dense-only
                layers in an MoE).
        """
        path: Path | None = None
        if isinstance(path_or_dict, Mapping):
            cfg: Mapping[str, Any] = path_or_dict
            where = "Hugging Face config"
        else:
            path = Path(path_or_dict)
            if path.is_dir():
                path = path / "config.json"
            data = read_json(path)
            if not isinstance(data, Mapping):
                raise SpecError(f"{path}: expected a JSON object, got {type(data).__name__}")
            cfg = data
            where = str(path)
        fields = _hf_fields(cfg, where)
        fields["name"] = _hf_name(cfg, path)
        max_pos = fields.get("max_position_embeddings")
        if seq_len is None:
            seq_len = min(max_pos, _HF_DEFAULT_MAX_SEQ_LEN) if max_pos else 2048
        fields["seq_len"] = seq_len
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise to_spec_error(exc, where) from None

    @classmethod
    def load(cls, ref: str | Path) -> ModelSpec:
        """Resolve a model reference: a preset id, or a path to a Hugging Face
        ``config.json`` (or its directory) or to a perfcast spec JSON.

        An existing path wins over a preset id. A file is read as a Hugging Face config when
        it has ``model_type`` or ``architectures`` and no ``num_layers``.

        Raises:
            SpecError: a path-like reference that does not exist, or invalid content.
            UnknownEntryError: neither a path nor a preset id.
        """
        path = Path(ref)
        if path.is_dir():
            return cls.from_hf_config(path)
        if path.is_file():
            data = read_json(path)
            if looks_like_hf_config(data):
                return cls.from_hf_config(path)
            return cls.from_dict(data, where=str(path))
        text = str(ref)
        if text.endswith(".json") or "/" in text or "\\" in text:
            raise SpecError(f"model={text!r}: no such file or directory")
        return cls.from_name(text)


# ---------------------------------------------------------------------- catalog


def list_models() -> list[str]:
    """Ids of the preset models in the catalog, sorted."""
    return list(_preset_ids())


@lru_cache(maxsize=1)
def _preset_ids() -> tuple[str, ...]:
    root = resources.files(_CATALOG_PACKAGE).joinpath("catalog").joinpath("models")
    names = (p.name for p in root.iterdir())
    return tuple(sorted(n.removesuffix(".json") for n in names if n.endswith(".json")))


def _normalize(name: str) -> str:
    return "-".join(str(name).strip().lower().replace("_", "-").split())


def _compact(name: str) -> str:
    return "".join(c for c in name if c.isalnum() or c == ".")


def _resolve_preset_id(name: str) -> str:
    ids = _preset_ids()
    key = _normalize(name)
    if key in ids:
        return key
    compact = [i for i in ids if _compact(i) == _compact(key)]
    if len(compact) == 1:
        return compact[0]
    close = difflib.get_close_matches(key, ids, n=3, cutoff=0.5)
    hint = f"; did you mean: {', '.join(close)}?" if close else f"; known models: {', '.join(ids)}"
    raise UnknownEntryError(f"model={name!r} is not a known preset{hint}")


@cache
def _load_preset(model_id: str) -> ModelSpec:
    res = resources.files(_CATALOG_PACKAGE).joinpath("catalog").joinpath("models").joinpath(f"{model_id}.json")
    where = f"model catalog entry {model_id!r}"
    try:
        data = json.loads(res.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{where}: cannot read: {exc}") from None
    return ModelSpec.from_dict(data, where=where)


# ---------------------------------------------------------------------- helpers


def looks_like_hf_config(data: Any) -> bool:
    """A JSON object with HF keys (``model_type``/``architectures``) and no perfcast fields."""
    if not isinstance(data, Mapping) or "num_layers" in data:
        return False
    return "model_type" in data or "architectures" in data


def _hf_name(cfg: Mapping[str, Any], path: Path | None = None) -> str:
    name = cfg.get("_name_or_path")
    if isinstance(name, str) and name:
        return name
    if path is not None:
        return path.parent.name or path.stem
    return str(cfg.get("model_type", "custom"))


_HF_ACTIVATIONS = {
    "gelu": Activation.GELU,
    "gelu_new": Activation.GELU,
    "gelu_fast": Activation.GELU,
    "gelu_pytorch_tanh": Activation.GELU,
    "gelu_python": Activation.GELU,
    "gelu_accurate": Activation.GELU,
    "gelu_10": Activation.GELU,
    "quick_gelu": Activation.GELU,
    "silu": Activation.SILU,
    "swish": Activation.SILU,
    "relu": Activation.RELU,
}

# tie_word_embeddings when the config omits it (the family's config-class default).
_HF_TIED_DEFAULT = {
    "gpt2": True,
    "opt": True,
    "falcon": True,
    "gemma": True,
    "gpt_neox": False,
}

_LLAMA_LIKE = {
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
}


class _HFReader:
    """Reads keys of one HF config and collects every missing one for a single error."""

    def __init__(self, cfg: Mapping[str, Any], where: str) -> None:
        self.cfg = cfg
        self.where = where
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

    def activation(self, *keys: str, default: str) -> Activation:
        key = next((k for k in keys if self.cfg.get(k) is not None), None)
        raw = default if key is None else self.cfg[key]
        act = _HF_ACTIVATIONS.get(str(raw).lower())
        if act is None:
            allowed = ", ".join(sorted(_HF_ACTIVATIONS))
            raise SpecError(f"{self.where}: {key}={raw!r} is not supported; allowed: {allowed}")
        return act

    def check(self) -> None:
        if self.missing:
            model_type = self.cfg.get("model_type", "unknown")
            raise SpecError(f"{self.where}: missing key(s) for model_type={model_type!r}: " + ", ".join(self.missing))


def _hf_fields(cfg: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Map a Hugging Face config to ModelSpec fields (all but ``seq_len``)."""
    model_type = str(cfg.get("model_type", "")).lower()
    if model_type in ("refinedweb", "refinedwebmodel"):
        model_type = "falcon"
    if "kv_lora_rank" in cfg or "q_lora_rank" in cfg:
        raise SpecError(
            f"{where}: model_type={model_type!r} uses multi-head latent attention "
            "(kv_lora_rank), which ModelSpec cannot represent"
        )
    r = _HFReader(cfg, where)
    if model_type == "gpt2":
        fields = _hf_gpt2(r)
    elif model_type == "gpt_neox":
        fields = _hf_gpt_neox(r)
    elif model_type == "opt":
        fields = _hf_opt(r)
    elif model_type == "falcon":
        fields = _hf_falcon(r)
    else:
        if model_type not in _LLAMA_LIKE:
            logger.warning(
                "%s: model_type=%r is not a known family; reading it as Llama-like",
                where,
                model_type or None,
            )
        fields = _hf_llama_like(r, model_type)
    r.check()
    return {k: v for k, v in fields.items() if v is not None}


def _hf_llama_like(r: _HFReader, model_type: str) -> dict[str, Any]:
    num_heads = r.req("num_attention_heads")
    fields: dict[str, Any] = {
        "num_layers": r.req("num_hidden_layers"),
        "hidden_size": r.req("hidden_size"),
        "num_heads": num_heads,
        "num_kv_heads": r.opt("num_key_value_heads"),
        "head_dim": r.opt("head_dim"),
        "ffn_hidden_size": r.req("intermediate_size"),
        "vocab_size": r.req("vocab_size"),
        "max_position_embeddings": r.opt("max_position_embeddings"),
        "gated_mlp": True,
        "activation": r.activation("hidden_activation", "hidden_act", default="silu"),
        "norm": NormType.RMSNORM,
        "position_embedding": PositionEmbedding.ROPE,
        "tied_embeddings": bool(r.opt("tie_word_embeddings", default=_HF_TIED_DEFAULT.get(model_type, False))),
        "bias": bool(r.opt("attention_bias", default=False)) and bool(r.opt("mlp_bias", default=False)),
    }
    num_experts = r.opt("num_local_experts", "num_experts", default=1)
    if isinstance(num_experts, int) and num_experts > 1:
        shared = r.opt("shared_expert_intermediate_size", default=0)
        if shared or r.opt("n_shared_experts", "num_shared_experts", default=0):
            raise SpecError(
                f"{r.where}: shared_expert_intermediate_size={shared!r}: shared experts are not "
                "representable in ModelSpec (no num_shared_experts field)"
            )
        dense_only = r.opt("mlp_only_layers", default=[])
        if dense_only:
            raise SpecError(
                f"{r.where}: mlp_only_layers={dense_only!r}: dense layers at arbitrary "
                "positions are not representable; only moe_layer_freq is"
            )
        fields.update(
            num_experts=num_experts,
            top_k=r.req("num_experts_per_tok"),
            moe_ffn_hidden_size=r.opt("moe_intermediate_size"),
            moe_layer_freq=r.opt("decoder_sparse_step", default=1),
        )
    return fields


def _hf_gpt2(r: _HFReader) -> dict[str, Any]:
    return {
        "num_layers": r.req("n_layer", "num_hidden_layers"),
        "hidden_size": r.req("n_embd", "hidden_size"),
        "num_heads": r.req("n_head", "num_attention_heads"),
        "ffn_hidden_size": r.opt("n_inner"),
        "vocab_size": r.req("vocab_size"),
        "max_position_embeddings": r.req("n_positions", "n_ctx", "max_position_embeddings"),
        "gated_mlp": False,
        "activation": r.activation("activation_function", default="gelu_new"),
        "norm": NormType.LAYERNORM,
        "position_embedding": PositionEmbedding.LEARNED,
        "tied_embeddings": bool(r.opt("tie_word_embeddings", default=True)),
        "bias": True,
    }


def _hf_gpt_neox(r: _HFReader) -> dict[str, Any]:
    return {
        "num_layers": r.req("num_hidden_layers"),
        "hidden_size": r.req("hidden_size"),
        "num_heads": r.req("num_attention_heads"),
        "ffn_hidden_size": r.req("intermediate_size"),
        "vocab_size": r.req("vocab_size"),
        "max_position_embeddings": r.opt("max_position_embeddings"),
        "gated_mlp": False,
        "activation": r.activation("hidden_act", default="gelu"),
        "norm": NormType.LAYERNORM,
        "position_embedding": PositionEmbedding.ROPE,
        "tied_embeddings": bool(r.opt("tie_word_embeddings", default=False)),
        "bias": bool(r.opt("attention_bias", default=True)),
    }


def _hf_opt(r: _HFReader) -> dict[str, Any]:
    # OPT's learned position table has 2 extra rows (padding offset) and opt-350m projects
    # a 512-wide embedding in and out; both are ignored (< 0.2% of parameters).
    return {
        "num_layers": r.req("num_hidden_layers"),
        "hidden_size": r.req("hidden_size"),
        "num_heads": r.req("num_attention_heads"),
        "ffn_hidden_size": r.req("ffn_dim"),
        "vocab_size": r.req("vocab_size"),
        "max_position_embeddings": r.req("max_position_embeddings"),
        "gated_mlp": False,
        "activation": r.activation("activation_function", default="relu"),
        "norm": NormType.LAYERNORM,
        "position_embedding": PositionEmbedding.LEARNED,
        "tied_embeddings": bool(r.opt("tie_word_embeddings", default=True)),
        "bias": bool(r.opt("enable_bias", default=True)),
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
        "norm": NormType.LAYERNORM,
        "position_embedding": (PositionEmbedding.ALIBI if r.opt("alibi", default=False) else PositionEmbedding.ROPE),
        "tied_embeddings": bool(r.opt("tie_word_embeddings", default=True)),
        "bias": bool(r.opt("bias", default=False)),
    }
