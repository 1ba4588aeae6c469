"""Enumerate the parallel layouts a model can train with on a given cluster.

A layout search (``perfcast search``) scores every layout this module yields. The space
is Megatron-LM's: tensor parallelism within a node, pipeline stages that divide the
layers, optional context parallelism, expert parallelism for MoE models, interleaving,
micro-batch sizes, recomputation, ZeRO stage, hybrid sharding and sequence parallelism.
Every layout is checked by :func:`~perfcast.features.parallel.check_layout`; the ones that
break a rule are left out (they are not configs a framework would run).

Defaults keep the space to what practitioners try: powers of two for the degrees,
``sequence_parallel`` on whenever ``tp > 1`` (it saves memory at no step-time cost in
Megatron-LM), ZeRO stages 0 and 1 (distributed optimizer) unless asked.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perfcast.data.schema import DType
from perfcast.errors import SpecError
from perfcast.features.cluster import ClusterSpec
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import Finetune, ParallelConfig, Recompute, check_layout
from perfcast.features.run_config import validate_spec


@dataclass(frozen=True)
class LayoutSpace:
    """Which values of each layout field a search tries.

    ``max_tp=None`` caps tensor parallelism at the GPUs of one node. ``vpp`` values above
    1 apply only when ``pp > 1``; ``cp`` values only when they divide the sequence.
    ``replicate_per_domain`` also tries, for every ZeRO stage above 0, the hybrid sharding
    whose replica fills one NVLink domain (``dp_replicate`` such that ``tp * dp * cp /
    dp_replicate`` is the domain's GPUs), where that gives more than one replica.
    """

    micro_batches: Sequence[int] = (1, 2, 4, 8)
    cp: Sequence[int] = (1, 2, 4, 8)
    vpp: Sequence[int] = (1, 2, 4)
    recompute: Sequence[Recompute] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    zero_stages: Sequence[int] = (0, 1)
    max_tp: int | None = None
    max_pp: int | None = None
    replicate_per_domain: bool = False

    def __post_init__(self) -> None:
        for name in ("micro_batches", "cp", "vpp", "zero_stages"):
            values = getattr(self, name)
            if not values:
                raise SpecError(f"{name} is empty; give at least one value")
        for value in (*self.micro_batches, *self.cp, *self.vpp):
            if int(value) < 1:
                raise SpecError(f"layout degrees and micro-batch sizes must be >= 1; got {value}")
        bad = [z for z in self.zero_stages if z not in (0, 1, 2, 3)]
        if bad:
            raise SpecError(f"zero_stages={bad} not allowed; allowed: 0, 1, 2, 3")


def _domain_shard_ranks(cluster: ClusterSpec, tp: int, ranks: int) -> int:
    """Data-parallel ranks of a replica that fills one NVLink domain at ``tp``; 0 where none does
    (the domain not a multiple of ``tp``, or not dividing the ``ranks``)."""
    per_domain, rest = divmod(cluster.nvlink_domain, tp)
    return per_domain if not rest and per_domain and ranks % per_domain == 0 else 0


def _powers_of_two_dividing(n: int, cap: int) -> list[int]:
    out, d = [], 1
    while d <= min(n, cap):
        if n % d == 0:
            out.append(d)
        d *= 2
    return out


def enumerate_layouts(
    model: TransformerSpec,
    cluster: ClusterSpec,
    global_batch: int,
    *,
    space: LayoutSpace | None = None,
    dtype: DType = DType.BF16,
    finetune: Finetune = Finetune.FULL,
    lora_rank: int = 0,
    document_tokens: int | None = None,
) -> Iterator[ParallelConfig]:
    """Every checked layout of ``model`` on ``cluster`` for ``global_batch`` sequences per step,
    each training with ``dtype``, ``finetune`` (``lora_rank``) and ``document_tokens``
    (:class:`~perfcast.features.parallel.ParallelConfig`).

    Raises:
        SpecError: ``global_batch`` is below 1, the training fields contradict each other
            (``finetune=lora`` without a ``lora_rank`` ...), or no layout passes the layout rules
            (naming the first rule broken, e.g. LoRA on multi-head latent attention).
    """
    if global_batch < 1:
        raise SpecError(f"global_batch={global_batch} must be >= 1")
    job = {"dtype": dtype, "finetune": finetune, "lora_rank": lora_rank, "document_tokens": document_tokens}
    validate_spec(ParallelConfig, {"global_batch": 1, **job}, "parallel")  # once, not every layout silently
    if document_tokens is not None and document_tokens > model.seq_len:
        raise SpecError(
            f"document_tokens={document_tokens} exceeds seq_len={model.seq_len} of {model.name}: documents are packed "
            "into a sequence"
        )
    space = space or LayoutSpace()
    n = cluster.num_gpus
    max_tp = space.max_tp or min(cluster.nvlink_domain, n)
    max_pp = space.max_pp or model.num_layers
    refusals: list[str] = []
    found = False
    for tp in _powers_of_two_dividing(n, max_tp):
        for pp in [p for p in range(1, min(max_pp, n // tp) + 1) if (n // tp) % p == 0]:
            for cp in sorted({c for c in space.cp if (n // (tp * pp)) % c == 0}):
                dp = n // (tp * pp * cp)
                for layout in _layouts_at(model, cluster, global_batch, space, tp, pp, cp, dp, job, refusals):
                    found = True
                    yield layout
    if not found and refusals:
        raise SpecError(
            f"no layout of {model.name} on {n} GPUs passes the layout rules; the first broke: {refusals[0]}"
        )


def _layouts_at(
    model: TransformerSpec,
    cluster: ClusterSpec,
    global_batch: int,
    space: LayoutSpace,
    tp: int,
    pp: int,
    cp: int,
    dp: int,
    job: Mapping[str, Any],
    refusals: list[str],
) -> Iterator[ParallelConfig]:
    """The layouts at one (tp, pp, cp, dp); the first refused layout's reason goes to an empty ``refusals``."""
    eps = _powers_of_two_dividing(dp * cp, model.num_experts) if model.is_moe else [1]
    vpps = sorted({v for v in space.vpp if v == 1 or pp > 1})
    zeros = sorted({z if dp * cp > 1 else 0 for z in space.zero_stages})  # ZeRO shards over dp*cp ranks
    shards = (dp * cp, _domain_shard_ranks(cluster, tp, dp * cp)) if space.replicate_per_domain else (dp * cp,)
    replicas = sorted({dp * cp // s for s in shards if s})
    grid = itertools.product(eps, sorted(set(space.micro_batches)), vpps, space.recompute, zeros, replicas)
    for ep, mb, vpp, recompute, zero, replicate in grid:
        if global_batch % (dp * mb) or (replicate > 1 and zero == 0):  # nothing sharded to replicate
            continue
        try:
            parallel = ParallelConfig(
                tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, micro_batch=mb, global_batch=global_batch, vpp=vpp,
                sequence_parallel=tp > 1, zero_stage=zero, recompute=recompute, dp_replicate=replicate, **job,
            )  # fmt: skip
            check_layout(model, parallel, cluster)
        except (SpecError, ValueError) as exc:
            if not refusals:
                refusals.append(str(exc))
            continue
        yield parallel
