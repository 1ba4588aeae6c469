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

from perfcast.data.records import REASON_COLUMN, ReadResult
from perfcast.data.tables import RUN_COLUMNS, RUN_MEASURED_COLUMN, read_table
from perfcast.errors import DatasetError

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
    _check_columns(raw, path)
    numeric = _numeric_fields(raw)
    recompute = _recompute_mode(raw["activation_checkpointing_in_config"])
    reasons = _rejection_reasons(raw, numeric, recompute)
    ok = (reasons == "").to_numpy()
    if not ok.all():
        logger.warning("%s: rejected %d of %d rows", path, int((~ok).sum()), len(raw))
    records = _run_rows(raw[ok], numeric[ok], recompute[ok])
    rejected = raw[~ok].assign(**{REASON_COLUMN: reasons[~ok]}).reset_index(drop=True)
    return ReadResult(records=records, rejected=rejected)


def _check_columns(raw: pd.DataFrame, path: str | Path) -> None:
    """Raise DatasetError naming every required column the source lacks."""
    missing = [c for c in REQUIRED_COLUMNS if c not in raw.columns]
    if missing:
        raise DatasetError(f"{path}: missing required vTrain columns: {', '.join(missing)}")


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
    reasons = np.full(len(raw), "", dtype=object)
    for mask, text in checks:
        hit = mask.to_numpy(dtype=bool)
        reasons[hit] = np.where(reasons[hit] == "", text, reasons[hit] + "; " + text)
    return pd.Series(reasons, index=raw.index, dtype="object")


_EXTRA_RUN_COLUMNS = ("tied_embeddings", "flash_attention")


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
