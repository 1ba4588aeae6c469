"""Readers of Baidu DeepBench's GEMM and all-reduce results (older GPUs).

Source: repo ``baidu-research/DeepBench`` at commit ``da81ba78``,
``results/train/DeepBench_*.xlsx`` (the Intel KNL file was skipped), extracted into
``../shared/data`` (README section 6) as ``deepbench_gemm.csv`` (the "Dense Matrix
Multiplication" section of every results sheet) and ``deepbench_allreduce.csv`` (the
"All-Reduce" section). Times are in ms as the sheets give them; no unit conversion.

**Time statistic.** The sheets report one time per shape: DeepBench's benchmarks call the
kernel once to warm up, then time a loop of back-to-back calls and report the average
per call (``gemm_bench``), or the mean and standard deviation over iterations
(``mean_time_ms``, ``std_time_ms``) for the all-reduce benchmarks. GEMM times are
device-loop times without framework dispatch.

Assumptions and mappings:

* GEMM view: DeepBench computes ``C[M, N] = op(A)[M, K] · op(B)[K, N]``, so ``batch=1,
  m=M, n=N, k=K``, op ``matmul``; ``transA``/``transB`` (``N``/``T``) are kept.
* ``dtype`` from the sheet's ``precision`` (:data:`PRECISION_DTYPES`): ``Float`` ->
  ``fp32``; ``16 bit inputs, 16 bit multiplication, 32 bit addition`` (V100/T4 tensor-core
  "FP16 ip, Mixed math") -> ``fp16``. ``16 bit inputs, 32 bit multiplication, 32 bit
  addition`` (P100 "Pseudo FP16") stores fp16 but computes in fp32: neither op-table
  dtype describes it (fp16 would assume fp16 math peaks, fp32 would double the bytes), so
  those rows are rejected with the reason. Any other precision (e.g. int8) is rejected.
* ``gpu`` is the Specs-sheet name as printed. Most are consumer or pre-Pascal GPUs that the
  catalog lacks (M40, TitanX, GTX 1080 Ti, MI25, Vega FE ...); GPU resolution rejects them
  later, as intended. ``NVIDIA V100`` resolves to the catalog's SXM2 entry; the data agree:
  its best fp32 GEMM (14.8 TFLOP/s) exceeds the V100 PCIe peak (14.0), and its best fp16
  GEMM (112 TFLOP/s) would be 99 % of the PCIe peak but 90 % of the SXM2 peak.
* All-reduce: ``bytes = size_floats * 4`` (fp32 values), ``n_ranks = n_devices``.
  ``ranks_per_node`` is filled only where the source says all ranks share one node: the
  single-process algorithms (``NCCL 2.0 Single``, ``NCCL Single Process``: one process
  drives every GPU, so they are in one machine) get ``ranks_per_node = n_ranks``. For the
  MPI/OSU/Baidu-ring runs the sheets do not give the GPUs per node, so it is left empty.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.records import ReadResult, RejectionReasons
from perfcast.data.schema import DType, OpTiming, OpType
from perfcast.data.tables import read_table, require_columns

logger = logging.getLogger(__name__)

SOURCE_NAME = "deepbench"
TIMING = OpTiming.LOOP_MEAN
"""DeepBench times a loop of back-to-back calls and divides by their count: launches overlap the kernels."""
"""Prefix of the ``source`` provenance column (followed by the results workbook)."""

PRECISION_DTYPES: dict[str, DType] = {
    "float": DType.FP32,
    "16 bit inputs, 16 bit multiplication, 32 bit addition": DType.FP16,
}
"""Sheet ``precision`` (lower case) -> op-table dtype; other precisions are rejected."""

UNMAPPED_PRECISIONS: dict[str, str] = {
    "16 bit inputs, 32 bit multiplication, 32 bit addition": (
        "pseudo-fp16 (fp16 storage, fp32 math) has no op-table dtype"
    ),
}
"""Known precisions that are rejected on purpose, with the reason."""

FP32_BYTES = 4
"""Bytes per all-reduced value (DeepBench reduces fp32 arrays)."""

SINGLE_NODE_ALGORITHM_WORDS: tuple[str, ...] = ("single",)
"""An all-reduce ``algorithm`` containing one of these (lower case) runs in one process, on one node."""

GEMM_REQUIRED: tuple[str, ...] = ("gpu", "precision", "M", "N", "K", "transA", "transB", "time_ms")
ALLREDUCE_REQUIRED: tuple[str, ...] = ("gpu", "size_floats", "n_devices", "mean_time_ms", "algorithm")
"""Source columns each reader needs; a file missing any of them raises DatasetError."""

_PROVENANCE = ("sheet", "app", "software")


def _number(raw: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(raw[col], errors="coerce").astype("float64")


def _bad_positive_int(value: pd.Series) -> np.ndarray:
    return (~(np.isfinite(value) & (value > 0) & (value == np.round(value)) & (value < 2**62))).to_numpy()


def _bad_time(value: pd.Series) -> np.ndarray:
    return (~(np.isfinite(value) & (value > 0))).to_numpy()


def _text(raw: pd.DataFrame, col: str) -> pd.Series:
    """The column as stripped strings, "" for missing cells."""
    return raw[col].astype("string").str.strip().fillna("").astype(object)


def _gpu_and_source(raw: pd.DataFrame, reasons: RejectionReasons, path: str | Path) -> tuple[pd.Series, pd.Series]:
    gpu = _text(raw, "gpu")
    reasons.add((gpu == "").to_numpy(), "gpu is missing")
    if "source_path" in raw:
        source = SOURCE_NAME + ":" + raw["source_path"].astype(str)
    else:
        source = pd.Series(f"{SOURCE_NAME}:{Path(path).name}", index=raw.index)
    return gpu, source


def _dtype(precision: pd.Series) -> tuple[pd.Series, np.ndarray]:
    """(op-table dtype or None, rejection reason or "") per row."""
    key = precision.str.lower()
    dtype = key.map(lambda v: PRECISION_DTYPES[v].value if v in PRECISION_DTYPES else None).astype(object)
    reason = np.where(
        dtype.isna(),
        [
            UNMAPPED_PRECISIONS.get(k, f"precision {p!r} has no op-table dtype")
            for k, p in zip(key, precision, strict=True)
        ],
        "",
    ).astype(object)
    return dtype, reason


def read_deepbench_gemm(path: str | Path) -> ReadResult:
    """Read DeepBench's dense GEMM times into ``matmul`` op records.

    Args:
        path: ``deepbench_gemm.csv`` (or a table with its columns).

    Returns:
        ``records``: ``op`` (matmul), ``batch`` (1), ``m, n, k`` (= ``M, N, K``), ``dtype``
        (see :data:`PRECISION_DTYPES`), ``gpu`` (as printed), ``backward`` (False),
        ``measured_ms`` (= ``time_ms``), ``source`` (``"deepbench:<workbook>"``) and
        provenance ``transA, transB, precision, sheet, app, software, source_row``.
        ``rejected``: rows with an unmapped precision, a bad shape, transpose flag or time,
        with a ``reason``.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_table(path).reset_index(drop=True)
    require_columns(raw, GEMM_REQUIRED, path, "DeepBench GEMM")
    reasons = RejectionReasons(len(raw))
    dims = {c: _number(raw, c) for c in ("M", "N", "K")}
    for col, value in dims.items():
        reasons.add(_bad_positive_int(value), f"{col} is not a positive integer")
    trans = {c: _text(raw, c).str.upper() for c in ("transA", "transB")}
    for col, value in trans.items():
        reasons.add(~value.isin(["N", "T"]).to_numpy(dtype=bool), f"{col} is not N or T")
    time = _number(raw, "time_ms")
    reasons.add(_bad_time(time), "time_ms is missing or not a positive number")
    precision = _text(raw, "precision")
    dtype, dtype_reason = _dtype(precision)
    reasons.add(dtype_reason != "", dtype_reason)
    gpu, source = _gpu_and_source(raw, reasons, path)
    ok, rejected = reasons.split(raw, path)
    good = raw[ok]
    records = pd.DataFrame(
        {
            "op": OpType.MATMUL.value,
            "batch": 1,
            "m": dims["M"][ok].astype("int64"),
            "n": dims["N"][ok].astype("int64"),
            "k": dims["K"][ok].astype("int64"),
            "dtype": dtype[ok],
            "gpu": gpu[ok],
            "backward": False,
            "measured_ms": time[ok],
            "timing": TIMING.value,
            "source": source[ok],
            "transA": trans["transA"][ok],
            "transB": trans["transB"][ok],
            "precision": precision[ok],
            **{c: good[c].astype(object) for c in _PROVENANCE if c in good},
            "source_row": good.index.to_numpy(),
        },
        index=good.index,
    )
    return ReadResult(records=records.reset_index(drop=True), rejected=rejected)


