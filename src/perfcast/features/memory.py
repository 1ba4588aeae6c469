"""Peak memory per GPU of a training run: weights, gradients, optimizer state, activations.

Model states follow the ZeRO paper (Rajbhandari et al. 2020): with 16-bit training each
parameter holds 2 bytes of weights, 2 of gradients and 12 of optimizer state (fp32
master weights and two Adam moments); fp32 training holds 4 + 4 + 8. ZeRO stage 1 shards
the optimizer state over the ``dp*cp`` data-parallel ranks, stage 2 the gradients too,
stage 3 the weights too; the routed experts' states shard over the ``edp`` expert-data-parallel
ranks (``tp*cp*dp / (ep*etp)``) instead. Hybrid sharding (``dp_replicate > 1``) shards each
over one replica's ranks only, ``dp*cp / dp_replicate`` and ``edp / dp_replicate``. LoRA keeps
the frozen base weights (sharded like the weights at stage 3: FSDP shards every parameter,
frozen or not, and gathers them per layer as the workload graph does), and gradients and
optimizer state for the adapters.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models"), generalised to grouped-query attention, gated MLPs and context
parallelism. Per layer and microbatch, with ``s`` the per-rank sequence, ``b`` the
microbatch, ``h`` the width, ``a`` the heads and ``t`` the tensor-parallel size, the
16-bit activations of a GPT layer are ``s*b*h*(34 + 5*a*s/h)`` bytes without
parallelism; ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` with tensor parallelism;
``s*b*h/t*(34 + 5*a*s/h)`` with sequence parallelism too. Selective recomputation drops
the ``5*a*s/h`` attention term, and so does FlashAttention (``flash_attention=True``,
the default), which never stores the scores; full recomputation keeps only the layer input,
``2*s*b*h`` (divided by ``t`` with sequence parallelism). torchtitan's ``op-sac`` keeps the
layer input, the fused attention output, the reduce-scatter outputs (with sequence
parallelism) and the outputs of the matmuls its policy does not replay, read off the layer's
nodes (:func:`~perfcast.features.workload.op_sac_kept_bytes`): in a Llama block Q, V and the
gate, split over ``t``, and the down projection's, ``2*s*b*h`` whole on every rank (the
partial sum before its reduce-scatter). The first pipeline stage holds
``min(m, pp)`` microbatches in flight under 1F1B, times ``1 + (pp-1)/(pp*vpp)`` when
interleaved.

When pipeline ranks hold different layers (an uneven split, see
:func:`~perfcast.features.parallel.pipeline_split`), each rank is sized with its own
layers, its embedding or LM head, and its own microbatches in flight: ``min(m, pp - r)``
on rank ``r`` under 1F1B, ``(2*(pp - r - 1) + (vpp - 1)*pp + 1) / vpp`` interleaved
(Megatron-LM's warm-up plus one, in whole-rank microbatches; both give the figures above
on rank 0); the peak is the largest rank's total. With equal ranks the first stage is the
largest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfcast.data.schema import DType
from perfcast.features.cluster import ClusterSpec
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import Finetune, ParallelConfig, Recompute, padded_vocab_size
from perfcast.features.run_config import RunConfig
from perfcast.features.workload import layers_per_rank, op_sac_kept_bytes, trainable_params_per_rank

GIB = 1024**3
USABLE_MEMORY_FRACTION = 0.9
"""Share of the datasheet memory a training process can fill: the CUDA context, NCCL
buffers and allocator fragmentation take the rest (a rule of thumb, not a measurement)."""


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak memory of one GPU on the busiest stage, GiB."""

    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float

    @property
    def total_gib(self) -> float:
        """Sum of the parts, GiB."""
        return self.weights_gib + self.grads_gib + self.optimizer_gib + self.activations_gib

    def fits(self, mem_gib: float) -> bool:
        """Whether the total fits in ``USABLE_MEMORY_FRACTION`` of ``mem_gib``."""
        return self.total_gib <= USABLE_MEMORY_FRACTION * mem_gib


