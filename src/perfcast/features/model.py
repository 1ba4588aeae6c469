"""Model spec: the shape of a decoder-only transformer, dense or mixture-of-experts.

:class:`TransformerSpec` is the one checked description of a model that the workload graph,
the analytic estimates and the run table read. It stores only the shape; parameter counts
and FLOPs are derived properties (:class:`~perfcast.features.model_counts.ModelCounts`). The
parts it names are in :mod:`perfcast.features.model_parts`, the preset ids in
:mod:`perfcast.features.model_presets`.

Construction:

- ``TransformerSpec(num_layers=..., hidden_size=..., ...)`` from fields;
- ``TransformerSpec.from_name("llama2-7b")`` from the preset catalog (:func:`list_models`);
- ``TransformerSpec.from_hf_config("config.json")`` from a Hugging Face ``config.json``;
- ``TransformerSpec.from_file("spec.json")`` from a perfcast JSON spec;
- ``TransformerSpec.load(ref)`` from any of the above.

Direct construction raises :class:`pydantic.ValidationError` (a ``ValueError``, with field
paths); the ``from_*`` constructors and :meth:`TransformerSpec.load` raise
:class:`~perfcast.errors.SpecError` instead.

Notation in the docstrings: ``L`` layers, ``h`` hidden size, ``nh`` query heads, ``nkv``
key/value heads, ``hd`` head size, ``f`` dense FFN size, ``fe`` expert FFN size, ``E``
experts, ``k`` experts per token, ``V`` vocabulary, ``s`` sequence length (tokens).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from perfcast.data.schema import FIELD_MAX
from perfcast.errors import SpecError
from perfcast.features._spec_io import read_json, to_spec_error
from perfcast.features.hf_config import HF_DEFAULT_MAX_SEQ_LEN, hf_model_fields, hf_name, looks_like_hf_config
from perfcast.features.model_counts import ModelCounts
from perfcast.features.model_parts import Activation, LatentAttention, NormType, PositionEmbedding
from perfcast.features.model_presets import CATALOG_PACKAGE, list_models, resolve_preset_id

__all__ = [
    "Activation",
    "LatentAttention",
    "TransformerSpec",
    "NormType",
    "PositionEmbedding",
    "list_models",
    "looks_like_hf_config",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""Version of the perfcast model-spec JSON layout (presets and user files)."""

_METADATA_KEYS = ("schema_version", "source", "id")
"""Keys of a spec JSON file that describe the file, not the model; dropped on load."""


