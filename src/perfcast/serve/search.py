"""Layout search: every valid layout of a model on a cluster, ranked by predicted step time.

:func:`search_layouts` enumerates the layouts (:mod:`perfcast.features.layouts`) of a
model on one or more GPU types, drops those that do not fit in memory (the memory model
of :mod:`perfcast.features.memory`), predicts the step time of the rest with a step
predictor (one batch: every distinct op is predicted once) and ranks them. With a price
per GPU-hour the ranking is by cost per step, which compares GPU types; without one it is
by step time. Ties (layouts predicted at the same MFU-ceiling floor, :mod:`perfcast.models.physics_bounds`)
go to the layout with the lower upper bound of its interval, then the smaller peak memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfcast.data.schema import DType
from perfcast.errors import SpecError
from perfcast.features.cluster import ClusterSpec
from perfcast.features.frameworks import SEARCH_RECOMPUTE, SEARCH_REPLICATE, SEARCH_ZERO_STAGES, Framework
from perfcast.features.layouts import LayoutSpace, enumerate_layouts
from perfcast.features.memory import peak_memory
from perfcast.features.model_source import ModelSource
from perfcast.features.parallel import Finetune, ParallelConfig, Recompute
from perfcast.features.run_config import DEFAULTED_COLUMN, filled_lora_rank, validate_spec
from perfcast.models.predictor_protocol import StepTimePredictor
from perfcast.serve.batch import DEFAULT_COVERAGE, ProgressFn, predict_steps_table

DEFAULT_MAX_LAYOUTS = 200_000
"""Most layouts one search enumerates by default (every GPU type together)."""
_LAYOUT_FIELDS = ("tp", "pp", "dp", "cp", "ep", "micro_batch", "global_batch", "vpp", "sequence_parallel",
                  "zero_stage", "dp_replicate", "recompute", "finetune", "lora_rank", "dtype",
                  "document_tokens")  # fmt: skip


@dataclass(frozen=True)
class SearchResult:
    """Ranked layouts (best first), how many were enumerated and dropped for memory, and the GPU
    types left out because they cannot run the dtype (each with its reason)."""

    ranked: pd.DataFrame
    n_layouts: int
    n_out_of_memory: int
    skipped_gpus: tuple[str, ...] = ()


def _prices(price_per_gpu_hour: float | Sequence[float] | None, n_gpus: int) -> list[float] | None:
    """One checked price per entry of the search's ``gpus`` (None: no price)."""
    if price_per_gpu_hour is None:
        return None
    given = [price_per_gpu_hour] if np.ndim(price_per_gpu_hour) == 0 else list(np.ravel(price_per_gpu_hour))
    for value in given:
        if isinstance(value, bool | np.bool_) or not 0 < value < math.inf:
            raise SpecError(f"price_per_gpu_hour={value} must be a positive finite number (USD per GPU-hour)")
    if len(given) not in (1, n_gpus):
        raise SpecError(
            f"price_per_gpu_hour has {len(given)} prices for {n_gpus} GPU types; allowed: one for all, "
            "or one per GPU type in their order"
        )
    return [float(v) for v in given] * (n_gpus if len(given) == 1 else 1)


