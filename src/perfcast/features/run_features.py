"""Run-level features of the step models: layout, model shape, cluster and composed breakdown.

:func:`featurize_runs` turns checked configs and their composed step (a plain frame, as
:func:`perfcast.models.composer.composed_frame` writes it: ``step_ms`` plus the breakdown
``compute_ms, attention_ms, bubble_ms, dp_sync_ms, optimizer_ms, comm_<group>_ms``) into one row of
numbers per run. The columns and their order are fixed by :data:`RUN_FEATURE_SPEC`;
models select columns by name. Sizes enter as log2, times as natural log of ms, and the
breakdown as fractions of the composed step, so a learned correction transfers across
model sizes and clusters. The GEMM-size columns (tokens per microbatch, hidden/tp,
FFN/tp) tell launch-bound small GEMMs from compute-bound ones. A measured run may carry
the MLPerf round of its software (:data:`RELEASE_COLUMN`), since the same step runs faster
on newer software. The software columns
(:data:`SOFTWARE_FEATURES`) state what the training stack overlaps, not its name, so a framework
no training run used still maps onto behaviour the model has seen.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfcast.data.schema import DType
from perfcast.errors import SpecError
from perfcast.features.hardware import ClusterSpec, descriptor_figures
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import Finetune, ParallelConfig, Recompute
from perfcast.features.run_config import RunConfig

__all__ = [
    "RELEASE_COLUMN",
    "RUN_FEATURE_SPEC",
    "RUN_FEATURE_SPEC_VERSION",
    "RunFeatureSpec",
    "SOFTWARE_FEATURES",
    "featurize_runs",
    "software_release",
]

RUN_FEATURE_SPEC_VERSION = 8  # 2: missing SM count / L2 imputed, not NaN; 3: software_release; 4: NVLink domains;
# 5: software switches (what the stack overlaps); 6: frac_attention; 7: ep_comm_overlap; 8: op-sac recompute
COMM_GROUPS = ("tp", "cp", "ep", "pp", "dp", "edp", "emb")
"""Process groups whose exposed communication gets a fraction column."""
_RECOMPUTE_CODE = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.OP_SAC: 1.5, Recompute.FULL: 2}

_LAYOUT = (
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "micro_batch",
    "log2_num_microbatches",
    "log2_global_batch",
    "vpp",
    "sequence_parallel",
    "zero_stage",
    "recompute",
    "lora",
    "dtype_bytes",
    "flash_attention",
)
SOFTWARE_FEATURES = (
    "overlap_grad_reduce",
    "overlap_param_gather",
    "fsdp_prefetch",
    "tp_comm_overlap",
    "cuda_graphs",
    "torch_compile",
    "ep_comm_overlap",
)
"""The run features of the framework switches of ``docs/frameworks.md`` (the run table's
:data:`~perfcast.data.tables.SOFTWARE_SWITCH_COLUMNS`, in feature order), each 1 only where the layout has its
mechanism (gradient sync: ``dp*cp > 1``; parameter gather: that and ZeRO-1/2; prefetch:
that and ZeRO-3; TP overlap: ``tp > 1``; expert all-to-all overlap:
:attr:`~perfcast.features.parallel.ParallelConfig.hides_expert_all_to_all`), so a new framework
maps onto known behaviour. No measured run overlaps its expert all-to-all: a step model sees
that feature at 0 only, and a query that sets it is new software to it."""
_UNLOGGED = {"log2_num_microbatches": "num_microbatches", "log2_global_batch": "global_batch"}
"""Layout features taken as log2 of a field."""
_MODEL = (
    "log2_hidden",
    "num_layers",
    "layers_per_stage",
    "log2_seq_len",
    "log10_params",
    "head_dim",
    "ffn_ratio",
    "is_moe",
    "gated_mlp",
)
_CLUSTER = (
    "peak_tflops",
    "mem_bw_gbps",
    "sm_count",
    "l2_cache_mib",
    "intra_node_bw_gbps",
    "inter_node_bw_gbps",
    "nvlink_domain",
    "log2_num_gpus",
    "num_domains",
    "tp_spans_domains",
)
_GEMM = ("log2_tokens_per_microbatch", "log2_hidden_per_tp", "log2_ffn_per_tp", "log2_layer_gflops_per_microbatch")
_COMPOSED = (
    "log_composed_step_ms",
    "frac_compute",
    "frac_attention",
    *(f"frac_comm_{g}" for g in COMM_GROUPS),
    "frac_bubble",
    "frac_dp_sync",
    "frac_optimizer",
)


@dataclass(frozen=True)
class RunFeatureSpec:
    """Names and order of the run-feature columns, with a version bumped on any change."""

    version: int
    columns: tuple[str, ...]


RELEASE_COLUMN = "software_release"
"""The MLPerf round whose software a run used, as ``major.minor`` (v4.1 -> 4.1); NaN when unknown."""
RUN_FEATURE_SPEC = RunFeatureSpec(
    RUN_FEATURE_SPEC_VERSION, (*_LAYOUT, *SOFTWARE_FEATURES, *_MODEL, *_CLUSTER, *_GEMM, *_COMPOSED, RELEASE_COLUMN)
)
COMPOSED_STEP_COLUMN = "log_composed_step_ms"
"""The feature holding ``log(composed step, ms)``: the base a step model's ratio multiplies."""


def _model_columns(m: TransformerSpec) -> dict[str, float]:
    """Features and sizes of one model (shared by every config of it)."""
    return {
        "log2_hidden": np.log2(m.hidden_size),
        "num_layers": m.num_layers,
        "log2_seq_len": np.log2(m.seq_len),
        "log10_params": np.log10(m.num_params),
        "head_dim": m.head_size,
        "ffn_ratio": m.ffn_size / m.hidden_size,
        "is_moe": float(m.is_moe),
        "gated_mlp": float(m.gated_mlp),
        "hidden": m.hidden_size,
        "ffn": m.ffn_size,
        "seq_len": m.seq_len,
        "dense_layer_params": m.num_params_per_layer(moe=False),
    }


def _cluster_columns(cl: ClusterSpec, dtype: DType) -> dict[str, float]:
    """Features of one cluster running ``dtype``."""
    hw = cl.gpu
    figures = descriptor_figures(hw)
    return {
        "peak_tflops": hw.peak_tflops(dtype),
        "mem_bw_gbps": hw.mem_bw_gbps,
        "sm_count": figures["sm_count"],
        "l2_cache_mib": figures["l2_cache_mib"],
        "intra_node_bw_gbps": cl.intra_node_bw_gbps,
        "inter_node_bw_gbps": cl.inter_node_bw_gbps,
        "nvlink_domain": cl.nvlink_domain,
        "log2_num_gpus": np.log2(cl.num_gpus),
        "num_domains": cl.num_domains,
    }


def _shared_rows(items: Sequence[tuple[object, ...]], build: Callable[..., dict[str, float]]) -> pd.DataFrame:
    """``build(*item)`` of every item as frame rows, each distinct item (by identity) built once."""
    index: dict[tuple[int, ...], int] = {}
    rows, positions = [], np.empty(len(items), dtype=np.int64)
    for i, item in enumerate(items):
        key = tuple(map(id, item))
        if key not in index:
            index[key] = len(rows)
            rows.append(build(*item))
        positions[i] = index[key]
    return pd.DataFrame(rows).iloc[positions].reset_index(drop=True)


def _software_switches(p: ParallelConfig) -> tuple[bool, ...]:
    """:data:`SOFTWARE_FEATURES` of one layout: a switch counts where the layout has what it overlaps."""
    synced, sharded = p.dp * p.cp > 1, p.zero_shard_ranks > 1  # a gradient sync; parameters to gather
    return (
        p.overlap_grad_reduce and synced,
        p.overlap_param_gather and sharded and p.zero_stage in (1, 2),
        p.fsdp_prefetch and sharded and p.zero_stage == 3,
        p.tp_comm_overlap and p.tp > 1,
        p.cuda_graphs,
        p.torch_compile,
        p.hides_expert_all_to_all,
    )


def _config_columns(configs: Sequence[RunConfig]) -> pd.DataFrame:
    """The layout, model, cluster and GEMM-size features of ``configs``, column-wise."""
    layouts: dict[int, tuple[float, ...]] = {}  # rows often share their layout object
    for c in configs:
        p = c.parallel
        if id(p) not in layouts:
            layouts[id(p)] = (p.tp, p.pp, p.dp, p.cp, p.ep, p.micro_batch, p.num_microbatches, p.global_batch, p.vpp,
                              p.sequence_parallel and p.tp > 1, p.zero_stage, _RECOMPUTE_CODE[p.recompute],
                              p.finetune is Finetune.LORA, p.dtype.bytes_per_element, p.flash_attention,
                              *_software_switches(p))  # fmt: skip
    p_rows = [layouts[id(c.parallel)] for c in configs]
    lay = pd.DataFrame(p_rows, columns=[_UNLOGGED.get(n, n) for n in (*_LAYOUT, *SOFTWARE_FEATURES)], dtype=float)
    model = _shared_rows([(c.model,) for c in configs], _model_columns)
    cluster = _shared_rows([(c.cluster, c.parallel.dtype) for c in configs], _cluster_columns)
    tp = lay["tp"].to_numpy()
    tokens = lay["micro_batch"].to_numpy() * model["seq_len"].to_numpy() / lay["cp"].to_numpy()
    feats = pd.concat([lay, model, cluster], axis=1)
    feats["log2_num_microbatches"] = np.log2(lay["num_microbatches"].to_numpy())
    feats["log2_global_batch"] = np.log2(lay["global_batch"].to_numpy())
    feats["layers_per_stage"] = model["num_layers"].to_numpy() / lay["pp"].to_numpy()
    feats["tp_spans_domains"] = (tp > cluster["nvlink_domain"].to_numpy()).astype(float)
    feats["log2_tokens_per_microbatch"] = np.log2(tokens)
    feats["log2_hidden_per_tp"] = np.log2(model["hidden"].to_numpy() / tp)
    feats["log2_ffn_per_tp"] = np.log2(model["ffn"].to_numpy() / tp)
    layer_flops = 2.0 * tokens * model["dense_layer_params"].to_numpy() / tp
    feats["log2_layer_gflops_per_microbatch"] = np.log2(layer_flops / 1e9)
    return feats


def featurize_runs(
    configs: Sequence[RunConfig], composed: pd.DataFrame, releases: Sequence[str | None] | None = None
) -> pd.DataFrame:
    """Run features of ``configs`` given their composed steps.

    Args:
        configs: checked configs.
        composed: one row per config, aligned by position: ``step_ms`` (composed step, ms,
            > 0) and the breakdown columns ``compute_ms, bubble_ms, dp_sync_ms,
            optimizer_ms`` and optionally ``attention_ms`` and ``comm_<group>_ms``
            (absent ones count 0).
        releases: optional MLPerf round per config (``"v4.1"``), the software stack of a
            measured run (:func:`software_release`); ``None`` or a missing entry leaves
            :data:`RELEASE_COLUMN` NaN, as for every query.

    Returns:
        Frame with the columns of :data:`RUN_FEATURE_SPEC`, in order, index of ``composed``.
        ``sm_count`` and ``l2_cache_mib`` come from the nearest same-vendor catalog entry
        where the catalog lacks them (:func:`~perfcast.features.hardware.descriptor_figures`),
        NaN only where no entry of the vendor has one.

    Raises:
        SpecError: lengths differ, a breakdown column is missing, or a step is not > 0.
    """
    if len(configs) != len(composed):
        raise SpecError(f"got {len(configs)} configs but {len(composed)} composed rows")
    if releases is not None and len(releases) != len(configs):
        raise SpecError(f"got {len(configs)} configs but {len(releases)} releases")
    missing = [c for c in ("step_ms", "compute_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms") if c not in composed]
    if missing:
        raise SpecError(f"composed frame lacks columns {missing}")
    step = composed["step_ms"].to_numpy(dtype=float)
    if len(step) and not (np.isfinite(step) & (step > 0)).all():
        raise SpecError(f"composed step_ms must be finite and > 0; {int((~(step > 0)).sum())} rows are not")
    feats = _config_columns(configs)
    feats.index = composed.index
    feats[COMPOSED_STEP_COLUMN] = np.log(step)
    feats["frac_compute"] = composed["compute_ms"].to_numpy(dtype=float) / step
    for col, name in (("attention_ms", "frac_attention"), *((f"comm_{g}_ms", f"frac_comm_{g}") for g in COMM_GROUPS)):
        part = composed[col].fillna(0.0).to_numpy(dtype=float) if col in composed else np.zeros(len(step))
        feats[name] = part / step
    for name in ("bubble", "dp_sync", "optimizer"):
        feats[f"frac_{name}"] = composed[f"{name}_ms"].to_numpy(dtype=float) / step
    feats[RELEASE_COLUMN] = np.nan if releases is None else [software_release(r) for r in releases]
    return feats.reindex(columns=list(RUN_FEATURE_SPEC.columns)).astype(float)


def software_release(version: object) -> float:
    """``major.minor`` of an MLPerf round label (``"v4.1"`` -> 4.1, ordered in time); NaN for anything else."""
    match = _RELEASE.fullmatch(str(version).strip()) if isinstance(version, str) else None
    return float(f"{match[1]}.{match[2]}") if match else float("nan")


_RELEASE = re.compile(r"v?(\d+)\.(\d)", re.IGNORECASE)