def read_deepbench_allreduce(path: str | Path) -> ReadResult:
    """Read DeepBench's all-reduce times into ``allreduce`` op records.

    Args:
        path: ``deepbench_allreduce.csv`` (or a table with its columns).

    Returns:
        ``records``: ``op`` (allreduce), ``bytes`` (= ``size_floats * 4``), ``n_ranks``
        (= ``n_devices``), ``ranks_per_node`` (= ``n_ranks`` for single-process algorithms,
        else empty; see the module docstring), ``dtype`` (fp32), ``gpu`` (as printed),
        ``backward`` (False), ``measured_ms`` (= ``mean_time_ms``), ``measured_std_ms``
        (= ``std_time_ms`` when present), ``source`` and provenance ``algorithm,
        size_floats, sheet, software, source_row``. ``rejected``: rows with a missing or
        non-positive time (the sheets leave some cells empty), size or device count.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_table(path).reset_index(drop=True)
    require_columns(raw, ALLREDUCE_REQUIRED, path, "DeepBench all-reduce")
    reasons = RejectionReasons(len(raw))
    size = _number(raw, "size_floats")
    ranks = _number(raw, "n_devices")
    reasons.add(_bad_positive_int(size), "size_floats is not a positive integer")
    reasons.add(_bad_positive_int(ranks), "n_devices is not a positive integer")
    time = _number(raw, "mean_time_ms")
    reasons.add(_bad_time(time), "mean_time_ms is missing or not a positive number")
    std = _number(raw, "std_time_ms") if "std_time_ms" in raw else pd.Series(np.nan, index=raw.index)
    reasons.add((std.notna() & ~(np.isfinite(std) & (std >= 0))).to_numpy(), "std_time_ms is negative or not finite")
    if "precision" in raw:
        precision = _text(raw, "precision").str.lower()
        reasons.add(~precision.isin(["float", ""]).to_numpy(dtype=bool), "precision is not Float (fp32)")
    algorithm = _text(raw, "algorithm")
    gpu, source = _gpu_and_source(raw, reasons, path)
    ok, rejected = reasons.split(raw, path)
    good = raw[ok]
    n_ranks = ranks[ok].astype("int64")
    single = algorithm[ok].str.lower().map(lambda a: any(w in a for w in SINGLE_NODE_ALGORITHM_WORDS)).astype(bool)
    records = pd.DataFrame(
        {
            "op": OpType.ALLREDUCE.value,
            "bytes": size[ok].astype("int64") * FP32_BYTES,
            "n_ranks": n_ranks,
            "ranks_per_node": n_ranks.astype("Int64").where(single),
            "dtype": DType.FP32.value,
            "gpu": gpu[ok],
            "backward": False,
            "measured_ms": time[ok],
            "measured_std_ms": std[ok],
            "timing": TIMING.value,
            "source": source[ok],
            "algorithm": algorithm[ok],
            "size_floats": size[ok].astype("int64"),
            **{c: good[c].astype(object) for c in ("sheet", "software") if c in good},
            "source_row": good.index.to_numpy(),
        },
        index=good.index,
    )
    return ReadResult(records=records.reset_index(drop=True), rejected=rejected)
