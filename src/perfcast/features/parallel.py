"""Parallel layout of a training run: how a model is split over GPUs and batched.

``ParallelConfig`` checks the rules that involve only its own fields when it is built;
``check_layout`` checks the rules that tie it to a model and a cluster
(``tp*pp*dp*cp == num_gpus``, ``tp`` divides the heads, ...). Messages name the fields
and values. ``check_layout`` raises :class:`~perfcast.errors.SpecError`; building a
``ParallelConfig`` directly raises :class:`pydantic.ValidationError` (a ``ValueError``,
as pydantic wraps validator errors), which :func:`~perfcast.features.run_config.parse_run_row`
turns back into a ``SpecError``.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfcast.data.schema import FIELD_MAX, DType
from perfcast.errors import SpecError
from perfcast.features.hardware import ClusterSpec
from perfcast.features.model import ModelSpec


class Recompute(str, Enum):
    """Activation recomputation mode (Korthikanti et al. 2022)."""

    NONE = "none"
    SELECTIVE = "selective"  # recompute the attention core (scores, softmax, context) only
    FULL = "full"  # keep each layer's input, recompute the whole layer in backward


class Finetune(str, Enum):
    """Which weights are trained: all of them (pre-training ``full``, or ``sft``: full-parameter
    supervised fine-tuning, the same graph on packed sequences), or low-rank adapters on a
    frozen base (``lora``: no weight gradients or optimizer state for the base, activation
    gradients still flow through it)."""

    FULL = "full"
    SFT = "sft"
    LORA = "lora"

    @property
    def trains_all_weights(self) -> bool:
        """Every weight gets a gradient and optimizer state (``full`` and ``sft``)."""
        return self is not Finetune.LORA


class ParallelConfig(BaseModel):
    """Parallel degrees, batching and memory-saving options of one training run.

    Degrees follow Megatron-LM: ``tp`` tensor, ``pp`` pipeline, ``dp`` data, ``cp``
    context (sequence split of attention), ``ep`` expert parallelism (experts split over
    ``ep`` ranks of the data-parallel group). ``vpp`` is the number of virtual pipeline
    stages (model chunks) per pipeline rank; ``vpp > 1`` selects the interleaved 1F1B
    schedule. Batches are counted in sequences. ``flash_attention`` (fused attention that
    keeps no score matrix) is the default of current frameworks; ``False`` models the
    unfused attention of Korthikanti et al. 2022, which stores the scores for backward.
    ``overlap_grad_reduce`` starts the data-parallel gradient sync during the last
    microbatch's backward (Megatron-LM/NeMo ``overlap_grad_reduce``, Apex
    ``distributed_fused_adam``), so only the part longer than that backward is exposed;
    the default is the exposed sync of Megatron-DeepSpeed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = Field(1, ge=1, le=FIELD_MAX["tp"])
    pp: int = Field(1, ge=1, le=FIELD_MAX["pp"])
    dp: int = Field(1, ge=1, le=FIELD_MAX["dp"])
    cp: int = Field(1, ge=1, le=FIELD_MAX["cp"])
    ep: int = Field(1, ge=1, le=FIELD_MAX["ep"])
    micro_batch: int = Field(1, ge=1, le=FIELD_MAX["micro_batch"])
    global_batch: int = Field(..., ge=1, le=FIELD_MAX["global_batch"])
    vpp: int = Field(1, ge=1, le=FIELD_MAX["vpp"])
    sequence_parallel: bool = False
    zero_stage: int = Field(0, ge=0, le=3)
    recompute: Recompute = Recompute.NONE
    finetune: Finetune = Finetune.FULL
    lora_rank: int = Field(0, ge=0, le=FIELD_MAX["lora_rank"])
    dtype: DType = DType.BF16
    flash_attention: bool = True
    overlap_grad_reduce: bool = False

    @model_validator(mode="after")
    def _check_own_fields(self) -> ParallelConfig:
        if self.global_batch % (self.dp * self.micro_batch):
            raise SpecError(
                f"global_batch={self.global_batch} is not a multiple of "
                f"dp*micro_batch={self.dp}*{self.micro_batch}={self.dp * self.micro_batch}"
            )
        if self.vpp > 1 and self.pp == 1:
            raise SpecError(f"vpp={self.vpp} needs pp > 1 (interleaving splits pipeline stages); got pp=1")
        if self.ep > self.dp * self.cp:
            raise SpecError(
                f"ep={self.ep} exceeds dp*cp={self.dp * self.cp}: experts are split over data-parallel ranks"
            )
        if (self.dp * self.cp) % self.ep:
            raise SpecError(f"ep={self.ep} does not divide dp*cp={self.dp * self.cp}")
        if self.finetune is Finetune.LORA and self.lora_rank < 1:
            raise SpecError(f"finetune=lora needs lora_rank >= 1; got lora_rank={self.lora_rank}")
        if self.finetune.trains_all_weights and self.lora_rank:
            raise SpecError(
                f"lora_rank={self.lora_rank} is set but finetune={self.finetune.value}; use finetune=lora"
            )
        return self

    @property
    def world_size(self) -> int:
        """GPUs the layout occupies: tp*pp*dp*cp (ep reuses data-parallel ranks)."""
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        """Microbatches each pipeline processes per step (gradient-accumulation steps)."""
        return self.global_batch // (self.dp * self.micro_batch)


