"""Batch prediction of run tables and op tables: rows in, the same rows out with predictions.

Every row is checked first; a row that is not a valid config keeps its input columns,
gets empty predictions and its reason in ``error``. The other rows are still answered:
nothing crashes, nothing is dropped.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np
import pandas as pd

from perfcast.data.schema import DType
from perfcast.data.tables import ERROR_COLUMN, OP_OUTPUT_COLUMNS, RUN_OUTPUT_COLUMNS
from perfcast.errors import OutOfDomainWarning, PerfcastError, SpecError
from perfcast.features.hardware import ClusterSpec, HardwareSpec, resolve_gpu_name
from perfcast.features.ops import COLLECTIVE_OPS, OpClass, op_class, parse_op
from perfcast.features.run_config import parse_run_row
from perfcast.models import analytic

logger = logging.getLogger(__name__)

DEFAULT_COVERAGE = 0.9
OUT_OF_DOMAIN_COLUMN = "out_of_domain"
"""True where a learned predictor extrapolates beyond its training GPUs or shapes."""

ProgressFn = Callable[[int], None]


class OpPredictor(Protocol):
    """What batch op prediction needs: a name and (pred, lo, hi) in ms for checked rows."""

    name: str

    def predict_ops(self, ops: pd.DataFrame, *, coverage: float = DEFAULT_COVERAGE) -> tuple[Any, Any, Any]: ...


"""Called with the number of rows just finished."""


def _error_frame(df: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    out = df.copy()
    for col in columns:
        out[col] = np.nan
    out[ERROR_COLUMN] = ""
    return out


def predict_steps_table(
    runs: pd.DataFrame,
    *,
    model: str = analytic.NAME,
    breakdown: bool = False,
    progress: ProgressFn | None = None,
) -> pd.DataFrame:
    """Predict every row of a run table.

    Args:
        runs: run-table rows (DESIGN.md "Interfaces").
        model: predictor name; only ``"analytic"`` exists so far.
        breakdown: add the step breakdown columns (``compute_ms``, ``comm_<group>_ms``,
            ``bubble_ms``, ``dp_sync_ms``, ``optimizer_ms``) and the memory parts.
        progress: called after each row.

    Returns:
        The input rows, in order, with ``RUN_OUTPUT_COLUMNS`` and ``error`` added.
    """
    _check_model_name(model)
    out = _error_frame(runs, RUN_OUTPUT_COLUMNS)
    out["fits_memory"] = out["fits_memory"].astype(object)
    extra: dict[int, dict[str, float]] = {}
    for pos, (_, row) in enumerate(runs.iterrows()):
        try:
            config = parse_run_row(row.to_dict())
            pred = analytic.predict_step(config)
        except PerfcastError as exc:
            out.iat[pos, out.columns.get_loc(ERROR_COLUMN)] = str(exc)
        else:
            values = {
                "step_ms": pred.step_ms,
                "peak_mem_gib": pred.memory.total_gib,
                "fits_memory": pred.fits_memory,
                "mfu": pred.mfu,
                "tokens_per_s": pred.tokens_per_s,
            }
            for col, value in values.items():
                out.iat[pos, out.columns.get_loc(col)] = value
            if breakdown:
                extra[pos] = {
                    **pred.breakdown.as_row(),
                    "weights_gib": pred.memory.weights_gib,
                    "grads_gib": pred.memory.grads_gib,
                    "optimizer_gib": pred.memory.optimizer_gib,
                    "activations_gib": pred.memory.activations_gib,
                }
        if progress is not None:
            progress(1)
    n_bad = int((out[ERROR_COLUMN] != "").sum())
    if n_bad:
        logger.info("%d of %d rows are not valid configs; see the error column", n_bad, len(out))
    if breakdown and extra:
        parts = pd.DataFrame.from_dict(extra, orient="index").reindex(range(len(out)))
        parts.index = out.index
        out = pd.concat([out.drop(columns=[ERROR_COLUMN]), parts, out[[ERROR_COLUMN]]], axis=1)
    return out


_OP_SHAPE_FIELDS = {
    OpClass.GEMM: ("m", "n", "k"),
    OpClass.ATTENTION: ("batch", "heads", "seq_q", "seq_kv", "head_dim"),
    OpClass.VECTOR: ("cols",),
    OpClass.COLLECTIVE: ("bytes", "n_ranks"),
}


def check_op_row(row: pd.Series) -> None:
    """Check one op-table row: known op and dtype, positive shape, a catalog GPU with the needed peak."""
    op = parse_op(row.get("op"))
    dtype = DType.parse(row.get("dtype", "bf16") if pd.notna(row.get("dtype", "bf16")) else "bf16")
    for field in _OP_SHAPE_FIELDS[op_class(op)]:
        value = pd.to_numeric(row.get(field), errors="coerce")
        if not (np.isfinite(value) and value > 0):
            raise SpecError(f"{field}={row.get(field)!r} must be a positive number for op={op.value}")
    gpu = row.get("gpu")
    if gpu is None or (isinstance(gpu, float) and np.isnan(gpu)):
        raise SpecError("missing field gpu: give a catalog id or device name (see `perfcast hardware list`)")
    if op in COLLECTIVE_OPS:
        rpn = pd.to_numeric(row.get("ranks_per_node"), errors="coerce")
        ClusterSpec.build(str(gpu), int(row["n_ranks"]), int(rpn) if np.isfinite(rpn) and rpn > 0 else None)
        return
    hw = HardwareSpec.from_name(str(gpu))
    # the catalog may lack the figure this op needs (bf16 on a V100, H100 NVL's empty peaks)
    if op_class(op) is OpClass.VECTOR:
        hw.vector_tflops(dtype)
    else:
        hw.peak_tflops(dtype)


def predict_ops_table(
    ops: pd.DataFrame,
    *,
    predictor: OpPredictor | None = None,
    coverage: float = DEFAULT_COVERAGE,
    progress: ProgressFn | None = None,
) -> pd.DataFrame:
    """Predict every row of an op table.

    Args:
        ops: op-table rows (DESIGN.md "Interfaces").
        predictor: the op predictor (default: the analytic one).
        coverage: nominal coverage of the interval, in (0, 1).
        progress: called with the number of rows finished.

    Returns:
        The input rows, in order, with ``pred_ms``, ``pred_lo_ms``, ``pred_hi_ms`` (NaN
        when the predictor has no interval), ``out_of_domain`` (learned predictors) and
        ``error`` added.
    """
    if not 0.0 < coverage < 1.0:
        raise SpecError(f"coverage={coverage} must lie strictly between 0 and 1")
    predictor = predictor or analytic.AnalyticOpPredictor()
    out = _error_frame(ops, OP_OUTPUT_COLUMNS)
    good: list[int] = []
    for pos, (_, row) in enumerate(ops.iterrows()):
        try:
            check_op_row(row)
            good.append(pos)
        except PerfcastError as exc:
            out.iat[pos, out.columns.get_loc(ERROR_COLUMN)] = str(exc)
    if good:
        rows = ops.iloc[good].copy()
        rows["dtype"] = rows["dtype"].fillna(DType.BF16.value) if "dtype" in rows else DType.BF16.value
        rows["gpu"] = rows["gpu"].astype(str).map(resolve_gpu_name)
        with warnings.catch_warnings():  # reported once below, per row in the out_of_domain column
            warnings.simplefilter("ignore", OutOfDomainWarning)
            pred, lo, hi = predictor.predict_ops(rows, coverage=coverage)
        for col, values in zip(OP_OUTPUT_COLUMNS, (pred, lo, hi), strict=True):
            out.iloc[good, out.columns.get_loc(col)] = values
        flag_rows = getattr(predictor, "out_of_domain", None)
        if flag_rows is not None:
            flags = np.asarray(flag_rows(rows), dtype=bool)
            if flags.any():
                warnings.warn(
                    f"{int(flags.sum())} of {len(rows)} rows lie outside the predictor's training range "
                    f"(see the {OUT_OF_DOMAIN_COLUMN} column): their predictions extrapolate",
                    OutOfDomainWarning,
                    stacklevel=2,
                )
            out.insert(out.columns.get_loc(ERROR_COLUMN), OUT_OF_DOMAIN_COLUMN, pd.array([pd.NA] * len(out), "boolean"))
            out.iloc[good, out.columns.get_loc(OUT_OF_DOMAIN_COLUMN)] = flags
    if progress is not None:
        progress(len(ops))
    return out


def _check_model_name(model: str) -> None:
    if model != analytic.NAME:
        raise SpecError(f"model={model!r} is not available; allowed: {analytic.NAME!r} (learned predictors come later)")
