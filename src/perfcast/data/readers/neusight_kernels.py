"""Readers of NeuSight's single-kernel latency tables: fp32 GEMMs and vector ops, as op records.

See :mod:`perfcast.data.readers.neusight` for the source, its time statistic and the
mappings (dtype, GPU names, GEMM view).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.readers._neusight_common import (
    NEUSIGHT_REPEATS,
    SOURCE_NAME,
    TIMING,
    bad_positive_int,
    checked_dtypes,
    numeric_columns,
    read_source,
)
from perfcast.data.records import ReadResult, RejectionReasons
from perfcast.data.schema import OpType

GEMM_REQUIRED: tuple[str, ...] = (
    "op", "gpu", "neusight_split", "dtype", "framework", "gemm_batch", "gemm_m", "gemm_n", "gemm_k", "latency_ms",
)  # fmt: skip
"""Source columns :func:`read_neusight_gemm` needs; a file missing any of them raises DatasetError."""
VECTOR_REQUIRED: tuple[str, ...] = (
    "op", "gpu", "neusight_split", "dtype", "framework", "rows_B", "cols_H", "latency_ms",
)  # fmt: skip
"""Source columns :func:`read_neusight_vector` needs; a file missing any of them raises DatasetError."""

LAUNCH_COLUMNS: tuple[str, ...] = ("n_kernels_launched", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
"""Launch-configuration columns kept from the kernel files when present."""

GEMM_OPS: dict[str, OpType] = {"bmm": OpType.BMM, "linear": OpType.LINEAR}
"""NeuSight GEMM op name -> op-table op."""

VECTOR_OPS: dict[str, tuple[OpType, bool]] = {
    "add": (OpType.ADD, False),
    "mul": (OpType.MUL, False),
    "div": (OpType.DIV, False),
    "pow": (OpType.POW, False),
    "addu": (OpType.ADD, True),
    "mulu": (OpType.MUL, True),
    "divu": (OpType.DIV, True),
    "powu": (OpType.POW, True),
    "relu": (OpType.RELU, False),
    "gelu": (OpType.GELU, False),
    "tanh": (OpType.TANH, False),
    "softmax": (OpType.SOFTMAX, False),
    "ln": (OpType.LAYERNORM, False),
}
"""NeuSight vector op name -> (op-table op, tensor-scalar). The ``*u`` ops take a Python scalar."""


def _op_names(raw: pd.DataFrame) -> pd.Series:
    """The source's op names, stripped and lower-cased."""
    return raw["op"].astype("string").str.strip().str.lower()


def _kernel_result(
    raw: pd.DataFrame,
    path: str | Path,
    ops: Mapping[str, str],
    dims_as: Mapping[str, str],
    extra: Mapping[str, pd.Series],
) -> ReadResult:
    """Check the rows of a kernel file and build its op records (the two readers' shared part).

    Args:
        raw: the file's rows, index 0..n-1; path: the file (for provenance and messages).
        ops: source op name -> op-table op; another name rejects its row.
        dims_as: record column -> source column of a shape dim; each must be a positive integer.
        extra: further record columns (one value per row of ``raw``), placed after the dims.

    Rows are also rejected for an unknown dtype, a missing or non-positive ``latency_ms``
    and a missing ``gpu``; each rejected row gets all its reasons.
    """
    reasons = RejectionReasons(len(raw))
    op = _op_names(raw).map(lambda v: ops[v] if v in ops else None).astype(object)
    reasons.add(
        op.isna().to_numpy(dtype=bool),
        ("unknown op " + raw["op"].astype(str).map(repr) + f" (allowed: {', '.join(ops)})").to_numpy(dtype=object),
    )
    dims = numeric_columns(raw, tuple(dims_as.values()))
    for col in dims:
        reasons.add(bad_positive_int(dims[col]).to_numpy(), f"{col} is not a positive integer")
    dtype = checked_dtypes(raw["dtype"], reasons)
    time = pd.to_numeric(raw["latency_ms"], errors="coerce").astype("float64")
    reasons.add(time.isna() | ~np.isfinite(time), "latency_ms is missing or not a finite number")
    reasons.add(np.isfinite(time) & (time <= 0), "latency_ms is not positive")
    gpu_text = raw["gpu"].astype("string").str.strip()
    reasons.add((gpu_text.isna() | (gpu_text == "")).to_numpy(dtype=bool), "gpu is missing")
    ok, rejected = reasons.split(raw, path)
    good = raw[ok]
    n = dims[ok].astype("int64")
    records = pd.DataFrame(
        {
            "op": op[ok],
            **{name: n[col] for name, col in dims_as.items()},
            **{name: values[ok] for name, values in extra.items()},
            "dtype": dtype[ok],
            "gpu": good["gpu"].astype(str).str.strip(),
            "backward": False,
            "measured_ms": time[ok],
            **_kernel_provenance(good, path),
        },
        index=good.index,
    )
    return ReadResult(records=records.reset_index(drop=True), rejected=rejected)


