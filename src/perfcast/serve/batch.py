"""Batch prediction of run tables and op tables: rows in, the same rows out with predictions.

Every row is checked first; a row that is not a valid config keeps its input columns,
gets empty predictions and its reason in ``error``. The other rows are still answered:
nothing crashes, nothing is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from perfcast.data.schema import DType
from perfcast.data.tables import ERROR_COLUMN, OP_OUTPUT_COLUMNS, RUN_OUTPUT_COLUMNS
from perfcast.errors import PerfcastError, SpecError
from perfcast.features.hardware import ClusterSpec
from perfcast.features.ops import COLLECTIVE_OPS, OpClass, op_class, parse_op
from perfcast.features.run_config import parse_run_row
from perfcast.models import analytic

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int], None]
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


def _op_row_cluster(row: pd.Series) -> ClusterSpec:
    """Check one op row and return the cluster it runs on (one GPU, or the collective's group)."""
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
        n = int(row["n_ranks"])
        rpn = pd.to_numeric(row.get("ranks_per_node"), errors="coerce")
        rpn = int(rpn) if np.isfinite(rpn) and rpn > 0 else None
        return ClusterSpec.build(str(gpu), n, rpn)
    cluster = ClusterSpec.build(str(gpu), 1)
    # the catalog may lack the figure this op needs (bf16 on a V100, H100 NVL's empty peaks)
    if op_class(op) is OpClass.VECTOR:
        cluster.gpu.vector_tflops(dtype)
    else:
        cluster.gpu.peak_tflops(dtype)
    return cluster


def predict_ops_table(
    ops: pd.DataFrame, *, model: str = analytic.NAME, progress: ProgressFn | None = None
) -> pd.DataFrame:
    """Predict every row of an op table.

    Returns:
        The input rows, in order, with ``pred_ms``, ``pred_lo_ms``, ``pred_hi_ms`` (NaN
        for the analytic model, which has no interval) and ``error`` added.
    """
    _check_model_name(model)
    out = _error_frame(ops, OP_OUTPUT_COLUMNS)
    clusters: list[ClusterSpec] = []
    good: list[int] = []
    for pos, (_, row) in enumerate(ops.iterrows()):
        try:
            clusters.append(_op_row_cluster(row))
            good.append(pos)
        except PerfcastError as exc:
            out.iat[pos, out.columns.get_loc(ERROR_COLUMN)] = str(exc)
    if good:
        rows = ops.iloc[good].copy()
        if "dtype" not in rows:
            rows["dtype"] = DType.BF16.value
        rows["dtype"] = rows["dtype"].fillna(DType.BF16.value)
        for col in ("n_ranks", "ranks_per_node", "bytes"):
            if col not in rows:
                rows[col] = 0
        rows["ranks_per_node"] = [c.gpus_per_node for c in clusters]
        out.iloc[good, out.columns.get_loc("pred_ms")] = analytic.predict_op_times(rows, clusters)
    if progress is not None:
        progress(len(ops))
    return out


def _check_model_name(model: str) -> None:
    if model != analytic.NAME:
        raise SpecError(f"model={model!r} is not available; allowed: {analytic.NAME!r} (learned predictors come later)")
