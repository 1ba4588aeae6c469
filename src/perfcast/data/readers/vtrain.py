"""Reader of vTrain's measured Megatron-DeepSpeed iteration times.

Source: ``vtrain_megatron_iteration_time.csv`` (``../shared/data``; README section 2),
extracted from repo ``VIA-Research/vTrain`` (MICRO'24), whose ``data/README.md`` says
every point was "collected using Megatron-DeepSpeed codebase". Each row is one GPT
training config on A100 GPUs (3D parallel: tp, pp, dp) with its measured time per
training iteration, ms.

Values the source does not state, and the choices made for them:

* ``vocab_size``: Megatron-DeepSpeed GPT uses the GPT-2 BPE tokenizer (50,257 tokens) and
  pads the embedding to a multiple of ``make_vocab_size_divisible_by * tp`` (default
  128), see ``_vocab_size_with_padding`` in ``megatron/arguments.py``. The padded size
  is therefore what each run actually computed: 50,304 (tp=1), 50,432 (tp=2), 50,688
  (tp=4), 51,200 (tp=8). We use that per row rather than a single 51,200 (the tp=8 value),
  which would overstate the LM-head work of tp<8 runs by up to 1.8 %.
* ``dtype = "fp16"``: Megatron-DeepSpeed GPT runs in vTrain are fp16 mixed precision
  (fp16 compute, fp32 master weights); vTrain's simulator models fp16 kernels.
* ``gpu = "a100-sxm4-80gb"``: the configs say ``gpu_name: A100`` and ``node_size: 8``
  with NVLink intra-node bandwidth, i.e. SXM4 (HGX/DGX) nodes, not PCIe cards. The
  memory size is not stated. We pick 80 GB because every measured run did fit in memory:
  assuming 80 GB never contradicts a measurement, while assuming 40 GB could mark runs
  that demonstrably ran as not fitting. The cost of being wrong is the HBM bandwidth of
  memory-bound ops (2,039 vs 1,555 GB/s). Change :data:`VTRAIN_GPU` to revisit.
* ``num_kv_heads = num_heads`` (multi-head attention), ``ffn_hidden_size = 4 * hidden``
  (GPT), ``cp = ep = vpp = 1``, ``sequence_parallel = False``, ``zero_stage = 0``,
  ``finetune = "full"``, ``lora_rank = 0``; the 1F1B schedule is Megatron's default.
* ``tied_embeddings = True`` (Megatron GPT shares the input embedding with the LM head)
  and ``flash_attention = False``: Megatron-DeepSpeed's GPT computes attention unfused
  (QK^T, fused scale-mask-softmax, AV) unless ``--use-flash-attn`` is given, and vTrain's
  validation configs do not mention it.
* ``recompute``: ``activation_checkpointing_in_config`` True -> ``"full"``, False ->
  ``"none"``.
* ``gpus_per_node = min(gpus_per_node_in_config, num_gpus)``: a 2-GPU run on an 8-GPU
  node uses 2 GPUs of that node.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.records import REASON_COLUMN, ReadResult, RejectionReasons
from perfcast.data.tables import RUN_COLUMNS, RUN_MEASURED_COLUMN, read_table, require_columns

logger = logging.getLogger(__name__)

SOURCE_NAME = "vtrain"
"""Prefix of the ``source`` provenance column (followed by the file within the vTrain repo)."""

VTRAIN_GPU = "a100-sxm4-80gb"
"""Catalog id assumed for the source's ``A100`` (see the module docstring)."""

VTRAIN_DTYPE = "fp16"
"""Training dtype of vTrain's Megatron-DeepSpeed runs (fp16 mixed precision)."""

GPT2_VOCAB_SIZE = 50257
"""GPT-2 BPE vocabulary size before Megatron's padding."""

MEGATRON_VOCAB_DIVISOR = 128
"""Megatron's default ``--make-vocab-size-divisible-by``; the padding multiple is this times tp."""

PROVENANCE_COLUMNS: tuple[str, ...] = ("source", "setting", "source_row")
"""Provenance columns appended after the run-table columns."""

