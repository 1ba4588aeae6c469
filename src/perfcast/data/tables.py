"""Reading and writing the op and run tables (CSV, gzip CSV, Parquet).

This module knows the column names of the interface tables (DESIGN.md,
"Interfaces") and the file formats; it knows nothing about what a GPU is.
Times in these tables are milliseconds (``_ms`` columns).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from pathlib import Path

import pandas as pd

from perfcast.errors import DatasetError

logger = logging.getLogger(__name__)

OP_COLUMNS: tuple[str, ...] = (
    "op",
    # GEMM-like ops (batch is shared with attention)
    "batch",
    "m",
    "n",
    "k",
    # vector ops
    "rows",
    "cols",
    "scalar",
    # attention
    "heads",
    "kv_heads",
    "seq_q",
    "seq_kv",
    "head_dim",
    "causal",
    # collectives
    "bytes",
    "n_ranks",
    "ranks_per_node",
    "dtype",
    "gpu",
)
"""Input columns of the op table, in DESIGN.md order (a row uses those its op needs)."""

OP_SHAPE_COLUMNS: tuple[str, ...] = (*(c for c in OP_COLUMNS if c != "gpu"), "backward")
"""What identifies an op apart from its device: the op-table inputs less ``gpu``, plus ``backward``."""

OP_MEASURED_COLUMN = "measured_ms"
"""Optional measured op time of the op table, ms."""

OP_OUTPUT_COLUMNS: tuple[str, ...] = ("pred_ms", "pred_lo_ms", "pred_hi_ms")
"""Columns batch op prediction adds: median and interval bounds, ms."""

RUN_COLUMNS: tuple[str, ...] = (
    # model
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "ffn_hidden_size",
    "vocab_size",
    "seq_len",
    # parallel layout
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "micro_batch",
    "global_batch",
    "vpp",
    "sequence_parallel",
    "zero_stage",
    "recompute",
    "finetune",
    "lora_rank",
    "dtype",
    # cluster
    "gpu",
    "num_gpus",
    "gpus_per_node",
)
"""Input columns of the run table, in DESIGN.md order."""

RUN_OPTIONAL_COLUMNS: tuple[str, ...] = ("num_experts", "top_k", "gated_mlp", "model", "inter_node")
"""Optional run-table inputs (MoE and gating, a model preset/config instead of the shape, fabric)."""

RUN_MEASURED_COLUMN = "measured_step_ms"
"""Optional measured training-step time of the run table, ms."""

RUN_OUTPUT_COLUMNS: tuple[str, ...] = (
    "step_ms",
    "step_lo_ms",
    "step_hi_ms",
    "peak_mem_gib",
    "fits_memory",
    "mfu",
    "tokens_per_s",
)
"""Columns batch step prediction adds (ms, GiB, fraction 0..1, tokens/s)."""

ERROR_COLUMN = "error"
"""Column holding the reason a row is not a valid config (empty when valid)."""

_CSV_SUFFIXES = (".csv", ".csv.gz")
_PARQUET_SUFFIXES = (".parquet", ".pq")
SUPPORTED_SUFFIXES: tuple[str, ...] = _CSV_SUFFIXES + _PARQUET_SUFFIXES
"""File name endings :func:`read_table` and :func:`write_table` accept (case-insensitive)."""


def table_format(path: Path) -> str:
    """Return ``"csv"`` or ``"parquet"`` from the file name, or raise DatasetError."""
    name = path.name.lower()
    if name.endswith(_CSV_SUFFIXES):
        return "csv"
    if name.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    allowed = ", ".join(SUPPORTED_SUFFIXES)
    raise DatasetError(f"unsupported table file {str(path)!r}: the name must end with one of {allowed}")


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``, ``.pq``) table.

    Args:
        path: the file; its name ending selects the format.

    Returns:
        The table as read, with no column checks (readers and specs check columns).

    Raises:
        DatasetError: the file is missing, its suffix is not supported, or it cannot be parsed
            (the message names the path and the parser's reason).
    """
    path = Path(path)
    fmt = table_format(path)
    if not path.exists():
        raise DatasetError(f"no such file: {path}")
    if not path.is_file():
        raise DatasetError(f"not a file: {path}")
    try:
        if fmt == "csv":
            return pd.read_csv(path)
        return pd.read_parquet(path)
    except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        # pyarrow.ArrowInvalid and pandas' EmptyDataError derive from ValueError
        raise DatasetError(f"cannot parse {fmt} table {path}: {exc}") from exc


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write ``df`` (without its index) as CSV or Parquet, chosen by suffix, atomically.

    The table goes to a temporary file in the target's directory, which then replaces
    the target with :func:`os.replace`. On any failure the temporary file is removed and
    an existing target is left untouched. Missing parent directories are created.

    Args:
        df: the table.
        path: the target file; ``.csv.gz`` is written gzip-compressed.

    Returns:
        The target path.

    Raises:
        DatasetError: unsupported suffix, or the write failed (naming the path and reason).
    """
    path = Path(path)
    fmt = table_format(path)
    suffix = ".csv.gz" if path.name.lower().endswith(".csv.gz") else path.suffix
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatasetError(f"cannot create directory {path.parent}: {exc}") from exc
    # the temporary name keeps the suffix so pandas infers gzip compression for .csv.gz
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp{suffix}")
    try:
        if fmt == "csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, Exception):
            raise DatasetError(f"cannot write {fmt} table {path}: {exc}") from exc
        raise
    logger.debug("wrote %d rows to %s", len(df), path)
    return path
