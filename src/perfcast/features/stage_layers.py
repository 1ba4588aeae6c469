"""What each pipeline rank of a layout holds: its dense and MoE layers and its trainable parameters.

The layers of each rank follow :func:`~perfcast.features.parallel.pipeline_split`; the
workload graph, the composer and the memory model read them from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import accumulate

from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import Finetune, ParallelConfig, padded_vocab_size, pipeline_split


@lru_cache(maxsize=4096)
def layers_per_rank(model: TransformerSpec, parallel: ParallelConfig) -> tuple[tuple[int, int], ...]:
    """``(dense, moe)`` transformer layers of each pipeline rank, rank 0 first (cached: both
    arguments are frozen, and the workload graph, composer and memory model ask per op batch).

    A rank holds the layers :func:`~perfcast.features.parallel.pipeline_split` gives it,
    ``n`` in all. The model's ``first_dense_layers`` are the first layers in model order
    (on the first virtual stages); of a rank's other ``n'`` layers,
    ``ceil(n' * num_moe_layers / (num_layers - first_dense_layers))`` are MoE layers (the
    MoE share, rounded up: the busier case), the rest dense. The last rank also runs the
    ``mtp_layers`` multi-token-prediction layers (MoE layers in an MoE model).

    Raises:
        SpecError: the layout's pipeline split does not fit the model.
    """
    split = pipeline_split(model.num_layers, parallel)
    moe, k = (model.num_moe_layers, model.first_dense_layers) if model.is_moe else (0, 0)
    rest = model.num_layers - k
    lead = [0] * split.pp  # first_dense_layers on each rank
    for v, (start, n) in enumerate(zip(accumulate(split.layers, initial=0), split.layers, strict=False)):
        lead[v % split.pp] += min(n, max(0, k - start))
    ranks = []
    for r, n in enumerate(split.rank_layers):
        moe_r = -(-(n - lead[r]) * moe // rest)
        ranks.append([n - moe_r, moe_r])
    if model.mtp_layers:
        ranks[-1][1 if model.is_moe else 0] += model.mtp_layers
    return tuple((d, m) for d, m in ranks)


def busiest_rank_layers(ranks: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The ``(dense, moe)`` layers of the rank holding the most layers (the first of equals)."""
    return max(ranks, key=sum)


def trainable_params_per_rank(
    model: TransformerSpec, p: ParallelConfig, *, finetune: Finetune | None = None, rank: int | None = None
) -> tuple[int, int]:
    """(non-expert, expert) trainable parameters one GPU of a pipeline stage holds.

    ``rank=None`` is the busiest stage. When every rank holds the same layers, that is
    the first stage with the input embedding (also the last when ``pp == 1``); with
    untied embeddings and ``pp > 1`` the last stage's LM head is usually as large, and the
    maximum of the two is taken. When ranks differ (:func:`layers_per_rank`) it is the
    rank with the most parameters, its own embedding or LM head included. ``rank`` picks
    pipeline rank ``rank`` instead. ``finetune`` overrides the layout's
    (``Finetune.FULL``: all parameters of the rank). Non-expert weights (shared experts
    included) split over ``tp``, the routed experts and the router over ``ep * etp``; the
    multi-token-prediction projections sit with the LM head.
    """
    ranks = layers_per_rank(model, p)
    if rank is None and len(set(ranks)) > 1:
        per_rank = [trainable_params_per_rank(model, p, finetune=finetune, rank=r) for r in range(p.pp)]
        return max(per_rank, key=sum)
    dense_layers, moe_layers = ranks[rank] if rank is not None else ranks[0]
    if (finetune or p.finetune) is Finetune.LORA:
        qkv_out = model.head_size * (model.num_heads + 2 * model.kv_heads)
        per_layer = p.lora_rank * (model.hidden_size + qkv_out) + p.lora_rank * (
            model.head_size * model.num_heads + model.hidden_size
        )
        return per_layer * (dense_layers + moe_layers) // p.tp, 0
    dense = dense_layers * (model.attention_params_per_layer + model.mlp_params_per_layer + model.norm_params_per_layer)
    moe_shared = moe_layers * (
        model.attention_params_per_layer + model.norm_params_per_layer + model.shared_expert_params
    )
    experts = moe_layers * (model.moe_params_per_layer - model.shared_expert_params)  # routed experts and router
    vocab_rows = padded_vocab_size(model, p.tp) * model.hidden_size
    first = model.embedding_params - model.vocab_size * model.hidden_size + vocab_rows
    last = (0 if model.tied_embeddings and p.pp == 1 else vocab_rows) + model.mtp_layers * model.mtp_proj_params
    if rank is None:
        ends = first + last if p.pp == 1 else max(first, last)
    else:
        ends = (first if rank == 0 else 0) + (last if rank == p.pp - 1 else 0)
    return (dense + moe_shared + ends) // p.tp, experts // (p.etp * p.ep)