def _kernel_provenance(raw: pd.DataFrame, path: str | Path) -> dict[str, object]:
    """Provenance and launch columns of a kernel-file record."""
    out: dict[str, object] = {
        "n_repeats": NEUSIGHT_REPEATS,
        "timing": TIMING.value,
        "source": f"{SOURCE_NAME}:{Path(path).name}",
        "split": raw["neusight_split"].astype(object),
        "framework": raw["framework"].astype(object),
    }
    if "kernel" in raw:
        out["kernel"] = raw["kernel"].astype(object)
    for col in LAUNCH_COLUMNS:
        if col in raw:
            out[col] = pd.to_numeric(raw[col], errors="coerce").astype("Float64").round().astype("Int64")
    out["source_row"] = raw.index.to_numpy()
    return out


def read_neusight_gemm(path: str | Path) -> ReadResult:
    """Read NeuSight's fp32 ``bmm`` / ``linear`` kernel latencies into op records.

    The time is the mean of the 5 fastest of 25 CUDA-event-timed runs of one op, ms,
    including launch overhead and every kernel the op launched (``n_kernels_launched``).

    Args:
        path: ``neusight_kernels_gemm.csv.gz`` (or a table with its columns).

    Returns:
        ``records``: ``op`` (bmm|linear), ``batch, m, n, k`` (from ``gemm_*``), ``dtype``,
        ``gpu`` (as printed), ``backward`` (False), ``measured_ms`` (= ``latency_ms``),
        ``n_repeats``, ``source``, ``split`` (= ``neusight_split``), ``framework``,
        ``kernel``, the launch columns and ``source_row`` (0-based data row of the file).
        ``rejected``: rows with an unknown op or dtype, a non-positive or non-integer
        shape, or a missing/non-positive time, with a ``reason``.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_source(path, GEMM_REQUIRED, "NeuSight GEMM")
    ops = {name: op.value for name, op in GEMM_OPS.items()}
    dims_as = {"batch": "gemm_batch", "m": "gemm_m", "n": "gemm_n", "k": "gemm_k"}
    return _kernel_result(raw, path, ops, dims_as, {})


def read_neusight_vector(path: str | Path) -> ReadResult:
    """Read NeuSight's fp32 element-wise, softmax and LayerNorm kernel latencies.

    The input is one ``[rows_B, cols_H]`` fp32 tensor (and a second one of the same shape
    for ``add, mul, div, pow``; a Python scalar for ``addu, mulu, divu, powu``). Softmax
    and LayerNorm reduce over the last dim. The time is the mean of the 5 fastest of 25
    runs, ms, including launch overhead.

    Args:
        path: ``neusight_kernels_vector.csv.gz`` (or a table with its columns).

    Returns:
        ``records``: ``op`` (add|mul|div|pow|relu|gelu|tanh|softmax|layernorm), ``rows``
        (= ``rows_B``), ``cols`` (= ``cols_H``), ``scalar`` (True for the ``*u`` ops),
        ``dtype``, ``gpu`` (as printed), ``backward`` (False), ``measured_ms``, and the
        provenance columns of :func:`read_neusight_gemm`. ``rejected``: rows with an
        unknown op (see :data:`VECTOR_OPS`) or dtype, a bad shape or time, with a ``reason``.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_source(path, VECTOR_REQUIRED, "NeuSight vector")
    ops = {name: op.value for name, (op, _) in VECTOR_OPS.items()}
    scalar = _op_names(raw).map(lambda v: VECTOR_OPS[v][1] if v in VECTOR_OPS else False).astype(bool)
    return _kernel_result(raw, path, ops, {"rows": "rows_B", "cols": "cols_H"}, {"scalar": scalar})