def check_layout(model: ModelSpec, parallel: ParallelConfig, cluster: ClusterSpec) -> None:
    """Check the rules that tie a layout to its model and cluster.

    Raises:
        SpecError: the first rule broken, naming the fields and values.
    """
    p, m = parallel, model
    if p.world_size != cluster.num_gpus:
        raise SpecError(
            f"tp*pp*dp*cp={p.tp}*{p.pp}*{p.dp}*{p.cp}={p.world_size} does not equal num_gpus={cluster.num_gpus}"
        )
    if m.num_heads % p.tp:
        raise SpecError(f"tp={p.tp} does not divide num_heads={m.num_heads}")
    if m.kv_heads % p.tp and p.tp % m.kv_heads:
        raise SpecError(
            f"tp={p.tp} and num_kv_heads={m.kv_heads}: one must divide the other (KV heads are split or replicated)"
        )
    if m.ffn_size % p.tp:
        raise SpecError(f"tp={p.tp} does not divide ffn_hidden_size={m.ffn_size}")
    if m.num_layers % (p.pp * p.vpp):
        raise SpecError(f"pp*vpp={p.pp}*{p.vpp}={p.pp * p.vpp} does not divide num_layers={m.num_layers}")
    if p.vpp > 1 and p.num_microbatches % p.pp:
        raise SpecError(
            f"the interleaved schedule (vpp={p.vpp}) needs the number of microbatches "
            f"({p.num_microbatches}) to be a multiple of pp={p.pp}"
        )
    if m.seq_len % p.cp:
        raise SpecError(f"cp={p.cp} does not divide seq_len={m.seq_len}")
    if p.sequence_parallel and (m.seq_len // p.cp) % p.tp:
        raise SpecError(
            f"sequence_parallel needs tp={p.tp} to divide the per-rank sequence seq_len/cp={m.seq_len // p.cp}"
        )
    if p.ep > 1 and not m.is_moe:
        raise SpecError(f"ep={p.ep} needs a mixture-of-experts model; {m.name} has num_experts=1")
    if m.is_moe and m.num_experts % p.ep:
        raise SpecError(f"ep={p.ep} does not divide num_experts={m.num_experts}")
    if m.is_moe and m.expert_ffn_size % p.tp:
        raise SpecError(f"tp={p.tp} does not divide the expert ffn size {m.expert_ffn_size}")


def padded_vocab_size(model: ModelSpec, tp: int, multiple: int = 128) -> int:
    """Vocabulary rows after Megatron's padding to a multiple of ``multiple * tp``."""
    step = multiple * tp
    return -(-model.vocab_size // step) * step
