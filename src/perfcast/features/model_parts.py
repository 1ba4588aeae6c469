"""The parts a model spec names: normalisation, activation, position embedding, latent attention."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from perfcast.data.schema import FIELD_MAX


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


class LatentAttention(BaseModel):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): the sizes of one layer, elements.

    With ``nh`` heads: Q is ``h -> q_lora_rank`` (RMS-normed) ``-> nh·(qk_nope_head_dim +
    qk_rope_head_dim)``, or ``h ->`` that directly when ``q_lora_rank`` is None; K and V
    come from one latent ``h -> kv_lora_rank + qk_rope_head_dim`` (the rope part is one key
    shared by all heads; the rest RMS-normed) ``-> nh·(qk_nope_head_dim + v_head_dim)``; the
    output projection is ``nh·v_head_dim -> h``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    q_lora_rank: int | None = Field(default=None, gt=0, le=FIELD_MAX["q_lora_rank"], description="Q latent size.")
    kv_lora_rank: int = Field(gt=0, le=FIELD_MAX["kv_lora_rank"], description="K/V latent size.")
    qk_nope_head_dim: int = Field(gt=0, le=FIELD_MAX["head_dim"], description="Per-head Q/K size without rope.")
    qk_rope_head_dim: int = Field(ge=0, le=FIELD_MAX["head_dim"], description="Per-head Q/K size with rope.")
    v_head_dim: int = Field(gt=0, le=FIELD_MAX["head_dim"], description="Per-head V size.")

    @property
    def qk_head_dim(self) -> int:
        """Per-head size of Q and K: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim
