"""Readers of Vidur's profiled transformer-layer op times and collective times.

Source: repo ``microsoft/vidur`` (MLSys'24) at commit ``7d47513``, extracted to
``../shared/data`` (README section 5):

* ``vidur_llm_layer_ops.csv.gz`` from ``data/profiling/compute/{a100,a40,h100}/<org>/<model>/mlp.csv``:
  one row per operator of one transformer layer, forward only, fp16, at a token count
  (``num_tokens``, 1..32768) and tensor-parallel degree ``tp`` (the op's per-rank shard).
* ``vidur_collectives.csv.gz`` from ``data/profiling/network/<cluster>/{all_reduce,send_recv}.csv``:
  all-reduce and send/recv of fp16 buffers versus size, one row per (config, size, rank).

Time statistic: Vidur's profiler repeats every op and stores the median, mean, min, max and
standard deviation over the repeats, in **milliseconds** (no conversion). ``measured_ms`` is
the median (``time_ms_median``); ``measured_min_ms``/``measured_max_ms``/``measured_std_ms``
keep min, max and std. The mean is not kept (the op table has no column for it).

Op mapping (:func:`read_vidur_ops`). Vidur names the ops of its own model code
(``vidur/profiling/mlp``); with ``h = n_embd``, ``f = n_expanded_embd``, ``d = h / n_head``
(head dim), ``t = num_tokens`` and ``tp``:

================================  ======================================================================
Vidur op                          op-table row
================================  ======================================================================
``attn_pre_proj`` (QKV GEMM)      matmul ``m=t, k=h, n=(n_head/tp + 2*max(1, n_kv_head/tp)) * d``
``attn_post_proj`` (out proj)     matmul ``m=t, k=n_head*d/tp, n=h``
``mlp_up_proj``                   matmul ``m=t, k=h, n=f*(2 if gated else 1)/tp`` (gate and up fused)
``mlp_down_proj``                 matmul ``m=t, k=f/tp, n=h``
``mlp_act``                       swiglu (gated) or gelu (not gated), ``rows=t, cols=f/tp``
``input_layernorm``,              rmsnorm (gated, Llama-style models) or layernorm (not gated),
``post_attention_layernorm``      ``rows=t, cols=h``
``add`` (residual)                add ``rows=t, cols=h``
``emb``                           embedding ``rows=t, cols=h`` (``vocab_size`` kept as a column)
``attn_rope``                     rejected: no op-table equivalent (rotary embedding)
================================  ======================================================================

* GEMMs have ``batch=1``; all are ``matmul`` (Qwen's QKV and phi-2's projections carry a bias;
  the ``model`` column says which model a row is from).
* KV heads are replicated when ``n_kv_head < tp`` (one KV head per rank), as in Vidur and
  Megatron; ``n_head`` must be divisible by ``tp`` and ``n_kv_head`` must divide or be
  divisible by ``tp``, otherwise the row is rejected.
* The gated ``mlp_act`` is Vidur's fused ``SiluAndMul``: it reads ``t x 2f/tp`` and writes
  ``t x f/tp``, a SiLU and an element-wise multiply in one kernel: the op table's ``swiglu``
  over the ``f/tp`` output columns.
* Norm and activation follow the MLP gating: every gated model of the file (Llama-2/3,
  CodeLlama, InternLM, Qwen) uses RMSNorm + SiLU; the only ungated one, phi-2, uses LayerNorm
  + GELU (tanh approximation) and a parallel attention/MLP block, so it has no
  ``post_attention_layernorm`` rows and is profiled at tp=1 only.
* Some (model, op, tokens, tp) points were profiled twice (the token grid repeats values);
  each source row stays one record (repeat measurements, not duplicates to drop).
* ``measured_std_ms``: a std below 1e-9 ms (all repeats equal at the profiler's 1 us
  resolution; the tiny positive values are float round-off) becomes 0.

GPUs (``gpu`` column, see :data:`VIDUR_COMPUTE_GPUS`): Vidur's ``A100`` is mapped to
"NVIDIA A100-SXM4-80GB", the 80 GB SXM part of Azure NDm A100 v4 nodes. The memory size is
supported by the data: Vidur's device config gives it 80 GB, and residual ``add`` ops of 0.5 GB
and more stream 1.71-1.74 TB/s, above a 40 GB part's 1,555 GB/s peak. The data cannot tell SXM
(2,039 GB/s) from the 80 GB PCIe card (1,935 GB/s); the SXM choice is an assumption. The
fastest fp16 GEMMs reach 272 TFLOP/s (87 % of 312), consistent with it. ``A40`` -> "NVIDIA A40"
(fastest GEMM 135 of 150 TFLOP/s); ``H100`` (held back from the shared file) -> "NVIDIA H100
80GB HBM3" (SXM5). Other names pass through unchanged.

Collectives (:func:`read_vidur_collectives`): ``all_reduce`` -> allreduce, ``send_recv`` ->
sendrecv, ``bytes = size_bytes`` (2 bytes per fp16 element), ``n_ranks = num_workers``,
``ranks_per_node = devices_per_node``, dtype fp16. The rows of all ranks of one measurement
are merged into one record per (cluster, collective, num_workers, devices_per_node,
size_bytes): a collective ends when its slowest rank ends, so ``measured_ms`` is the **max
over ranks** of each rank's median time (a rank profiled more than once contributes the
median of its repeat medians). ``measured_min_ms``/``measured_max_ms`` are the min/max over
all merged rows; ``n_ranks_reported`` and ``n_rows_merged`` say what was merged. (The
shared file has rank 0 only, so in practice a record is rank 0's time.) The GPU comes from the
cluster name (:data:`VIDUR_CLUSTER_GPUS`):

* ``a100_dgx`` -> "NVIDIA A100-SXM4-80GB", ``h100_dgx`` -> "NVIDIA H100 80GB HBM3" (8 GPUs on NVSwitch).
* ``a100_pairwise_nvlink`` -> "NVIDIA A100 80GB PCIe": 4 GPUs a node with NVLink only between
  pairs is the PCIe-card topology (NVLink bridges on pairs, PCIe between pairs, Azure NC A100
  v4); SXM boards connect all GPUs by NVSwitch or a full NVLink mesh. The data agree: a 2-GPU
  all-reduce moves ~380 GB/s, a 4-GPU one only ~31 GB/s. These rows carry
  ``nvlink_bridged=True``, so a pair inside a node is timed over the bridge, not PCIe.
* ``h100_pairwise_nvlink`` -> "NVIDIA H100 PCIe" by the same reasoning (80 GB, as in Vidur's
  device config); ``a40_pairwise_nvlink`` -> "NVIDIA A40" (a PCIe card with NVLink bridges).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.records import REASON_COLUMN, ReadResult, RejectionReasons
from perfcast.data.schema import OpTiming, OpType
from perfcast.data.tables import read_table, require_columns

logger = logging.getLogger(__name__)

SOURCE_NAME = "vidur"
TIMING = OpTiming.GPU_KERNELS
"""Vidur's profiler records the CUDA time of the kernels inside each op's ``record_function`` range:
kernel time only (1-us floors, 0.5-1 us resolution; ``benchmarks/results/op_vector_diagnosis.md``)."""
"""Prefix of the ``source`` provenance column (followed by the file within the Vidur repo)."""

VIDUR_DTYPE = "fp16"
"""Vidur profiles fp16 kernels and fp16 collective buffers."""

VIDUR_COMPUTE_GPUS: dict[str, str] = {
    "A100": "NVIDIA A100-SXM4-80GB",
    "A40": "NVIDIA A40",
    "H100": "NVIDIA H100 80GB HBM3",
}
"""Vidur's compute device names -> device names the hardware catalog resolves (module docstring)."""

PAIRWISE_NVLINK_SUFFIX = "_pairwise_nvlink"
"""Clusters of PCIe cards joined in pairs by NVLink bridges (their rows get ``nvlink_bridged``)."""

VIDUR_CLUSTER_GPUS: dict[str, str] = {
    "a100_dgx": "NVIDIA A100-SXM4-80GB",
    "h100_dgx": "NVIDIA H100 80GB HBM3",
    "a100_pairwise_nvlink": "NVIDIA A100 80GB PCIe",
    "h100_pairwise_nvlink": "NVIDIA H100 PCIe",
    "a40_pairwise_nvlink": "NVIDIA A40",
}
"""Vidur's network-profile clusters -> device names (module docstring explains each)."""

VIDUR_COLLECTIVES: dict[str, OpType] = {"all_reduce": OpType.ALLREDUCE, "send_recv": OpType.SENDRECV}
"""Vidur's collective names -> op types."""

UNSUPPORTED_OPS: dict[str, str] = {"attn_rope": "no op-table equivalent: rotary embedding"}
"""Vidur ops with no op-table row, and the rejection reason."""

_GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
_NORM_OPS = ("input_layernorm", "post_attention_layernorm")
KNOWN_OPS: tuple[str, ...] = (*_GEMM_OPS, *_NORM_OPS, "mlp_act", "add", "emb", *UNSUPPORTED_OPS)
"""Every Vidur op name the reader knows (mapped or rejected with a specific reason)."""

_SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "num_tokens", "tp")
_OP_TIME_COLUMNS = ("time_ms_median", "time_ms_min", "time_ms_max", "time_ms_std")
OPS_REQUIRED_COLUMNS: tuple[str, ...] = (
    "gpu", "model", "op", *_SHAPE_COLUMNS, "use_gated_mlp", *_OP_TIME_COLUMNS, "source_path",
)  # fmt: skip
"""Columns of ``vidur_llm_layer_ops.csv.gz`` the reader needs."""

_COLL_INT_COLUMNS = ("num_workers", "devices_per_node", "rank", "size_bytes")
COLLECTIVES_REQUIRED_COLUMNS: tuple[str, ...] = (
    "cluster", "collective", *_COLL_INT_COLUMNS, "time_ms_median", "time_ms_min", "time_ms_max", "source_path",
)  # fmt: skip
"""Columns of ``vidur_collectives.csv.gz`` the reader needs."""

STD_RESOLUTION_MS = 1e-9
"""Standard deviations below this (zero, or float round-off of zero) become NaN, ms."""

_TRUE = frozenset({"true", "1", "1.0", "yes"})
_FALSE = frozenset({"false", "0", "0.0", "no"})


def read_vidur_ops(path: str | Path) -> ReadResult:
    """Read Vidur's per-op layer profiles into op-table rows (one record per source row).

    Args:
        path: ``vidur_llm_layer_ops.csv.gz`` (or a table with its columns).

    Returns:
        ``records``: ``op``, the op's shape columns (``batch, m, n, k`` for GEMMs, ``rows, cols``
        otherwise), ``dtype`` (fp16), ``gpu`` (see :data:`VIDUR_COMPUTE_GPUS`), ``backward``
        (False), ``measured_ms`` (median), ``measured_min_ms``, ``measured_max_ms``,
        ``measured_std_ms``, and provenance: ``source`` (``"vidur:<file>"``), ``model``,
        ``kernel`` (Vidur's op name), ``tp``, ``num_tokens``, ``vocab_size``, ``device_name``.
        ``rejected``: source rows that are not an op-table op or have unusable cells, with a
        ``reason`` column.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_table(path)
    require_columns(raw, OPS_REQUIRED_COLUMNS, path, "Vidur")
    num = raw[list(_SHAPE_COLUMNS + _OP_TIME_COLUMNS)].apply(pd.to_numeric, errors="coerce").astype("float64")
    gated = _parse_bool(raw["use_gated_mlp"])
    op_name = raw["op"].astype("string").str.strip().fillna("")
    shapes, shape_reasons = _op_shapes(op_name, num, gated)
    reasons = _join(
        raw.index,
        [
            (~op_name.isin(KNOWN_OPS).to_numpy(dtype=bool), op_name.map(lambda v: f"unknown Vidur op {v!r}")),
            *[((op_name == name).to_numpy(dtype=bool), why) for name, why in UNSUPPORTED_OPS.items()],
            (gated.isna().to_numpy(dtype=bool), "use_gated_mlp is not true/false"),
            *_positive_int_checks(num, _SHAPE_COLUMNS),
            *shape_reasons,
            (~(num["time_ms_median"] > 0).to_numpy(dtype=bool), "time_ms_median is not a positive number"),
        ],
    )
    ok = (reasons == "").to_numpy()
    if not ok.all():
        logger.info("%s: rejected %d of %d rows", path, int((~ok).sum()), len(raw))
    records = _op_rows(raw[ok], num[ok], shapes[ok], gated[ok])
    rejected = raw[~ok].assign(**{REASON_COLUMN: reasons[~ok]}).reset_index(drop=True)
    return ReadResult(records=records, rejected=rejected)


def read_vidur_collectives(path: str | Path) -> ReadResult:
    """Read Vidur's collective profiles into op-table rows, one per measurement (ranks merged).

    Args:
        path: ``vidur_collectives.csv.gz`` (or a table with its columns).

    Returns:
        ``records``: ``op`` (allreduce | sendrecv), ``bytes``, ``n_ranks``, ``ranks_per_node``,
        ``dtype`` (fp16), ``gpu`` (see :data:`VIDUR_CLUSTER_GPUS`), ``backward`` (False),
        ``nvlink_bridged`` (True for the ``*_pairwise_nvlink`` clusters),
        ``measured_ms`` (max over ranks of the rank's median, see the module docstring),
        ``measured_min_ms``, ``measured_max_ms``, and provenance: ``source``, ``cluster``,
        ``kernel`` (Vidur's collective name), ``max_devices_per_node``, ``n_ranks_reported``,
        ``n_rows_merged``.
        ``rejected``: source rows with an unknown cluster or collective or unusable cells,
        with a ``reason`` column (rejected before merging: they never reach a record).

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_table(path)
    require_columns(raw, COLLECTIVES_REQUIRED_COLUMNS, path, "Vidur")
    num = (
        raw[[*_COLL_INT_COLUMNS, "time_ms_median", "time_ms_min", "time_ms_max"]]
        .apply(pd.to_numeric, errors="coerce")
        .astype("float64")
    )
    cluster = raw["cluster"].astype("string").str.strip().fillna("")
    collective = raw["collective"].astype("string").str.strip().fillna("")
    checks: list[tuple[np.ndarray, str | pd.Series]] = [
        (~cluster.isin(VIDUR_CLUSTER_GPUS).to_numpy(dtype=bool), cluster.map(lambda v: f"unknown Vidur cluster {v!r}")),
        (
            ~collective.isin(VIDUR_COLLECTIVES).to_numpy(dtype=bool),
            collective.map(lambda v: f"unsupported collective {v!r} (known: {', '.join(VIDUR_COLLECTIVES)})"),
        ),
        *_positive_int_checks(num, ("num_workers", "devices_per_node", "size_bytes")),
    ]
    rank = num["rank"]
    checks.append(((rank.isna() | (rank < 0) | (rank != np.round(rank))).to_numpy(), "rank is not an integer >= 0"))
    for col in ("time_ms_median", "time_ms_min", "time_ms_max"):
        checks.append((~(num[col] > 0).to_numpy(dtype=bool), f"{col} is not a positive number"))
    reasons = _join(raw.index, checks)
    ok = (reasons == "").to_numpy()
    if not ok.all():
        logger.info("%s: rejected %d of %d rows", path, int((~ok).sum()), len(raw))
    good = num[ok].assign(
        cluster=cluster[ok].astype(str),
        collective=collective[ok].astype(str),
        source_path=raw.loc[ok, "source_path"].astype(str),
        max_devices_per_node=pd.to_numeric(raw.loc[ok, "max_devices_per_node"], errors="coerce")
        if "max_devices_per_node" in raw
        else np.nan,
    )
    records = _collective_rows(good)
    rejected = raw[~ok].assign(**{REASON_COLUMN: reasons[~ok]}).reset_index(drop=True)
    return ReadResult(records=records, rejected=rejected)


def _parse_bool(values: pd.Series) -> pd.Series:
    """``True``/``False`` per cell, ``<NA>`` when the cell is not a readable boolean."""
    text = values.astype("string").str.strip().str.lower()
    out = pd.Series(pd.NA, index=values.index, dtype="boolean")
    out[text.isin(_TRUE).fillna(False).to_numpy(dtype=bool)] = True
    out[text.isin(_FALSE).fillna(False).to_numpy(dtype=bool)] = False
    return out


def _positive_int_checks(num: pd.DataFrame, columns: tuple[str, ...]) -> list[tuple[np.ndarray, str]]:
    """One (mask, reason) per column for cells that are not positive whole numbers."""
    checks = []
    for col in columns:
        value = num[col]
        bad = value.isna() | ~np.isfinite(value) | (value <= 0) | (value != np.round(value))
        checks.append((bad.to_numpy(dtype=bool), f"{col} is not a positive integer"))
    return checks


def _join(index: pd.Index, checks: list[tuple[np.ndarray, str | pd.Series]]) -> pd.Series:
    """Per row, the reasons of the checks it fails joined by ``"; "``; ``""`` when it passes all."""
    reasons = RejectionReasons(len(index))
    for mask, text in checks:
        reasons.add(mask, text)
    return pd.Series(reasons.text, index=index, dtype="object")


def _op_shapes(
    op_name: pd.Series, num: pd.DataFrame, gated: pd.Series
) -> tuple[pd.DataFrame, list[tuple[np.ndarray, str]]]:
    """Per-rank GEMM/vector shapes of every row (float, NaN where not applicable) and shape checks.

    Divisibility is checked only on rows whose shape columns are usable; other rows are
    rejected by the positive-integer checks.
    """
    heads, kv, hidden, ffn, tokens, tp = (
        num[c] for c in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens", "tp")
    )
    usable = np.isfinite(num[list(_SHAPE_COLUMNS)]).all(axis=1) & (num[list(_SHAPE_COLUMNS)] > 0).all(axis=1)
    head_dim = hidden / heads
    kv_per_rank = np.where(kv >= tp, kv / tp, 1.0)
    gate = np.where(gated.fillna(False).to_numpy(dtype=bool), 2.0, 1.0)
    needs_heads = op_name.isin(("attn_pre_proj", "attn_post_proj"))
    needs_ffn = op_name.isin(("mlp_up_proj", "mlp_down_proj", "mlp_act"))
    checks = [
        ((usable & needs_heads & (hidden % heads != 0)).to_numpy(), "n_embd is not divisible by n_head"),
        ((usable & needs_heads & (heads % tp != 0)).to_numpy(), "n_head is not divisible by tp"),
        (
            (usable & (op_name == "attn_pre_proj") & (kv % tp != 0) & (tp % kv != 0)).to_numpy(),
            "n_kv_head and tp do not divide one another",
        ),
        ((usable & needs_ffn & (ffn % tp != 0)).to_numpy(), "n_expanded_embd is not divisible by tp"),
    ]
    shapes = pd.DataFrame(np.nan, index=num.index, columns=["m", "n", "k", "rows", "cols"])
    qkv = op_name == "attn_pre_proj"
    shapes.loc[qkv, ["k", "n"]] = np.column_stack([hidden, (heads / tp + 2 * kv_per_rank) * head_dim])[qkv.to_numpy()]
    out = op_name == "attn_post_proj"
    shapes.loc[out, ["k", "n"]] = np.column_stack([heads * head_dim / tp, hidden])[out.to_numpy()]
    up = op_name == "mlp_up_proj"
    shapes.loc[up, ["k", "n"]] = np.column_stack([hidden, ffn * gate / tp])[up.to_numpy()]
    down = op_name == "mlp_down_proj"
    shapes.loc[down, ["k", "n"]] = np.column_stack([ffn / tp, hidden])[down.to_numpy()]
    gemm = op_name.isin(_GEMM_OPS)
    shapes.loc[gemm, "m"] = tokens[gemm]
    vector = op_name.isin((*_NORM_OPS, "add", "emb", "mlp_act"))
    shapes.loc[vector, "rows"] = tokens[vector]
    shapes.loc[vector, "cols"] = np.where(op_name[vector] == "mlp_act", ffn[vector] / tp[vector], hidden[vector])
    return shapes, checks


def _op_type(op_name: pd.Series, gated: pd.Series) -> pd.Series:
    """Op-table op per accepted row (norm and activation follow the MLP gating)."""
    is_gated = gated.astype(bool).to_numpy()
    kind = np.full(len(op_name), OpType.MATMUL.value, dtype=object)
    names = op_name.to_numpy()
    norm = np.isin(names, _NORM_OPS)
    kind[norm] = np.where(is_gated[norm], OpType.RMSNORM.value, OpType.LAYERNORM.value)
    act = names == "mlp_act"
    kind[act] = np.where(is_gated[act], OpType.SWIGLU.value, OpType.GELU.value)
    kind[names == "add"] = OpType.ADD.value
    kind[names == "emb"] = OpType.EMBEDDING.value
    return pd.Series(kind, index=op_name.index, dtype="object")


def _int_or_na(values: pd.Series) -> pd.Series:
    return values.round().astype("Int64")


def _op_rows(raw: pd.DataFrame, num: pd.DataFrame, shapes: pd.DataFrame, gated: pd.Series) -> pd.DataFrame:
    """Build op-table records from accepted source rows."""
    op_name = raw["op"].astype(str).str.strip()
    op = _op_type(op_name, gated)
    gemm = op_name.isin(_GEMM_OPS)
    device = raw["gpu"].astype(str).str.strip()
    std = num["time_ms_std"]
    out = pd.DataFrame(
        {
            "op": op,
            "batch": pd.Series(np.where(gemm, 1.0, np.nan), index=raw.index).pipe(_int_or_na),
            "m": _int_or_na(shapes["m"]),
            "n": _int_or_na(shapes["n"]),
            "k": _int_or_na(shapes["k"]),
            "rows": _int_or_na(shapes["rows"]),
            "cols": _int_or_na(shapes["cols"]),
            "dtype": VIDUR_DTYPE,
            "gpu": device.map(lambda v: VIDUR_COMPUTE_GPUS.get(v, v)),
            "backward": False,
            "measured_ms": num["time_ms_median"],
            "measured_min_ms": num["time_ms_min"],
            "measured_max_ms": num["time_ms_max"],
            "measured_std_ms": std.where(std >= STD_RESOLUTION_MS, 0.0),
            "timing": TIMING.value,
            "source": SOURCE_NAME + ":" + raw["source_path"].astype(str),
            "model": raw["model"].astype(str),
            "kernel": op_name,
            "tp": _int_or_na(num["tp"]),
            "num_tokens": _int_or_na(num["num_tokens"]),
            "vocab_size": _int_or_na(num["vocab_size"]),
            "device_name": device,
        },
        index=raw.index,
    )
    return out.reset_index(drop=True)


def _collective_rows(good: pd.DataFrame) -> pd.DataFrame:
    """Merge the accepted rows of all ranks into one record per measurement."""
    key = ["cluster", "collective", "num_workers", "devices_per_node", "size_bytes"]
    columns = [
        "op", "bytes", "n_ranks", "ranks_per_node", "dtype", "gpu", "backward", "nvlink_bridged", "measured_ms",
        "measured_min_ms", "measured_max_ms", "timing", "source", "cluster", "kernel", "max_devices_per_node",
        "n_ranks_reported", "n_rows_merged",
    ]  # fmt: skip
    if good.empty:
        return pd.DataFrame(columns=columns)
    per_rank = good.groupby([*key, "rank"], sort=False).agg(
        rank_ms=("time_ms_median", "median"),
        min_ms=("time_ms_min", "min"),
        max_ms=("time_ms_max", "max"),
        n_rows=("time_ms_median", "size"),
        source_path=("source_path", "first"),
        max_devices_per_node=("max_devices_per_node", "first"),
    )
    merged = per_rank.groupby(level=key, sort=False).agg(
        measured_ms=("rank_ms", "max"),
        measured_min_ms=("min_ms", "min"),
        measured_max_ms=("max_ms", "max"),
        n_ranks_reported=("rank_ms", "size"),
        n_rows_merged=("n_rows", "sum"),
        source_path=("source_path", "first"),
        max_devices_per_node=("max_devices_per_node", "first"),
    )
    merged = merged.reset_index()
    out = pd.DataFrame(
        {
            "op": merged["collective"].map(lambda v: VIDUR_COLLECTIVES[v].value),
            "bytes": merged["size_bytes"].round().astype("Int64"),
            "n_ranks": merged["num_workers"].round().astype("Int64"),
            "ranks_per_node": merged["devices_per_node"].round().astype("Int64"),
            "dtype": VIDUR_DTYPE,
            "gpu": merged["cluster"].map(VIDUR_CLUSTER_GPUS),
            "backward": False,
            "nvlink_bridged": merged["cluster"].str.endswith(PAIRWISE_NVLINK_SUFFIX),
            "measured_ms": merged["measured_ms"],
            "measured_min_ms": merged["measured_min_ms"],
            "measured_max_ms": merged["measured_max_ms"],
            "timing": TIMING.value,
            "source": SOURCE_NAME + ":" + merged["source_path"].astype(str),
            "cluster": merged["cluster"],
            "kernel": merged["collective"],
            "max_devices_per_node": merged["max_devices_per_node"].round().astype("Int64"),
            "n_ranks_reported": merged["n_ranks_reported"].astype("int64"),
            "n_rows_merged": merged["n_rows_merged"].astype("int64"),
        }
    )
    return out[columns]
