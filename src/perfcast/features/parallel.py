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

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from perfcast.data.schema import FIELD_MAX, DType, Fp8Recipe
from perfcast.errors import SpecError
from perfcast.features.cluster import ClusterSpec
from perfcast.features.frameworks import DEFAULT_FRAMEWORK, Framework
from perfcast.features.model import TransformerSpec


class Recompute(str, Enum):
    """Activation recomputation mode: Megatron's ``selective`` and ``full`` (Korthikanti et al.
    2022), and torchtitan's ``op-sac`` (``activation_checkpoint.mode = "selective"`` with its
    default ``selective_ac_option = "op"``: each layer keeps its attention output, its
    tensor-parallel reduce-scatter outputs and the output of every other matmul; backward replays
    the rest). What each replays is :func:`perfcast.features.workload.replay_weights`."""

    NONE = "none"
    SELECTIVE = "selective"  # recompute the attention core (scores, softmax, context) only
    OP_SAC = "op-sac"  # torchtitan's op-level selective checkpointing: every other matmul and the vector ops
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
    context (sequence split of attention), ``ep`` expert parallelism and ``etp`` expert
    tensor parallelism. As in Megatron-Core's parallel folding, the expert layers lay
    their own ``etp x ep x edp`` grid over the ``tp x cp x dp`` ranks of one pipeline
    stage (``edp = tp*cp*dp / (ep*etp)`` expert-data-parallel ranks): ``ep*etp`` must
    divide ``tp*cp*dp``, experts are split ``num_experts/ep`` per rank and their GEMMs
    over ``etp`` ranks (not ``tp``). ``etp`` defaults to 1 (Megatron-LM's own default
    is ``tp``; state ``etp=tp`` to time such a run). ``vpp`` is the number of virtual pipeline
    stages (model chunks) per pipeline rank; ``vpp > 1`` selects the interleaved 1F1B
    schedule. Batches are counted in sequences. ``flash_attention`` (fused attention that
    keeps no score matrix) is the default of current frameworks; ``False`` models the
    unfused attention of Korthikanti et al. 2022, which stores the scores for backward.

    ``zero_stage`` shards the training state over the ``dp*cp`` data-parallel ranks:
    optimizer states from 1, gradients from 2, weights (gathered layer by layer) at 3.
    ``dp_replicate`` (default 1: one shard group) hybrid-shards it: the ``dp*cp`` ranks form
    ``dp_replicate`` replicas of ``dp*cp / dp_replicate`` consecutive ranks each (rank stride
    ``tp``), the state is sharded inside a replica and replicated across them, so the
    gradient reduce-scatter and weight gathers run inside a replica and each shard's
    gradients are all-reduced across the replicas (PyTorch HSDP / FSDP2's
    ``dp_replicate x dp_shard`` mesh, FSDP's ``HYBRID_SHARD``, DeepSpeed MiCS,
    Megatron-Core's ``num_distributed_optimizer_instances``). The expert state shards the
    same way over ``edp / dp_replicate`` ranks.
    ``overlap_grad_reduce`` starts the data-parallel gradient sync during the last
    microbatch's backward (Megatron-LM/NeMo ``overlap_grad_reduce``, Apex
    ``distributed_fused_adam``), so only the part longer than that backward is exposed;
    the default is the exposed sync of Megatron-DeepSpeed.

    ``document_tokens`` is the attention length of sequences packed from several documents
    with a per-document attention mask (NeMo's packed fine-tuning datasets, FlashAttention
    varlen / Transformer Engine THD): the fused attention core of each sequence runs as
    ``round(seq_len / document_tokens)`` documents over ``document_tokens`` keys each, the
    sequence's queries (``seq_len / cp`` per context-parallel rank) shared among them, so
    every token attends to ``document_tokens`` keys, as model FLOPs count it. For documents
    of unequal lengths ``d_i`` state ``sum(d_i**2) / sum(d_i)``, the length with the same
    attention FLOPs.
    ``None``: attention spans the whole sequence (pre-training, where Megatron-style
    stacks attend across the documents of a packed sequence). Unfused attention
    (``flash_attention=False``) computes the whole masked score matrix and is unchanged.

    Software (``docs/frameworks.md``): ``framework`` names the training framework whose
    shipped defaults filled the switches a row left unstated
    (:func:`~perfcast.features.frameworks.framework_fields`); it changes nothing by
    itself. ``tp_comm_overlap`` overlaps the sequence-parallel TP all-gathers and
    reduce-scatters with their neighbouring GEMMs (Transformer Engine userbuffers,
    torchtitan async TP; needs ``sequence_parallel`` when ``tp > 1``).
    ``overlap_param_gather`` hides the ZeRO-1/2 parameter all-gather behind the next
    forward; ``fsdp_prefetch`` hides ZeRO-3's per-layer weight gathers behind the previous
    layer's compute; ``ep_comm_overlap`` hides the expert all-to-all (dispatch and combine)
    behind the expert GEMMs beside it (Megatron-Core's ``overlap_moe_expert_parallel_comm``,
    DeepSeek's DualPipe: one microbatch's all-to-all beside another's compute);
    ``cuda_graphs`` removes the host dispatch floor; ``torch_compile`` adds no time to the
    composed step (the learned step model reads it as a feature). The composition rules are in
    :mod:`perfcast.features.schedule`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = Field(1, ge=1, le=FIELD_MAX["tp"])
    pp: int = Field(1, ge=1, le=FIELD_MAX["pp"])
    dp: int = Field(1, ge=1, le=FIELD_MAX["dp"])
    cp: int = Field(1, ge=1, le=FIELD_MAX["cp"])
    ep: int = Field(1, ge=1, le=FIELD_MAX["ep"])
    etp: int = Field(1, ge=1, le=FIELD_MAX["etp"])
    dp_replicate: int = Field(1, ge=1, le=FIELD_MAX["dp_replicate"])
    micro_batch: int = Field(1, ge=1, le=FIELD_MAX["micro_batch"])
    global_batch: int = Field(..., ge=1, le=FIELD_MAX["global_batch"])
    vpp: int = Field(1, ge=1, le=FIELD_MAX["vpp"])
    sequence_parallel: bool = False
    zero_stage: int = Field(0, ge=0, le=3)
    recompute: Recompute = Recompute.NONE
    finetune: Finetune = Finetune.FULL
    lora_rank: int = Field(0, ge=0, le=FIELD_MAX["lora_rank"])
    document_tokens: int | None = Field(None, ge=1, le=FIELD_MAX["document_tokens"])
    dtype: DType = DType.BF16
    fp8_recipe: Fp8Recipe | None = None
    flash_attention: bool = True
    overlap_grad_reduce: bool = False
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    first_stage_layers: int | None = Field(None, ge=1, le=FIELD_MAX["first_stage_layers"])
    last_stage_layers: int | None = Field(None, ge=1, le=FIELD_MAX["last_stage_layers"])
    framework: Framework = DEFAULT_FRAMEWORK
    tp_comm_overlap: bool = False
    overlap_param_gather: bool = False
    fsdp_prefetch: bool = False
    ep_comm_overlap: bool = False
    cuda_graphs: bool = False
    torch_compile: bool = False

    @field_validator("framework", mode="before")
    @classmethod
    def _parse_framework(cls, value: object) -> Framework:
        """``framework`` in any spelling :meth:`Framework.parse` accepts."""
        return Framework.parse(value)  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _check_tp_comm_overlap(self) -> ParallelConfig:
        if self.tp_comm_overlap and self.tp > 1 and not self.sequence_parallel:
            raise SpecError(
                f"tp_comm_overlap=true with tp={self.tp} needs sequence_parallel=true (userbuffers and async TP "
                "overlap the sequence-parallel all-gather and reduce-scatter); got sequence_parallel=false"
            )
        return self

    @model_validator(mode="after")
    def _check_torchtitan_recompute(self) -> ParallelConfig:
        """torchtitan has no Megatron-style selective recomputation: its ``selective`` is ``op-sac``."""
        if self.framework is Framework.TORCHTITAN and self.recompute is Recompute.SELECTIVE:
            raise SpecError(
                "recompute=selective with framework=torchtitan: torchtitan's selective activation checkpointing "
                "is op-level (each block keeps every other matmul output), not Megatron's attention-core "
                "recomputation; state recompute=op-sac, or full or none"
            )
        return self

    @model_validator(mode="after")
    def _check_pipeline_split_fields(self) -> ParallelConfig:
        """The uneven-pipeline switches' own rules (see :func:`pipeline_split`)."""
        stated = [(n, v) for n, v in (("first_stage_layers", self.first_stage_layers),
                                      ("last_stage_layers", self.last_stage_layers)) if v is not None]  # fmt: skip
        for name, value in stated:
            if self.pp == 1:
                raise SpecError(f"{name}={value} needs pp > 1 (it sizes a pipeline stage); got pp=1")
            if value % self.vpp:
                fix = (
                    "; to give the embedding's and the loss's stages one layer less under interleaving, state "
                    "account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split instead (each "
                    "counts as one layer of the split)"
                    if not (self.account_for_embedding_in_pipeline_split or self.account_for_loss_in_pipeline_split)
                    else ""
                )
                raise SpecError(
                    f"{name}={value} is not a multiple of vpp={self.vpp}: the stage's {self.vpp} model chunks "
                    f"hold {name}/vpp layers each; allowed: a multiple of {self.vpp}{fix}"
                )
        if stated and (self.account_for_embedding_in_pipeline_split or self.account_for_loss_in_pipeline_split):
            switch = "embedding" if self.account_for_embedding_in_pipeline_split else "loss"
            raise SpecError(
                f"{stated[0][0]}={stated[0][1]} with account_for_{switch}_in_pipeline_split=true: Megatron-Core "
                "takes either the first/last stage layer counts or the embedding/loss switches, not both"
            )
        return self

    @field_validator("fp8_recipe", mode="before")
    @classmethod
    def _parse_fp8_recipe(cls, value: object) -> Fp8Recipe | None:
        """``fp8_recipe`` (a :class:`Fp8Recipe` spelling) for fp8 and mxfp8 runs only; ``None``
        means the dtype's default (:meth:`Fp8Recipe.default_for`, see :attr:`scaling_recipe`)."""
        return None if value is None else Fp8Recipe.parse(value)

    @model_validator(mode="after")
    def _check_fp8_recipe(self) -> ParallelConfig:
        recipe = self.fp8_recipe
        if recipe is None:
            return self
        if self.dtype not in (DType.FP8, DType.MXFP8):
            raise SpecError(f"fp8_recipe={recipe.value} needs dtype fp8 or mxfp8; got dtype={self.dtype.value}")
        if self.dtype is DType.MXFP8 and recipe is not Fp8Recipe.MXFP8:
            raise SpecError(f"fp8_recipe={recipe.value} contradicts dtype=mxfp8; allowed with mxfp8: mxfp8")
        if self.dtype is DType.FP8 and recipe is Fp8Recipe.MXFP8:
            raise SpecError("fp8_recipe=mxfp8 with dtype=fp8: write dtype=mxfp8 (MXFP8 GEMMs need Blackwell)")
        return self

    @property
    def scaling_recipe(self) -> Fp8Recipe | None:
        """``fp8_recipe``, else the dtype's default; ``None`` for runs that are not fp8/mxfp8."""
        return self.fp8_recipe or Fp8Recipe.default_for(self.dtype)

    @model_validator(mode="after")
    def _check_own_fields(self) -> ParallelConfig:
        if self.global_batch % (self.dp * self.micro_batch):
            raise SpecError(
                f"global_batch={self.global_batch} is not a multiple of "
                f"dp*micro_batch={self.dp}*{self.micro_batch}={self.dp * self.micro_batch}"
            )
        if self.vpp > 1 and self.pp == 1:
            raise SpecError(f"vpp={self.vpp} needs pp > 1 (interleaving splits pipeline stages); got pp=1")
        block = self.tp * self.cp * self.dp
        if block % (self.ep * self.etp):
            raise SpecError(
                f"ep*etp={self.ep}*{self.etp}={self.ep * self.etp} does not divide tp*cp*dp={self.tp}*{self.cp}*"
                f"{self.dp}={block}: expert ranks fold over one pipeline stage's tp*cp*dp ranks (Megatron-Core); "
                f"allowed: ep*etp dividing {block}, so ep <= {block // self.etp} at etp={self.etp}"
            )
        self._check_dp_replicate()
        if self.finetune is Finetune.LORA and self.lora_rank < 1:
            raise SpecError(f"finetune=lora needs lora_rank >= 1; got lora_rank={self.lora_rank}")
        if self.finetune.trains_all_weights and self.lora_rank:
            raise SpecError(
                f"lora_rank={self.lora_rank} is set but finetune={self.finetune.value}; use finetune=lora"
            )
        return self

    def _check_dp_replicate(self) -> None:
        """Hybrid sharding's rules: replicas of ZeRO-sharded state that split both data-parallel groups."""
        r = self.dp_replicate
        if r == 1:
            return
        if self.zero_stage == 0:
            raise SpecError(
                f"dp_replicate={r} replicates ZeRO-sharded state, but zero_stage=0 shards nothing (every rank "
                "holds a replica; an unstated zero_stage takes the framework's default, 0 for megatron-deepspeed "
                "and deepspeed); allowed: zero_stage 1-3 with dp_replicate > 1, or dp_replicate=1"
            )
        ranks = self.dp * self.cp
        if ranks % r:
            raise SpecError(
                f"dp_replicate={r} does not divide dp*cp={self.dp}*{self.cp}={ranks}: each replica shards the state "
                f"over dp*cp/dp_replicate ranks; allowed: a divisor of {ranks}"
            )
        if self.edp % r:
            raise SpecError(
                f"dp_replicate={r} does not divide the expert-data-parallel ranks edp=tp*cp*dp/(ep*etp)={self.edp}: "
                "the expert state shards over edp/dp_replicate ranks; allowed: a divisor of both "
                f"dp*cp={ranks} and edp={self.edp}"
            )

    @property
    def zero_shard_ranks(self) -> int:
        """Ranks that ZeRO shards the dense training state over: ``dp*cp / dp_replicate``."""
        return self.dp * self.cp // self.dp_replicate

    @property
    def expert_shard_ranks(self) -> int:
        """Ranks that ZeRO shards the routed experts' training state over: ``edp / dp_replicate``."""
        return self.edp // self.dp_replicate

    @property
    def world_size(self) -> int:
        """GPUs the layout occupies: tp*pp*dp*cp (ep and etp fold over the same ranks)."""
        return self.tp * self.pp * self.dp * self.cp

    @property
    def edp(self) -> int:
        """Expert-data-parallel ranks: ``tp*cp*dp / (ep*etp)``, the ranks holding the same experts."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    def attention_documents(self, seq_len: int) -> tuple[int, int]:
        """``(documents, tokens)`` per sequence of ``seq_len`` tokens that the attention core
        runs over: ``(1, seq_len)``, or the packed documents of ``document_tokens``."""
        if self.document_tokens is None:
            return 1, seq_len
        return max(1, round(seq_len / self.document_tokens)), self.document_tokens

    @property
    def num_microbatches(self) -> int:
        """Microbatches each pipeline processes per step (gradient-accumulation steps)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def hides_expert_all_to_all(self) -> bool:
        """Whether ``ep_comm_overlap`` has something to hide and something to hide behind: expert
        all-to-alls (``ep > 1``) and another microbatch's compute (more than one microbatch)."""
        return self.ep_comm_overlap and self.ep > 1 and self.num_microbatches > 1


def check_layout(model: TransformerSpec, parallel: ParallelConfig, cluster: ClusterSpec) -> None:
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
    pipeline_split(m.num_layers, p)
    if p.vpp > 1 and p.num_microbatches % p.pp:
        raise SpecError(
            f"the interleaved schedule (vpp={p.vpp}) needs the number of microbatches, global_batch / "
            f"(micro_batch * dp) = {p.num_microbatches}, to be a multiple of pp={p.pp}; allowed: a global_batch "
            f"that makes it one (a multiple of {p.micro_batch * p.dp * p.pp}), or vpp=1"
        )
    if m.seq_len % p.cp:
        raise SpecError(f"cp={p.cp} does not divide seq_len={m.seq_len}")
    if p.document_tokens is not None and not p.cp <= p.document_tokens <= m.seq_len:
        raise SpecError(
            f"document_tokens={p.document_tokens} must lie between cp={p.cp} (each context-parallel rank holds "
            f"part of every document) and seq_len={m.seq_len} (documents are packed into a sequence)"
        )
    if p.sequence_parallel and (m.seq_len // p.cp) % p.tp:
        raise SpecError(
            f"sequence_parallel needs tp={p.tp} to divide the per-rank sequence seq_len/cp={m.seq_len // p.cp}"
        )
    for name, degree in (("ep", p.ep), ("etp", p.etp)):
        if degree > 1 and not m.is_moe:
            raise SpecError(f"{name}={degree} needs a mixture-of-experts model; {m.name} has num_experts=1")
    if m.is_moe and m.num_experts % p.ep:
        raise SpecError(f"ep={p.ep} does not divide num_experts={m.num_experts}; allowed: a divisor of it")
    if m.is_moe and m.expert_ffn_size % p.etp:
        raise SpecError(
            f"etp={p.etp} does not divide the expert ffn size moe_ffn_hidden_size={m.expert_ffn_size} "
            "(expert GEMMs split over etp ranks); allowed: a divisor of it"
        )
    if m.mla is not None and p.finetune is Finetune.LORA:
        raise SpecError(
            "finetune=lora with multi-head latent attention (mla) is not modelled; allowed: finetune=full or sft"
        )
    if m.shared_expert_ffn_size % p.tp:
        raise SpecError(f"tp={p.tp} does not divide the shared experts' ffn size {m.shared_expert_ffn_size}")


def padded_vocab_size(model: TransformerSpec, tp: int, multiple: int = 128) -> int:
    """Vocabulary rows after Megatron's padding to a multiple of ``multiple * tp``."""
    step = multiple * tp
    return -(-model.vocab_size // step) * step


DEFAULT_SPLIT_NAME = "pipeline_layout"
"""The name ``defaulted_fields`` gives the fallback split of :func:`pipeline_split` (rule 4),
which no run-table column states: layers spread over the virtual stages as Megatron-Core's
``pipeline_model_parallel_layout`` would place them."""


@dataclass(frozen=True)
class PipelineSplit:
    """Transformer layers of each pipeline stage of a layout.

    Attributes:
        layers: layers of each virtual stage in model order; virtual stage ``c * pp + r``
            is model chunk ``c`` of pipeline rank ``r`` (``pp * vpp`` entries).
        pp, vpp: the layout's pipeline and virtual-pipeline degrees.
        defaulted: the run-table names of the switches :func:`pipeline_split` chose because
            the row stated none and ``pp * vpp`` does not divide the layers (empty otherwise).
    """

    layers: tuple[int, ...]
    pp: int
    vpp: int
    defaulted: tuple[str, ...] = ()

    @property
    def rank_layers(self) -> tuple[int, ...]:
        """Layers of each pipeline rank (its ``vpp`` chunks together)."""
        return tuple(sum(self.layers[r :: self.pp]) for r in range(self.pp))

    @property
    def is_even(self) -> bool:
        """Every pipeline rank holds the same number of layers."""
        return len(set(self.rank_layers)) == 1


def pipeline_split(num_layers: int, parallel: ParallelConfig) -> PipelineSplit:
    """How a layout spreads ``num_layers`` transformer layers over its pipeline stages.

    Stated switches follow Megatron-Core (``TransformerConfig`` and
    ``get_num_layers_to_build``):

    * ``first_stage_layers`` / ``last_stage_layers`` (``num_layers_in_first_pipeline_stage``
      / ``..._last_...``, formerly ``decoder_first/last_pipeline_num_layers``): pipeline
      rank 0 / ``pp - 1`` holds that many layers, ``vpp`` chunks of equal size; the other
      layers split evenly over the middle ranks and their chunks.
    * ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``:
      the embedding / the loss counts as one layer in the split, so ``num_layers`` plus
      the switches on split evenly over the ``pp * vpp`` virtual stages, and the first /
      last virtual stage builds one layer less.
    * Neither: ``pp * vpp`` must divide ``num_layers`` (the even split).

    With no switch stated and ``pp * vpp`` not dividing ``num_layers``, Megatron-Core
    refuses the layout; perfcast assumes the split a user would configure instead, the
    first rule that applies:

    1. both ``account_for_*`` switches, when ``pp * vpp`` divides ``num_layers + 2`` (the
       NeMo and Megatron recipe of Llama 3.1 405B: 126 layers at pp=8, vpp=8);
    2. ``account_for_loss_in_pipeline_split`` alone, when ``pp * vpp`` divides
       ``num_layers + 1`` (the LM head and loss outweigh the embedding lookup, so the last
       stage gives up the layer);
    3. ``first_stage_layers`` and ``last_stage_layers``, when ``num_layers`` is a multiple
       of ``vpp`` and ``pp > 2``: the middle ranks hold ``vpp * ceil(num_layers / (pp * vpp))``
       layers each (the largest rank of rule 4), the first and last ranks share the rest,
       the first the larger half in whole chunks, if both keep a layer per chunk (the end
       ranks, which also run the embedding and the loss, are never the larger);
    4. ``pipeline_layout`` (:data:`DEFAULT_SPLIT_NAME`): ``floor(num_layers / (pp * vpp))``
       layers per virtual stage and the remainder one each on middle ranks' chunks first
       (chunk by chunk across ranks, so ranks differ by at most one), then on the end
       ranks' chunks other than the first and the last virtual stage (which hold the
       embedding and the loss). Megatron-Core states such a split as a
       ``pipeline_model_parallel_layout``, which the run table cannot express yet.

    Rules 1 and 2 apply only when every virtual stage keeps at least one layer, and every
    rule needs at least one layer per virtual stage. The result names the rule's
    switches in ``defaulted``.

    Raises:
        SpecError: the stated switches do not fit ``num_layers`` (naming the fields, the
            values and what is allowed), or ``pp * vpp`` exceeds ``num_layers``.
    """
    p = parallel
    return _split(
        num_layers, p.pp, p.vpp, p.account_for_embedding_in_pipeline_split, p.account_for_loss_in_pipeline_split,
        p.first_stage_layers, p.last_stage_layers,
    )  # fmt: skip


@lru_cache(maxsize=4096)
def _split(
    num_layers: int, pp: int, vpp: int, emb: bool, loss: bool, first: int | None, last: int | None
) -> PipelineSplit:
    n_virtual = pp * vpp
    if first is not None or last is not None:
        return _first_last_split(num_layers, pp, vpp, first, last)
    if pp > 1 and (emb or loss):
        total = num_layers + emb + loss
        if total % n_virtual:
            raise SpecError(
                f"pp*vpp={pp}*{vpp}={n_virtual} does not divide num_layers+{emb + loss}={total} (num_layers="
                f"{num_layers}, the embedding/loss counted as layers by the account_for_* switches); allowed: "
                "switches that make it a multiple of pp*vpp"
            )
        return _counted_split(num_layers, pp, vpp, emb, loss, ())
    if num_layers % n_virtual == 0:
        return PipelineSplit((num_layers // n_virtual,) * n_virtual, pp, vpp)
    if n_virtual > num_layers:
        switches = {1: "account_for_loss_in_pipeline_split",
                    2: "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split"}  # fmt: skip
        counted = [n for n in switches if num_layers + n == n_virtual]
        hint = f", or state {switches[counted[0]]} (num_layers+{counted[0]}={n_virtual})" if counted else ""
        raise SpecError(
            f"pp*vpp={pp}*{vpp}={n_virtual} exceeds num_layers={num_layers}: every virtual pipeline stage needs a "
            f"layer; allowed: {f'vpp at most {num_layers // pp}' if pp <= num_layers else f'pp at most {num_layers}'}"
            f"{hint}"
        )
    emb_name, loss_name = "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"
    for emb, loss, names in ((True, True, (emb_name, loss_name)), (False, True, (loss_name,))):
        total = num_layers + emb + loss
        if total % n_virtual == 0 and total // n_virtual >= 2:
            return _counted_split(num_layers, pp, vpp, emb, loss, names)
    ends = _default_first_last(num_layers, pp, vpp)
    if ends is not None:
        split = _first_last_split(num_layers, pp, vpp, *ends)
        return PipelineSplit(split.layers, pp, vpp, ("first_stage_layers", "last_stage_layers"))
    return _spread_split(num_layers, pp, vpp)


def _counted_split(num_layers: int, pp: int, vpp: int, emb: bool, loss: bool, names: tuple[str, ...]) -> PipelineSplit:
    """The ``account_for_*`` split: the embedding/loss count as a layer of the first/last virtual stage."""
    per = (num_layers + emb + loss) // (pp * vpp)
    layers = [per] * (pp * vpp)
    layers[0] -= emb
    layers[-1] -= loss
    return PipelineSplit(tuple(layers), pp, vpp, names)


def _first_last_split(num_layers: int, pp: int, vpp: int, first: int | None, last: int | None) -> PipelineSplit:
    """Megatron-Core's ``num_layers_in_first/last_pipeline_stage`` split (checked against ``num_layers``)."""
    stated = [(n, v) for n, v in (("first_stage_layers", first), ("last_stage_layers", last)) if v is not None]
    middle_ranks = pp - len(stated)
    rest = num_layers - sum(v for _, v in stated)
    given = ", ".join(f"{n}={v}" for n, v in stated)
    if rest < middle_ranks * vpp:
        raise SpecError(
            f"{given} leave {rest} of num_layers={num_layers} for {middle_ranks} other pipeline ranks of vpp={vpp} "
            f"chunks; allowed: at most num_layers - {middle_ranks * vpp} in all (a layer per chunk)"
        )
    if middle_ranks == 0 and rest:
        raise SpecError(
            f"{given} hold {num_layers - rest} layers but num_layers={num_layers} and pp={pp} leaves no middle "
            "stage; allowed: first_stage_layers + last_stage_layers = num_layers"
        )
    if middle_ranks and rest % (middle_ranks * vpp):
        raise SpecError(
            f"{given} leave {rest} of num_layers={num_layers} layers, which do not split evenly over the "
            f"{middle_ranks} other pipeline ranks of vpp={vpp} chunks ({middle_ranks * vpp} virtual stages); "
            f"allowed: values leaving a multiple of {middle_ranks * vpp}"
        )
    per_rank = [rest // middle_ranks if middle_ranks else 0] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    layers = tuple(per_rank[v % pp] // vpp for v in range(pp * vpp))
    return PipelineSplit(layers, pp, vpp)


def _default_first_last(num_layers: int, pp: int, vpp: int) -> tuple[int, int] | None:
    """Rule 3 of :func:`pipeline_split`: (first, last) stage layers, or None when none qualifies."""
    if pp < 3 or num_layers % vpp:
        return None
    middle = vpp * -(-num_layers // (pp * vpp))  # the largest rank of the spread split
    rest = num_layers - (pp - 2) * middle
    if rest < 2 * vpp:
        return None
    first = vpp * -(-rest // (2 * vpp))
    return first, rest - first


def _spread_split(num_layers: int, pp: int, vpp: int) -> PipelineSplit:
    """Rule 4 of :func:`pipeline_split`: even spread, the remainder on middle ranks' chunks first."""
    n_virtual = pp * vpp
    layers = [num_layers // n_virtual] * n_virtual
    middle = [c * pp + r for c in range(vpp) for r in range(1, pp - 1)]
    ends = [v for c in range(1, vpp) for v in (c * pp, c * pp - 1)]  # rank 0 before rank pp - 1, chunk by chunk
    for v in (middle + ends + [0, n_virtual - 1])[: num_layers % n_virtual]:
        layers[v] += 1
    return PipelineSplit(tuple(layers), pp, vpp, (DEFAULT_SPLIT_NAME,))