def activation_bytes_per_layer(model: TransformerSpec, parallel: ParallelConfig, *, moe: bool = False) -> float:
    """Activation bytes one layer keeps for backward, per microbatch per GPU (see module doc)."""
    p = parallel
    s = model.seq_len // p.cp
    b, h, t = p.micro_batch, model.hidden_size, p.tp
    sbh = s * b * h
    if p.recompute is Recompute.FULL:
        return 2.0 * sbh / (t if p.sequence_parallel else 1)
    if p.recompute is Recompute.OP_SAC:
        return op_sac_kept_bytes(model, p, moe=moe)
    q_width = model.num_heads * model.qk_head_size
    kv_width = model.kv_heads * ((model.qk_head_size + model.v_head_size) // 2)
    tokens = s * b
    if moe:
        ffn, routed = model.expert_ffn_size, model.top_k
    else:
        ffn, routed = model.ffn_size, 1
    mlp_inner = (6.0 if model.gated_mlp else 4.0) * tokens * ffn * routed  # act input(s) and down-proj input
    if moe and model.num_shared_experts:
        mlp_inner += (6.0 if model.gated_mlp else 4.0) * tokens * model.shared_expert_ffn_size
    # Q, K, V, the context (output-projection input) and the MLP inner tensors split over tp.
    split = 2.0 * tokens * (2 * q_width + 2 * kv_width) + mlp_inner
    replicated = 10.0 * sbh  # two norm inputs, QKV and MLP inputs, two dropout masks
    keeps_scores = p.recompute is Recompute.NONE and not p.flash_attention
    scores = 5.0 * model.num_heads * s * model.seq_len * b if keeps_scores else 0.0
    if p.sequence_parallel:
        return (replicated + split + scores) / t
    return replicated + (split + scores) / t


def _in_flight_microbatches(p: ParallelConfig) -> float:
    flight = float(min(p.num_microbatches, p.pp))
    if p.vpp > 1:
        flight *= 1.0 + (p.pp - 1) / (p.pp * p.vpp)
    return flight


def peak_memory(model: TransformerSpec, parallel: ParallelConfig, cluster: ClusterSpec) -> MemoryBreakdown:
    """Peak memory per GPU of the fullest pipeline stage (weights and in-flight activations):
    the first one when every stage holds the same layers (see the module docstring)."""
    inputs = _memory_inputs(model, parallel, trainable_params_per_rank, activation_bytes_per_layer)
    parts = _memory_parts(np.array([inputs], dtype=object))
    return MemoryBreakdown(**{name: float(values[0]) for name, values in parts.items()})


_INPUTS = ("full_dense", "full_expert", "dense", "expert", "shard_ranks", "expert_shard_ranks", "zero_stage", "wide",
           "lora", "per_microbatch", "in_flight", "logits")  # fmt: skip
"""What :func:`_memory_parts` computes memory from, per config."""


def _memory_inputs(
    model: TransformerSpec, p: ParallelConfig, params: Callable[..., tuple[int, int]], layer_bytes: Callable[..., float]
) -> tuple[Any, ...]:
    """The :data:`_INPUTS` of one config, with the parameter and activation counts of ``params`` and
    ``layer_bytes`` (:func:`trainable_params_per_rank` and :func:`activation_bytes_per_layer`, or memos of them)."""
    ranks = layers_per_rank(model, p)
    if len(set(ranks)) > 1:
        return _fullest_rank_inputs(model, p, ranks, params, layer_bytes)
    layers = model.num_layers // p.pp
    moe_layers = -(-model.num_moe_layers // p.pp) if model.is_moe else 0
    per_mb = (layers - moe_layers) * layer_bytes(model, p) + moe_layers * layer_bytes(model, p, moe=True)
    # the logits of the one stage that also holds the loss, fp32
    logits = 4.0 * p.micro_batch * (model.seq_len // p.cp) * padded_vocab_size(model, p.tp) / p.tp if p.pp == 1 else 0
    return (*params(model, p, finetune=Finetune.FULL), *params(model, p), p.zero_shard_ranks, p.expert_shard_ranks,
            p.zero_stage, p.dtype in (DType.FP32, DType.TF32), p.finetune is Finetune.LORA, per_mb,
            _in_flight_microbatches(p), logits)  # fmt: skip


def _fullest_rank_inputs(
    model: TransformerSpec,
    p: ParallelConfig,
    ranks: Sequence[tuple[int, int]],
    params: Callable[..., tuple[int, int]],
    layer_bytes: Callable[..., float],
) -> tuple[Any, ...]:
    """The :data:`_INPUTS` of the pipeline rank with the largest total, ranks holding ``ranks``
    (dense, MoE) layers; ``pp > 1``, so no rank keeps the logits."""
    dense_bytes, moe_bytes = layer_bytes(model, p), layer_bytes(model, p, moe=True) if model.is_moe else 0.0
    m = p.num_microbatches
    rows = []
    for r, (dense, moe) in enumerate(ranks):
        if p.vpp > 1:
            in_flight = min(float(m), (2 * (p.pp - r - 1) + (p.vpp - 1) * p.pp + 1) / p.vpp)
        else:
            in_flight = float(min(m, p.pp - r))
        rows.append((*params(model, p, finetune=Finetune.FULL, rank=r), *params(model, p, rank=r),
                     p.zero_shard_ranks, p.expert_shard_ranks, p.zero_stage, p.dtype in (DType.FP32, DType.TF32),
                     p.finetune is Finetune.LORA, dense * dense_bytes + moe * moe_bytes, in_flight, 0))  # fmt: skip
    parts = _memory_parts(np.array(rows, dtype=object))
    return rows[int(np.argmax(sum(parts.values())))]


def _memory_parts(inputs: np.ndarray) -> dict[str, np.ndarray]:
    """Memory parts in GiB (the :class:`MemoryBreakdown` fields) of configs, one row of :data:`_INPUTS` each."""
    x = {name: inputs[:, j] for j, name in enumerate(_INPUTS)}
    full_dense, full_expert, dense, expert = (x[n].astype(np.int64) for n in _INPUTS[:4])
    shards, expert_shards, zero = (x[n].astype(np.int64) for n in ("shard_ranks", "expert_shard_ranks", "zero_stage"))
    wide, lora = x["wide"].astype(bool), x["lora"].astype(bool)
    weight_b, grad_b, opt_b = np.where(wide, 4.0, 2.0), np.where(wide, 4.0, 2.0), np.where(wide, 8.0, 12.0)

    def sharded(dense: np.ndarray, expert: np.ndarray, stage: int) -> np.ndarray:
        return np.where(zero >= stage, dense / shards + expert / expert_shards, (dense + expert).astype(float))

    weights = weight_b * (sharded(full_dense, full_expert, 3) + np.where(lora, sharded(dense, expert, 3), 0.0))
    grads = grad_b * sharded(dense, expert, 2)
    optimizer = opt_b * sharded(dense, expert, 1)
    activations = x["per_microbatch"].astype(float) * x["in_flight"].astype(float) + x["logits"].astype(float)
    return {"weights_gib": weights / GIB, "grads_gib": grads / GIB, "optimizer_gib": optimizer / GIB,
            "activations_gib": activations / GIB}  # fmt: skip


def peak_memory_table(configs: Sequence[RunConfig]) -> pd.DataFrame:
    """:func:`peak_memory` of each config, column-wise: the :class:`MemoryBreakdown` fields, its
    total (``peak_mem_gib``) and ``fits_memory`` on the config's GPU.

    Memory does not depend on the GPU type or the cluster; parameter and activation counts
    are computed once per model (by identity: ``configs`` keep them alive) and layout.
    """
    counts: dict[tuple[object, ...], Any] = {}

    def params(
        model: TransformerSpec, p: ParallelConfig, *, finetune: Finetune | None = None, rank: int | None = None
    ) -> tuple[int, int]:
        tune = finetune or p.finetune
        key = ("params", id(model), p.tp, p.pp, p.ep, p.etp, tune, p.lora_rank if tune is Finetune.LORA else 0, rank,
               layers_per_rank(model, p))  # fmt: skip
        if key not in counts:
            counts[key] = trainable_params_per_rank(model, p, finetune=finetune, rank=rank)
        return counts[key]

    def layer_bytes(model: TransformerSpec, p: ParallelConfig, *, moe: bool = False) -> float:
        key = ("act", id(model), p.tp, p.cp, p.micro_batch, p.recompute, p.sequence_parallel, p.flash_attention, moe)
        if p.recompute is Recompute.OP_SAC:  # read off the layer's nodes: its GEMMs and collectives count too
            key += (p.ep, p.etp, p.finetune, p.lora_rank, p.dtype, p.document_tokens)
        if key not in counts:
            counts[key] = activation_bytes_per_layer(model, p, moe=moe)
        return counts[key]

    rows: dict[tuple[int, int], tuple[Any, ...]] = {}  # rows often share their spec objects
    for c in configs:
        key = (id(c.model), id(c.parallel))
        if key not in rows:
            rows[key] = _memory_inputs(c.model, c.parallel, params, layer_bytes)
    inputs = np.array([rows[(id(c.model), id(c.parallel))] for c in configs], dtype=object).reshape(-1, len(_INPUTS))
    out = pd.DataFrame(_memory_parts(inputs))
    out["peak_mem_gib"] = out["weights_gib"] + out["grads_gib"] + out["optimizer_gib"] + out["activations_gib"]
    mem_gib = np.array([c.cluster.gpu.mem_gib for c in configs], dtype=float)
    out["fits_memory"] = out["peak_mem_gib"].to_numpy() <= USABLE_MEMORY_FRACTION * mem_gib
    return out
