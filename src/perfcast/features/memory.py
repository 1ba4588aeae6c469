"""Peak memory per GPU of a training run: weights, gradients, optimizer state, activations.

Model states follow the ZeRO paper (Rajbhandari et al. 2020): with 16-bit training each
parameter holds 2 bytes of weights, 2 of gradients and 12 of optimizer state (fp32
master weights and two Adam moments); fp32 training holds 4 + 4 + 8. ZeRO stage 1 shards
the optimizer state over the ``dp*cp`` data-parallel ranks, stage 2 the gradients too,
stage 3 the weights too. LoRA keeps the frozen base weights only, and gradients and
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
``2*s*b*h`` (divided by ``t`` with sequence parallelism). The first pipeline stage holds
``min(m, pp)`` microbatches in flight under 1F1B, times ``1 + (pp-1)/(pp*vpp)`` when
interleaved.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.data.schema import DType
from perfcast.features.hardware import ClusterSpec
from perfcast.features.model import ModelSpec
from perfcast.features.parallel import Finetune, ParallelConfig, Recompute, padded_vocab_size
from perfcast.features.workload import trainable_params_per_rank

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


def activation_bytes_per_layer(model: ModelSpec, parallel: ParallelConfig, *, moe: bool = False) -> float:
    """Activation bytes one layer keeps for backward, per microbatch per GPU (see module doc)."""
    p = parallel
    s = model.seq_len // p.cp
    b, h, t = p.micro_batch, model.hidden_size, p.tp
    sbh = s * b * h
    if p.recompute is Recompute.FULL:
        return 2.0 * sbh / (t if p.sequence_parallel else 1)
    q_width = model.num_heads * model.head_size
    kv_width = model.kv_heads * model.head_size
    tokens = s * b
    if moe:
        ffn, routed = model.expert_ffn_size, model.top_k
    else:
        ffn, routed = model.ffn_size, 1
    mlp_inner = (6.0 if model.gated_mlp else 4.0) * tokens * ffn * routed  # act input(s) and down-proj input
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


def peak_memory(model: ModelSpec, parallel: ParallelConfig, cluster: ClusterSpec) -> MemoryBreakdown:
    """Peak memory per GPU of the first pipeline stage (weights and in-flight activations)."""
    p = parallel
    full = trainable_params_per_rank(model, p.model_copy(update={"finetune": Finetune.FULL, "lora_rank": 0}))
    trainable = trainable_params_per_rank(model, p)
    dp_ranks = p.dp * p.cp
    edp_ranks = max(1, dp_ranks // p.ep)
    wide = p.dtype in (DType.FP32, DType.TF32)
    weight_b, grad_b, opt_b = (4.0, 4.0, 8.0) if wide else (2.0, 2.0, 12.0)

    def sharded(params: tuple[int, int], stage: int) -> float:
        dense, expert = params
        if p.zero_stage >= stage:
            return dense / dp_ranks + expert / edp_ranks
        return float(dense + expert)

    if p.finetune is Finetune.LORA:
        weights = weight_b * (sum(full) + sum(trainable))
    else:
        weights = weight_b * sharded(full, 3)
    grads = grad_b * sharded(trainable, 2)
    optimizer = opt_b * sharded(trainable, 1)

    layers = model.num_layers // p.pp
    moe_layers = -(-model.num_moe_layers // p.pp) if model.is_moe else 0
    per_mb = (layers - moe_layers) * activation_bytes_per_layer(model, p) + moe_layers * activation_bytes_per_layer(
        model, p, moe=True
    )
    activations = per_mb * _in_flight_microbatches(p)
    if p.pp == 1:  # the logits of the one stage that also holds the loss, fp32
        activations += 4.0 * p.micro_batch * (model.seq_len // p.cp) * padded_vocab_size(model, p.tp) / p.tp
    return MemoryBreakdown(
        weights_gib=weights / GIB,
        grads_gib=grads / GIB,
        optimizer_gib=optimizer / GIB,
        activations_gib=activations / GIB,
    )