def search_layouts(
    model: str | Mapping[str, Any],
    gpus: Sequence[str],
    num_gpus: int,
    global_batch: int,
    *,
    predictor: StepTimePredictor,
    gpus_per_node: int | None = None,
    inter_node: str | None = None,
    seq_len: int | None = None,
    dtype: DType = DType.BF16,
    finetune: Finetune | str = Finetune.FULL,
    lora_rank: int = 0,
    document_tokens: int | None = None,
    framework: str | None = None,
    space: LayoutSpace | None = None,
    price_per_gpu_hour: float | Sequence[float] | None = None,
    coverage: float = DEFAULT_COVERAGE,
    progress: ProgressFn | None = None,
    model_source: ModelSource | None = None,
    max_layouts: int = DEFAULT_MAX_LAYOUTS,
) -> SearchResult:
    """Rank every layout of ``model`` on ``num_gpus`` GPUs of each type in ``gpus``.

    Args:
        model: a preset id, a Hugging Face ``config.json`` path or an inline config mapping,
            resolved by ``model_source`` (default: any of them, for a local user).
        gpus: GPU types (catalog ids or device names) to compare; repeats are searched once.
        num_gpus, global_batch: cluster size and sequences per step.
        predictor: the step predictor.
        gpus_per_node, inter_node: cluster shape (defaults from the catalog).
        seq_len: training sequence length (default: the model's).
        dtype, finetune, lora_rank, document_tokens: how every layout trains (run-table fields;
            ``finetune="lora"`` without a ``lora_rank`` takes the parser's default rank, named in
            each row's ``defaulted_fields``).
        framework: the training framework (a spelling :meth:`~perfcast.features.frameworks.Framework.parse`
            reads): every layout states it, so the parser fills its overlaps (named in
            ``defaulted_fields``) and the step model applies its stack's factors; and without a
            ``space``, the layouts try its ZeRO stages (:data:`~perfcast.features.frameworks.SEARCH_ZERO_STAGES`,
            FSDP's 3 for torchtitan and pytorch-fsdp) and recomputation modes
            (:data:`~perfcast.features.frameworks.SEARCH_RECOMPUTE`: torchtitan's ``op-sac``), and for
            FSDP stacks one replica per NVLink domain beside full sharding
            (:data:`~perfcast.features.frameworks.SEARCH_REPLICATE`). None:
            no framework stated, layouts as Megatron-DeepSpeed runs them (nothing overlapped), ZeRO
            0 and 1.
        space: the layout values tried (default :class:`~perfcast.features.layouts.LayoutSpace`).
        price_per_gpu_hour: USD per GPU-hour, one for every GPU type or one per entry of ``gpus``
            (in their order); ranks by cost per step when given.
        progress: called with the number of configs predicted.
        max_layouts: most layouts enumerated over all GPU types; a larger search is refused.

    Returns:
        Layouts that fit, best first, as run-table rows with ``step_ms``, its interval,
        ``peak_mem_gib``, ``mfu``, ``tokens_per_s`` (and ``usd_per_step``,
        ``usd_per_million_tokens`` with a price), plus ``rank``.

    Raises:
        SpecError: an unknown model, GPU or framework, a ``space`` recomputation the framework
            does not run (Megatron's ``selective`` with torchtitan), no GPU type that runs the dtype
            (one that does not, beside one that does, is left out: ``skipped_gpus``), a bad count, a
            price that is not a positive finite number, prices that are neither one nor one per GPU
            type, more than ``max_layouts`` layouts, or no layout that fits in memory.
    """
    if not gpus:
        raise SpecError("gpus is empty; give at least one GPU type (see `perfcast hardware list`)")
    prices = _prices(price_per_gpu_hour, len(gpus))
    spec = (model_source or ModelSource()).resolve(model)
    if seq_len is not None:
        spec = spec.model_copy(update={"seq_len": seq_len})
    label = spec.name if isinstance(model, Mapping) else str(model)
    clusters: dict[str, ClusterSpec] = {}
    price_of: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for i, gpu in enumerate(gpus):  # resolve first: an unknown or repeated GPU, or one without the dtype, before work
        cluster = ClusterSpec.build(gpu, num_gpus, gpus_per_node, inter_node)
        try:
            cluster.gpu.peak_tflops(dtype)
        except SpecError as exc:  # compared with GPU types that run it, a type without the dtype is left out
            skipped.setdefault(cluster.gpu.id, str(exc))
            continue
        clusters.setdefault(cluster.gpu.id, cluster)
        if prices is not None:
            if price_of.setdefault(cluster.gpu.id, prices[i]) != prices[i]:
                raise SpecError(
                    f"gpus name {cluster.gpu.id} twice with prices {price_of[cluster.gpu.id]:g} and {prices[i]:g}; "
                    "allowed: one price per GPU type"
                )
    if not clusters:
        raise SpecError("; ".join(skipped.values()))
    try:
        tune = Finetune(str(getattr(finetune, "value", finetune)).strip().lower())
    except ValueError:
        raise SpecError(f"finetune={finetune!r} unknown; allowed: {', '.join(f.value for f in Finetune)}") from None
    stated = None if framework is None else Framework.parse(framework)
    if space is None and stated is not None:
        space = LayoutSpace(zero_stages=SEARCH_ZERO_STAGES[stated],
                            recompute=tuple(Recompute(r) for r in SEARCH_RECOMPUTE[stated]),
                            replicate_per_domain=stated in SEARCH_REPLICATE)  # fmt: skip
    if space is not None and stated is not None:  # a recomputation the framework lacks: refused before any work
        for recompute in space.recompute:
            validate_spec(ParallelConfig, {"framework": stated, "recompute": recompute, "global_batch": 1}, "space")
    filled = filled_lora_rank(tune, lora_rank)
    rank = lora_rank if filled is None else filled
    rows, n_layouts, n_oom = [], 0, 0
    for cluster in clusters.values():
        for layout in enumerate_layouts(spec, cluster, global_batch, space=space, dtype=dtype, finetune=tune,
                                        lora_rank=rank, document_tokens=document_tokens):  # fmt: skip
            n_layouts += 1
            if n_layouts > max_layouts:
                raise SpecError(
                    f"the search has more than max_layouts={max_layouts} layouts ({len(clusters)} GPU types); "
                    "compare fewer GPU types or a smaller cluster, or raise the limit"
                )
            if not peak_memory(spec, layout, cluster).fits(cluster.gpu.mem_gib):
                n_oom += 1
                continue
            fields = {name: getattr(layout, name) for name in _LAYOUT_FIELDS}
            fields.update(recompute=layout.recompute.value, finetune=layout.finetune.value, dtype=layout.dtype.value)
            if filled is not None:  # the default rank, named as a reader names what it filled
                fields[DEFAULTED_COLUMN] = "lora_rank"
            if stated is not None:
                fields["framework"] = stated.value
            rows.append({"model": label, "seq_len": spec.seq_len, **fields, "gpu": cluster.gpu.id,
                         "num_gpus": num_gpus, "gpus_per_node": cluster.gpus_per_node,
                         "inter_node": cluster.inter_node_fabric})  # fmt: skip
    if not rows:
        raise SpecError(
            f"none of the {n_layouts} layouts of {label} on {num_gpus} x {', '.join(gpus)} fits in memory "
            "(at most 90% of each GPU's memory); try more GPUs, a smaller global batch or full recompute"
        )
    table = pd.DataFrame(rows)
    table["model"] = [model] * len(table)  # the reference itself: an inline config stays inline
    pred = predict_steps_table(table, predictor=predictor, coverage=coverage, progress=progress,
                               model_source=model_source)  # fmt: skip
    refused = pred.loc[pred["error"] != "", "error"]
    pred = pred[pred["error"] == ""].drop(columns="error")
    if pred.empty:
        reasons = "; ".join(refused.value_counts().index[:3])
        raise SpecError(f"the predictor refused all {len(refused)} layouts that fit in memory: {reasons}")
    pred["model"] = label
    key = "step_ms"
    if prices is not None:
        pred["usd_per_step"] = pred["step_ms"] / 3.6e6 * num_gpus * pred["gpu"].map(price_of).to_numpy(dtype=float)
        pred["usd_per_million_tokens"] = pred["usd_per_step"] / (pred["tokens_per_s"] * pred["step_ms"] / 1e3) * 1e6
        key = "usd_per_step"
    # equal keys (layouts whose step sits on the MFU-ceiling floor): the lower upper bound first
    ranked = pred.sort_values([key, "step_hi_ms", "peak_mem_gib"], kind="stable").reset_index(drop=True)
    ranked.insert(0, "rank", np.arange(1, len(ranked) + 1))
    return SearchResult(ranked=ranked, n_layouts=n_layouts, n_out_of_memory=n_oom, skipped_gpus=tuple(skipped.values()))