class TransformerSpec(ModelCounts, BaseModel):
    """Shape of a decoder-only transformer language model, dense or MoE.

    Sizes are element counts (not bytes); ``seq_len`` and ``max_position_embeddings``
    are tokens. ``None`` in an optional size means "derive it": see the properties
    :attr:`kv_heads`, :attr:`head_size`, :attr:`ffn_size` and :attr:`expert_ffn_size`.

    A layer is: norm, self-attention (Q, K, V, O projections), norm, MLP. With
    ``num_experts > 1`` every ``moe_layer_freq``-th layer replaces its MLP by ``num_experts``
    expert MLPs and a bias-free linear router, of which ``top_k`` run per token. The MoE
    fields (``top_k``, ``moe_ffn_hidden_size``, ``moe_layer_freq``) are ignored by dense
    models, except that ``top_k`` may not exceed ``num_experts``.

    MoE refinements: the first ``first_dense_layers`` layers keep a dense MLP and the
    rest follow ``moe_layer_freq``; ``num_shared_experts`` shared experts (together
    ``shared_expert_ffn_hidden_size`` wide) run on every token beside the routed ones;
    ``mtp_layers`` multi-token-prediction modules (a layer like the last one, a
    ``2h -> h`` projection and a second pass through the LM head each) follow the last
    layer. Attention refinements: ``mla`` replaces Q, K, V by latent projections
    (:class:`LatentAttention`); ``sliding_window_layers`` of the layers let each query
    see only the last ``sliding_window`` tokens; ``attention_sinks`` adds one learned
    logit per head and layer.
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
    first_dense_layers: int = Field(
        default=0,
        ge=0,
        le=FIELD_MAX["first_dense_layers"],
        description="Leading layers of an MoE model with a dense MLP.",
    )
    num_shared_experts: int = Field(
        default=0, ge=0, le=FIELD_MAX["num_shared_experts"], description="Experts of each MoE layer every token uses."
    )
    shared_expert_ffn_hidden_size: int | None = Field(
        default=None,
        gt=0,
        le=FIELD_MAX["shared_expert_ffn_hidden_size"],
        description="Inner size of all shared experts of a layer together; None = num_shared_experts x expert size.",
    )
    mtp_layers: int = Field(
        default=0, ge=0, le=FIELD_MAX["mtp_layers"], description="Multi-token-prediction modules after the last layer."
    )
    sliding_window: int | None = Field(
        default=None, gt=0, le=FIELD_MAX["sliding_window"], description="Keys a windowed layer's query sees, tokens."
    )
    sliding_window_layers: int = Field(
        default=0, ge=0, le=FIELD_MAX["sliding_window_layers"], description="Layers using sliding_window."
    )
    attention_sinks: bool = Field(default=False, description="One learned sink logit per head and layer.")
    mla: LatentAttention | None = Field(default=None, description="Multi-head latent attention; None = Q, K, V.")

    # ------------------------------------------------------------------ validation

    @model_validator(mode="after")
    def _check_shape(self) -> TransformerSpec:
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
        if self.num_experts > 1 and (self.num_layers - self.first_dense_layers) % self.moe_layer_freq:
            k = self.first_dense_layers
            rest = f"num_layers - first_dense_layers={self.num_layers}-{k}" if k else f"num_layers={self.num_layers}"
            raise ValueError(f"moe_layer_freq={self.moe_layer_freq} does not divide {rest}")
        self._check_refinements()
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

    def _check_refinements(self) -> None:
        """Rules of the MoE and attention refinements (see the class docstring)."""
        moe_only = {"first_dense_layers": self.first_dense_layers, "num_shared_experts": self.num_shared_experts}
        for name, value in moe_only.items():
            if value and self.num_experts == 1:
                raise ValueError(
                    f"{name}={value} needs a mixture-of-experts model (num_experts > 1); got num_experts=1"
                )
        if self.first_dense_layers >= self.num_layers:
            raise ValueError(
                f"first_dense_layers={self.first_dense_layers} leaves no MoE layer of num_layers={self.num_layers}; "
                "allowed: below num_layers"
            )
        if self.shared_expert_ffn_hidden_size is not None and not self.num_shared_experts:
            raise ValueError(
                f"shared_expert_ffn_hidden_size={self.shared_expert_ffn_hidden_size} needs num_shared_experts >= 1"
            )
        if self.sliding_window_layers > self.num_layers:
            raise ValueError(f"sliding_window_layers={self.sliding_window_layers} exceeds num_layers={self.num_layers}")
        if (self.sliding_window is None) != (self.sliding_window_layers == 0):
            raise ValueError(
                f"sliding_window={self.sliding_window} and sliding_window_layers={self.sliding_window_layers}: "
                "give both (the window, tokens, and how many layers use it) or neither"
            )
        if self.mla is not None and self.num_kv_heads not in (None, self.num_heads):
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} with mla: latent attention has one K/V per query head; "
                f"allowed: num_heads={self.num_heads} or none"
            )

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
        """Layers whose MLP is a set of experts: ``(L - first_dense_layers) // moe_layer_freq``, 0 when dense."""
        return (self.num_layers - self.first_dense_layers) // self.moe_layer_freq if self.is_moe else 0

    @property
    def shared_expert_ffn_size(self) -> int:
        """Inner size of a layer's shared experts together, elements (0 without shared experts)."""
        if not self.num_shared_experts:
            return 0
        if self.shared_expert_ffn_hidden_size is not None:
            return self.shared_expert_ffn_hidden_size
        return self.num_shared_experts * self.expert_ffn_size

    @property
    def qk_head_size(self) -> int:
        """Per-head size of Q and K, elements (``head_size``, or MLA's nope + rope part)."""
        return self.head_size if self.mla is None else self.mla.qk_head_dim

    @property
    def v_head_size(self) -> int:
        """Per-head size of V and the attention output, elements (``head_size``, or MLA's ``v_head_dim``)."""
        return self.head_size if self.mla is None else self.mla.v_head_dim

    @property
    def num_window_layers(self) -> int:
        """Layers attending over ``sliding_window`` tokens only (0 when none)."""
        return self.sliding_window_layers

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

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "model spec") -> TransformerSpec:
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
    def from_file(cls, path: str | Path) -> TransformerSpec:
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
                "use TransformerSpec.from_hf_config or TransformerSpec.load"
            )
        return cls.from_dict(data, where=str(path))

    @classmethod
    def from_name(cls, name: str) -> TransformerSpec:
        """Load a preset from the catalog by id, e.g. ``"llama2-7b"``.

        Matching ignores case, surrounding space and ``_``/space vs ``-``; when that finds
        nothing, ids are also compared with all separators removed (``"Llama-2-7B"``).

        Raises:
            UnknownEntryError: no such preset; suggests up to 3 close ids.
        """
        return _load_preset(resolve_preset_id(name))

    @classmethod
    def from_hf_config(
        cls, path_or_dict: str | Path | Mapping[str, Any], *, seq_len: int | None = None
    ) -> TransformerSpec:
        """Read a Hugging Face ``config.json`` (a path, a directory holding one, or its dict).

        The families read and how their keys map to fields are listed in
        :mod:`perfcast.features.hf_config`; an unknown ``model_type`` is read with the
        Llama keys and logs a warning.

        Args:
            path_or_dict: the config, as a file path, a directory or a parsed mapping.
            seq_len: training sequence length, tokens. Default
                ``min(max_position_embeddings, 4096)``, or 2048 when the config has no
                maximum.

        Raises:
            SpecError: unreadable file, missing keys (all named), an unknown activation, or
                an architecture perfcast cannot represent (Mamba layers, MLA keys outside
                the DeepSeek families, dense layers at arbitrary positions).
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
        fields = hf_model_fields(cfg, where)
        fields["name"] = hf_name(cfg, path)
        max_pos = fields.get("max_position_embeddings")
        if seq_len is None:
            seq_len = min(max_pos, HF_DEFAULT_MAX_SEQ_LEN) if max_pos else 2048
        fields["seq_len"] = seq_len
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise to_spec_error(exc, where) from None

    @classmethod
    def load(cls, ref: str | Path) -> TransformerSpec:
        """Resolve a model reference: a preset id, or a path to a Hugging Face
        ``config.json`` (or its directory) or to a perfcast spec JSON.

        An existing path wins over a preset id. A file is read as a Hugging Face config when
        it has ``model_type`` or ``architectures`` and no ``num_layers``.

        Raises:
            SpecError: a path-like reference that does not exist, or invalid content.
            UnknownEntryError: neither a path nor a preset id.
        """
        path = Path(ref)
        try:
            is_dir, is_file = path.is_dir(), path.is_file()
        except OSError:  # a name the file system refuses (too long ...) names no file
            is_dir = is_file = False
        if is_dir:
            return cls.from_hf_config(path)
        if is_file:
            data = read_json(path)
            if looks_like_hf_config(data):
                return cls.from_hf_config(path)
            return cls.from_dict(data, where=str(path))
        text = str(ref)
        if looks_like_path(text):
            raise SpecError(f"model={text!r}: no such file or directory")
        return cls.from_name(text)


@cache
def _load_preset(model_id: str) -> TransformerSpec:
    res = resources.files(CATALOG_PACKAGE).joinpath("catalog").joinpath("models").joinpath(f"{model_id}.json")
    where = f"model catalog entry {model_id!r}"
    try:
        data = json.loads(res.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{where}: cannot read: {exc}") from None
    return TransformerSpec.from_dict(data, where=where)


def looks_like_path(text: str) -> bool:
    """A ``model`` reference written as a file path (a ``.json`` name or one with a separator), not a preset id."""
    return text.endswith(".json") or "/" in text or "\\" in text