_INT_COLUMNS: tuple[str, ...] = (
    "num_gpus",
    "global_batch",
    "micro_batch",
    "hidden_size",
    "num_heads",
    "num_layers",
    "seq_len",
    "tp",
    "dp",
    "pp",
    "gpus_per_node_in_config",
)
REQUIRED_COLUMNS: tuple[str, ...] = (
    "setting",
    *_INT_COLUMNS,
    "iteration_time_ms",
    "activation_checkpointing_in_config",
    "source_path",
    "source_row",
)
"""Source columns the reader needs; a file missing any of them raises DatasetError."""

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def megatron_padded_vocab(vocab_size: int, tp: np.ndarray, divisor: int = MEGATRON_VOCAB_DIVISOR) -> np.ndarray:
    """Vocabulary size after Megatron's padding to a multiple of ``divisor * tp``, tokens.

    Args:
        vocab_size: tokenizer vocabulary size.
        tp: tensor-parallel degree per row (positive integers).
        divisor: Megatron's ``--make-vocab-size-divisible-by``.
    """
    multiple = divisor * np.asarray(tp, dtype=np.int64)
    return -(-vocab_size // multiple) * multiple


def read_vtrain_iterations(path: str | Path) -> ReadResult:
    """Read vTrain's Megatron iteration times into run-table rows.

    Args:
        path: ``vtrain_megatron_iteration_time.csv`` (or a table with its columns).

    Returns:
        ``records``: the run-table columns (:data:`~perfcast.data.tables.RUN_COLUMNS`),
        ``measured_step_ms`` (= ``iteration_time_ms``, ms) and the provenance columns
        ``source`` (``"vtrain:<file in the vTrain repo>"``), ``setting`` and ``source_row``.
        ``rejected``: source rows with a missing, non-numeric or non-positive time or
        integer field, or an unreadable checkpointing flag, with a ``reason`` column.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_table(path)
    require_columns(raw, REQUIRED_COLUMNS, path, "vTrain")
    numeric = _numeric_fields(raw)
    recompute = _recompute_mode(raw["activation_checkpointing_in_config"])
    reasons = _rejection_reasons(raw, numeric, recompute)
    ok = (reasons == "").to_numpy()
    if not ok.all():
        logger.warning("%s: rejected %d of %d rows", path, int((~ok).sum()), len(raw))
    records = _run_rows(raw[ok], numeric[ok], recompute[ok])
    rejected = raw[~ok].assign(**{REASON_COLUMN: reasons[~ok]}).reset_index(drop=True)
    return ReadResult(records=records, rejected=rejected)


def _numeric_fields(raw: pd.DataFrame) -> pd.DataFrame:
    """The integer fields and the time as float64 (unparseable values become NaN)."""
    cols = [*_INT_COLUMNS, "iteration_time_ms"]
    return raw[cols].apply(pd.to_numeric, errors="coerce").astype("float64")


def _recompute_mode(flag: pd.Series) -> pd.Series:
    """Map the activation-checkpointing flag to ``"full"`` / ``"none"`` (None when unreadable)."""
    text = flag.astype("string").str.strip().str.lower()
    mode = pd.Series(None, index=flag.index, dtype="object")
    mode[text.isin(_TRUE).fillna(False).to_numpy(dtype=bool)] = "full"
    mode[text.isin(_FALSE).fillna(False).to_numpy(dtype=bool)] = "none"
    return mode


def _rejection_reasons(raw: pd.DataFrame, numeric: pd.DataFrame, recompute: pd.Series) -> pd.Series:
    """Per row, the reasons it is rejected joined by ``"; "``; empty string when accepted."""
    time = numeric["iteration_time_ms"]
    checks: list[tuple[pd.Series, str]] = [
        (~np.isfinite(time), "iteration_time_ms is missing or not a finite number"),
        (time <= 0, "iteration_time_ms is not positive"),
    ]
    for col in _INT_COLUMNS:
        value = numeric[col]
        bad = value.isna() | (value <= 0) | (value != np.round(value))
        checks.append((bad, f"{col} is not a positive integer"))
    checks.append((recompute.isna(), "activation_checkpointing_in_config is not true/false"))
    reasons = RejectionReasons(len(raw))
    for mask, text in checks:
        reasons.add(mask, text)
    return pd.Series(reasons.text, index=raw.index, dtype="object")


_EXTRA_RUN_COLUMNS = ("tied_embeddings", "flash_attention", "timing_scope")


def _run_rows(raw: pd.DataFrame, numeric: pd.DataFrame, recompute: pd.Series) -> pd.DataFrame:
    """Build the run-table records from accepted source rows (all fields valid)."""
    n = numeric[list(_INT_COLUMNS)].astype("int64")
    hidden = n["hidden_size"]
    out = pd.DataFrame(
        {
            "num_layers": n["num_layers"],
            "hidden_size": hidden,
            "num_heads": n["num_heads"],
            "num_kv_heads": n["num_heads"],
            "ffn_hidden_size": 4 * hidden,
            "vocab_size": megatron_padded_vocab(GPT2_VOCAB_SIZE, n["tp"].to_numpy()),
            "seq_len": n["seq_len"],
            "tp": n["tp"],
            "pp": n["pp"],
            "dp": n["dp"],
            "cp": 1,
            "ep": 1,
            "micro_batch": n["micro_batch"],
            "global_batch": n["global_batch"],
            "vpp": 1,
            "sequence_parallel": False,
            "zero_stage": 0,
            "recompute": recompute.astype(str),
            "finetune": "full",
            "lora_rank": 0,
            "dtype": VTRAIN_DTYPE,
            "tied_embeddings": True,
            "flash_attention": False,
            "timing_scope": "step",
            "gpu": VTRAIN_GPU,
            "num_gpus": n["num_gpus"],
            "gpus_per_node": np.minimum(n["gpus_per_node_in_config"], n["num_gpus"]),
            RUN_MEASURED_COLUMN: numeric["iteration_time_ms"],
            "source": SOURCE_NAME + ":" + raw["source_path"].astype(str),
            "setting": raw["setting"].astype(str),
            "source_row": pd.to_numeric(raw["source_row"], errors="coerce").astype("Int64"),
        },
        index=raw.index,
    )
    ordered = [*RUN_COLUMNS, *_EXTRA_RUN_COLUMNS, RUN_MEASURED_COLUMN, *PROVENANCE_COLUMNS]
    return out[ordered].reset_index(drop=True)


NCCL_GPUS: dict[str, str] = {"A100": VTRAIN_GPU, "V100": "NVIDIA V100-SXM2-32GB"}
"""vTrain's nccl-tests GPU names -> device names or catalog ids (see :func:`read_vtrain_nccl`)."""

NCCL_COLLECTIVES: dict[str, str] = {"all_reduce": "allreduce"}
"""nccl-tests collective names in the file -> op-table ops."""

_NCCL_NUMERIC = (
    "n_gpus",
    "size_bytes",
    "count",
    "time_us_out_of_place",
    "busbw_GBps_out_of_place",
    "time_us_in_place",
    "busbw_GBps_in_place",
)
NCCL_REQUIRED_COLUMNS: tuple[str, ...] = ("gpu", "collective", "dtype", *_NCCL_NUMERIC, "source_path")
"""Columns of ``vtrain_nccl_allreduce.csv.gz`` :func:`read_vtrain_nccl` needs."""

_NCCL_DTYPES = {"float": "fp32", "float32": "fp32", "half": "fp16", "float16": "fp16", "bfloat16": "bf16"}


def read_vtrain_nccl(path: str | Path) -> ReadResult:
    """Read vTrain's nccl-tests all-reduce tables into op-table rows (one record per source row).

    Source: ``trace/{a100,v100}/AR_GPU{2..8}_1M_1024M_LUT`` of the vTrain repo, i.e. nccl-tests
    ``all_reduce_perf`` on float (fp32) buffers of 1 MiB-1 GiB over 2-8 GPUs of **one node**,
    as ``vtrain_nccl_allreduce.csv.gz`` (``../shared/data``, README section 2). nccl-tests
    reports the average time per iteration over its timed iterations; the extraction converted
    ns to us, and this reader converts us to ms (/1000).

    Mapping: ``op = allreduce``, ``bytes = size_bytes``, ``n_ranks = n_gpus``,
    ``ranks_per_node = n_gpus`` (single node), ``dtype = fp32`` (nccl-tests ``float``),
    ``measured_ms = time_us_out_of_place / 1000`` (the out-of-place run, separate send and
    receive buffers, as in a gradient all-reduce into a bucket copy), and
    ``measured_in_place_ms = time_us_in_place / 1000``. GPUs (:data:`NCCL_GPUS`): ``A100`` ->
    :data:`VTRAIN_GPU`, the same catalog id as the iteration-time reader (the 8-GPU busbw of
    229 GB/s is NVSwitch-class, i.e. SXM4); ``V100`` -> "NVIDIA V100-SXM2-32GB", an NVLink node
    (DGX-1 class): the 8-GPU busbw reaches 135 GB/s, far above what PCIe allows. The V100
    memory size (16 vs 32 GB) is not stated and does not affect collective times.

    Args:
        path: ``vtrain_nccl_allreduce.csv.gz`` (or a table with its columns).

    Returns:
        ``records``: ``op, bytes, n_ranks, ranks_per_node, dtype, gpu, backward`` (False),
        ``measured_ms``, ``measured_in_place_ms``, ``busbw_gbps_out_of_place``,
        ``busbw_gbps_in_place`` (GB/s as nccl-tests prints), ``n_elements`` (nccl-tests
        ``count``), ``source`` (``"vtrain:<file in the vTrain repo>"``) and ``device_name``.
        ``rejected``: rows with an unknown collective or dtype, or a missing, non-numeric or
        non-positive size, rank count or out-of-place time, with a ``reason`` column.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_table(path)
    require_columns(raw, NCCL_REQUIRED_COLUMNS, path, "vTrain nccl")
    num = raw[list(_NCCL_NUMERIC)].apply(pd.to_numeric, errors="coerce").astype("float64")
    collective = raw["collective"].astype("string").str.strip().str.lower().fillna("")
    dtype = raw["dtype"].astype("string").str.strip().str.lower().map(_NCCL_DTYPES)
    checks: list[tuple[pd.Series, str | pd.Series]] = [
        (~collective.isin(NCCL_COLLECTIVES), "collective" + collective.map(lambda v: f"={v!r} is not all_reduce")),
        (dtype.isna(), "dtype is not a known nccl-tests type (float, half, bfloat16)"),
    ]
    for col in ("n_gpus", "size_bytes"):
        value = num[col]
        checks.append((value.isna() | (value <= 0) | (value != np.round(value)), f"{col} is not a positive integer"))
    time = num["time_us_out_of_place"]
    checks.append((~(np.isfinite(time) & (time > 0)), "time_us_out_of_place is not a positive number"))
    collected = RejectionReasons(len(raw))
    for mask, text in checks:
        collected.add(mask, text)
    reasons, ok = collected.text, collected.ok
    if not ok.all():
        logger.warning("%s: rejected %d of %d rows", path, int((~ok).sum()), len(raw))
    good, n = raw[ok], num[ok]
    device = good["gpu"].astype(str).str.strip()
    in_place = n["time_us_in_place"] / 1000.0
    records = pd.DataFrame(
        {
            "op": collective[ok].map(NCCL_COLLECTIVES),
            "bytes": n["size_bytes"].round().astype("Int64"),
            "n_ranks": n["n_gpus"].round().astype("Int64"),
            "ranks_per_node": n["n_gpus"].round().astype("Int64"),
            "dtype": dtype[ok],
            "gpu": device.map(lambda v: NCCL_GPUS.get(v, v)),
            "backward": False,
            "measured_ms": n["time_us_out_of_place"] / 1000.0,
            "measured_in_place_ms": in_place.where(in_place > 0),
            "busbw_gbps_out_of_place": n["busbw_GBps_out_of_place"],
            "busbw_gbps_in_place": n["busbw_GBps_in_place"],
            "n_elements": n["count"].round().astype("Int64"),
            "source": SOURCE_NAME + ":" + good["source_path"].astype(str),
            "device_name": device,
        },
        index=good.index,
    ).reset_index(drop=True)
    rejected = raw[~ok].assign(**{REASON_COLUMN: reasons[~ok]}).reset_index(drop=True)
    return ReadResult(records=records, rejected=rejected)
