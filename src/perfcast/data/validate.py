"""Row-level checks of canonical op and run records.

Every reader's output passes through :func:`check_op_records` or
:func:`check_run_records`: rows that break the schema (unknown op or dtype, a missing or
non-positive shape, a NaN, infinite or non-positive time, a GPU the catalog does not
know) are rejected with their reasons, the rest come back with canonical types (nullable
integers, booleans, canonical op and dtype names). A frame that lacks a required column
altogether is a :class:`~perfcast.errors.DatasetError`.

GPU names are resolved through a callback, so this layer does not need to know what a
GPU is: the features layer passes :func:`perfcast.features.hardware.resolve_gpu_name`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from perfcast.data.records import REASON_COLUMN, ReadResult, RejectionReasons
from perfcast.data.schema import (
    FINETUNE_NAMES,
    OP_BOOL_COLUMNS,
    OP_INT_COLUMNS,
    OP_RECORD_REQUIRED,
    OP_TIME_COLUMNS,
    RECOMPUTE_NAMES,
    RUN_BOOL_COLUMNS,
    RUN_INT_COLUMNS,
    RUN_RECORD_REQUIRED,
    RUN_TIME_COLUMNS,
    DType,
    OpType,
    TimingScope,
    shape_columns,
)
from perfcast.errors import DatasetError, PerfcastError

GpuResolver = Callable[[str], str]
"""Maps a device name to its catalog id; raises a PerfcastError for an unknown device."""

HOST_DEVICE = "cpu"
"""Device id of records measured on the host CPU (perfcast's own CPU profiles)."""

_MAX_INT = 2.0**53  # larger counts are not exact in float64 and not plausible shapes
_TRUE = {"1", "1.0", "true", "yes", "y", "t"}
_FALSE = {"0", "0.0", "false", "no", "n", "f", ""}


def _require(df: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DatasetError(f"{what} lack required column(s): {', '.join(missing)}")


def _bool_column(values: pd.Series) -> tuple[pd.Series, pd.Series]:
    """(parsed booleans with NA, mask of unparseable cells)."""
    text = values.astype(object).map(lambda v: "" if pd.isna(v) else str(v).strip().lower())
    parsed = pd.Series(pd.NA, index=values.index, dtype="boolean")
    parsed[text.isin(_TRUE) & (text != "")] = True
    parsed[text.isin(_FALSE) & (text != "")] = False
    return parsed, ~(text.isin(_TRUE) | text.isin(_FALSE))


def _typed(
    df: pd.DataFrame, ints: Iterable[str], bools: Iterable[str], floats: Iterable[str], r: RejectionReasons
) -> None:
    """Coerce typed columns in place, recording unreadable cells."""
    for col in ints:
        if col not in df:
            continue
        num = pd.to_numeric(df[col], errors="coerce").astype(float)
        given = df[col].notna() & (df[col].astype(str).str.strip() != "")
        bad = given & ~(np.isfinite(num) & (num % 1 == 0) & (num.abs() < _MAX_INT))
        r.add(bad, f"{col} is not a whole number")
        df[col] = num.where(~bad).round().astype("Int64")
    for col in bools:
        if col not in df:
            continue
        parsed, bad = _bool_column(df[col])
        r.add(bad, f"{col} is not true/false")
        df[col] = parsed
    for col in floats:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)


def _canonical(values: pd.Series, parse: Callable[[str], str], field: str, r: RejectionReasons) -> pd.Series:
    """Map a name column through ``parse`` (per distinct value), rejecting what it refuses."""
    mapping: dict[object, str | None] = {}
    errors: dict[object, str] = {}
    for raw in pd.unique(values):
        try:
            mapping[raw] = parse(str(raw).strip())
        except (PerfcastError, ValueError) as exc:
            mapping[raw] = None
            errors[raw] = f"{field}: {exc}"
    out = values.map(mapping)
    bad = out.isna()
    r.add(bad, values.map(lambda v: errors.get(v, f"{field} is missing")))
    return out


def _gpu_ids(values: pd.Series, resolve_gpu: GpuResolver | None, r: RejectionReasons) -> pd.Series:
    def parse(name: str) -> str:
        if not name or name.lower() == "nan":
            raise ValueError("gpu is missing")
        if name.lower() == HOST_DEVICE:
            return HOST_DEVICE
        return resolve_gpu(name) if resolve_gpu is not None else name

    return _canonical(values, parse, "gpu", r)


def _split(df: pd.DataFrame, r: RejectionReasons, source_columns: pd.DataFrame) -> ReadResult:
    bad = ~r.ok
    rejected = source_columns[bad].copy()
    rejected[REASON_COLUMN] = r.text[bad]
    # rejected rows keep the input's index, so callers can report them by row
    return ReadResult(records=df[~bad].reset_index(drop=True), rejected=rejected)


def _positive_times(df: pd.DataFrame, columns: Iterable[str], r: RejectionReasons) -> None:
    for col in columns:
        if col not in df:
            continue
        value = df[col]
        if col.endswith("_std_ms"):  # a spread may be exactly zero
            r.add(value.notna() & ~(np.isfinite(value) & (value >= 0)), f"{col} must be a finite non-negative time")
        else:
            r.add(value.notna() & ~(np.isfinite(value) & (value > 0)), f"{col} must be a positive finite time")


def check_op_records(records: pd.DataFrame, *, resolve_gpu: GpuResolver | None = None) -> ReadResult:
    """Validate op records row by row (see the module docstring).

    Raises:
        DatasetError: a required column (``OP_RECORD_REQUIRED``) is absent.
    """
    _require(records, OP_RECORD_REQUIRED, "op records")
    df = records.copy()
    r = RejectionReasons(len(df))
    _typed(df, OP_INT_COLUMNS, OP_BOOL_COLUMNS, OP_TIME_COLUMNS, r)
    df["op"] = _canonical(df["op"], lambda v: OpType(v.lower()).value, "op", r)
    df["dtype"] = _canonical(df["dtype"], lambda v: DType.parse(v).value, "dtype", r)
    df["gpu"] = _gpu_ids(df["gpu"], resolve_gpu, r)
    r.add(df["measured_ms"].isna(), "measured_ms is missing")
    _positive_times(df, OP_TIME_COLUMNS, r)
    for op in OpType:
        rows = (df["op"] == op.value).to_numpy()
        if not rows.any():
            continue
        for col in shape_columns(op):
            value = df[col] if col in df else pd.Series(pd.NA, index=df.index, dtype="Int64")
            r.add(
                rows & ~(value.fillna(0) > 0).to_numpy(dtype=bool),
                f"{col} must be a positive integer for op={op.value}",
            )
    return _split(df, r, records)


def check_run_records(records: pd.DataFrame, *, resolve_gpu: GpuResolver | None = None) -> ReadResult:
    """Validate run records row by row (see the module docstring).

    Raises:
        DatasetError: a required column (``RUN_RECORD_REQUIRED``) is absent.
    """
    _require(records, RUN_RECORD_REQUIRED, "run records")
    df = records.copy()
    r = RejectionReasons(len(df))
    _typed(df, RUN_INT_COLUMNS, RUN_BOOL_COLUMNS, RUN_TIME_COLUMNS, r)
    df["dtype"] = _canonical(df["dtype"], lambda v: DType.parse(v).value, "dtype", r)
    df["gpu"] = _gpu_ids(df["gpu"], resolve_gpu, r)
    df["timing_scope"] = _canonical(df["timing_scope"], lambda v: TimingScope(v.lower()).value, "timing_scope", r)
    for col, allowed in (("recompute", RECOMPUTE_NAMES), ("finetune", FINETUNE_NAMES)):
        if col in df:
            given = df[col].notna()
            r.add(given & ~df[col].astype(str).str.lower().isin(allowed), f"{col} must be one of {', '.join(allowed)}")
    for col in RUN_RECORD_REQUIRED:
        if col in RUN_INT_COLUMNS:
            r.add(~(df[col].fillna(0) > 0).to_numpy(dtype=bool), f"{col} must be a positive integer")
    _positive_times(df, RUN_TIME_COLUMNS, r)
    step = df["measured_step_ms"] if "measured_step_ms" in df else pd.Series(np.nan, index=df.index)
    ttt = df["measured_ttt_min"] if "measured_ttt_min" in df else pd.Series(np.nan, index=df.index)
    r.add(step.isna() & ttt.isna(), "no measured time: measured_step_ms and measured_ttt_min are both empty")
    return _split(df, r, records)
