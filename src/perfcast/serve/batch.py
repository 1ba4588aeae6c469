"""Batch prediction of run tables and op tables: rows in, the same rows out with predictions.

Every row is checked first; a row that is not a valid config keeps its input columns,
gets empty predictions and its reason in ``error``. The other rows are still answered:
nothing crashes, nothing is dropped.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd

from perfcast.data.schema import (
    OP_BOOL_COLUMNS,
    OP_INT_COLUMNS,
    OP_TIMING_COLUMN,
    DType,
    OpTiming,
    OpType,
    check_whole_number,
    op_row_fields,
    parse_flag,
)
from perfcast.data.tables import (
    DEFAULT_COVERAGE,
    ERROR_COLUMN,
    OP_COLUMNS,
    OP_OUTPUT_COLUMNS,
    RUN_OUTPUT_COLUMNS,
    cell_holds_value,
    misspelt_columns,
    unread_values_error,
)
from perfcast.errors import AtMFUCeilingWarning, OutOfDomainWarning, PerfcastError, SpecError
from perfcast.features.cluster import collective_cluster
from perfcast.features.collective_features import inter_node_fabrics, nvlink_bridged_flags
from perfcast.features.hardware_spec import HardwareSpec, resolve_gpu_name
from perfcast.features.memory import peak_memory_table
from perfcast.features.model_source import ModelSource
from perfcast.features.ops import COLLECTIVE_OPS, OpClass, op_class, parse_op
from perfcast.features.run_config import DEFAULTED_COLUMN, RunConfig, parse_run_table
from perfcast.features.run_features import COMM_GROUPS
from perfcast.features.workload import fabric_level, group_placement
from perfcast.models import analytic
from perfcast.models.calibration import CalibratedPredictor
from perfcast.models.correction_store import CALIBRATION_COLUMN
from perfcast.models.physics_bounds import AT_CEILING_COLUMN, MFUCeiling, at_ceiling, measured_mfu, tokens_per_second
from perfcast.models.predictor_protocol import OpPredictor, StepTimePredictor
from perfcast.models.step_predictor import OUT_OF_DOMAIN_COLUMN

logger = logging.getLogger(__name__)


ProgressFn = Callable[[int], None]
"""Called with the number of rows just finished."""


def _refuse_implausible(out: pd.DataFrame, positions: list[int], times_ms: np.ndarray, columns: Iterable[str]) -> None:
    """Turn rows of ``out`` (at ``positions``) whose predicted time is not a positive finite
    number of ms into errors, clearing their ``columns``: a prediction is never 0, negative or inf."""
    bad = ~(np.isfinite(times_ms) & (times_ms > 0))
    if not bad.any():
        return
    rows = np.asarray(positions)[bad]
    for col in columns:
        out.iloc[rows, out.columns.get_loc(col)] = np.nan
    out.iloc[rows, out.columns.get_loc(ERROR_COLUMN)] = (
        "the prediction is not a positive finite time: the shape lies outside what the predictor can represent"
    )


def _error_frame(df: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    out = df.copy()
    for col in columns:
        out[col] = np.nan
    out[ERROR_COLUMN] = ""
    return out


MEMORY_PART_COLUMNS = ("weights_gib", "grads_gib", "optimizer_gib", "activations_gib")
"""Per-GPU memory parts ``breakdown`` adds, GiB (they sum to ``peak_mem_gib``)."""
LEVEL_COLUMNS = tuple(f"link_{g}" for g in COMM_GROUPS)
"""Per process group, the links its collectives cross (``nvlink``, a fabric id, or
``nvlink+<fabric>``; empty for a group of one rank): :func:`~perfcast.features.workload.fabric_level`."""
BREAKDOWN_COLUMNS = (
    "composed_step_ms", "compute_ms", "attention_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms",
    *(f"comm_{g}_ms" for g in COMM_GROUPS),
    *LEVEL_COLUMNS,
    *MEMORY_PART_COLUMNS,
)  # fmt: skip
"""Columns ``breakdown`` adds to a run table, in order."""
STEP_OUTPUT_NAMES = frozenset(
    {*RUN_OUTPUT_COLUMNS, *BREAKDOWN_COLUMNS, ERROR_COLUMN, OUT_OF_DOMAIN_COLUMN, AT_CEILING_COLUMN, CALIBRATION_COLUMN}
)
"""Every column step prediction writes from scratch; an input column of one of these names is dropped
(``defaulted_fields`` is both: the names a row gives are kept and the parser's are added)."""
OP_OUTPUT_NAMES = frozenset({*OP_OUTPUT_COLUMNS, ERROR_COLUMN, OUT_OF_DOMAIN_COLUMN, CALIBRATION_COLUMN})
"""Every column op prediction writes; an input column of one of these names is dropped."""


class OutputColumnWarning(UserWarning):
    """An input table carried columns that prediction writes; they were dropped."""


def drop_output_columns(table: pd.DataFrame, names: frozenset[str]) -> pd.DataFrame:
    """``table`` without the columns in ``names`` (prediction outputs), warning once per set dropped,
    so a prediction's own output can be fed back in."""
    given = [c for c in table.columns if c in names]
    if not given:
        return table
    warnings.warn(
        f"input columns {', '.join(map(str, given))} are prediction outputs: ignored and predicted anew",
        OutputColumnWarning,
        stacklevel=3,
    )
    return table.drop(columns=given)


STEP_CHUNK_ROWS = 50_000
"""Configs composed together: distinct graph bodies and ops are built and predicted once per chunk."""


def predict_steps_table(
    runs: pd.DataFrame,
    *,
    predictor: StepTimePredictor | None = None,
    coverage: float = DEFAULT_COVERAGE,
    breakdown: bool = False,
    progress: ProgressFn | None = None,
    model_source: ModelSource | None = None,
) -> pd.DataFrame:
    """Predict every row of a run table.

    Args:
        runs: run-table rows (DESIGN.md "Interfaces").
        predictor: the step predictor (:class:`~perfcast.models.step_predictor.StepPredictor`);
            None is the analytic one.
        coverage: nominal coverage of the interval, in (0, 1).
        breakdown: add ``composed_step_ms``, the step breakdown columns (``compute_ms``,
            ``attention_ms``, ``comm_<group>_ms``, ``bubble_ms``, ``dp_sync_ms``, ``optimizer_ms``) and the
            memory parts.
        progress: called with the number of rows finished.
        model_source: how ``model`` cells resolve (default: presets, inline configs and any
            file, for a local user; a service passes a restricted one).

    Returns:
        The input rows, in order, with ``RUN_OUTPUT_COLUMNS`` and ``error`` added (input
        columns named like outputs are dropped first, with an :class:`OutputColumnWarning`).
    """
    if not 0.0 < coverage < 1.0:
        raise SpecError(f"coverage={coverage} must lie strictly between 0 and 1")
    from perfcast.models.step_predictor import StepPredictor

    predictor = predictor or StepPredictor.analytic()
    runs = drop_output_columns(runs, STEP_OUTPUT_NAMES)
    out = _error_frame(runs, RUN_OUTPUT_COLUMNS)
    out["fits_memory"] = out["fits_memory"].astype(object)
    if predictor.flags_out_of_domain:  # the same columns for every batch of a predictor
        out.insert(out.columns.get_loc(ERROR_COLUMN), OUT_OF_DOMAIN_COLUMN, pd.array([pd.NA] * len(out), "boolean"))
    out.insert(out.columns.get_loc(ERROR_COLUMN), AT_CEILING_COLUMN, pd.array([pd.NA] * len(out), "boolean"))
    out.insert(out.columns.get_loc(ERROR_COLUMN), CALIBRATION_COLUMN, np.full(len(out), "", dtype=object))
    positions: list[int] = []
    configs: list[RunConfig] = []
    errors = out[ERROR_COLUMN].to_numpy(dtype=object)
    for pos, parsed in enumerate(parse_run_table(runs, model_source=model_source)):
        if isinstance(parsed, RunConfig):
            configs.append(parsed)
            positions.append(pos)
        else:
            errors[pos] = str(parsed)
    out[ERROR_COLUMN] = errors
    _write_defaulted(out, positions, configs)
    parts: list[pd.DataFrame] = []
    for start in range(0, len(configs), STEP_CHUNK_ROWS):
        chunk = configs[start : start + STEP_CHUNK_ROWS]
        pos = positions[start : start + STEP_CHUNK_ROWS]
        answered = _predict_chunk(predictor, chunk, pos, coverage, out, links=breakdown)
        if answered:
            pos = [p for answered_pos, _ in answered for p in answered_pos]
            frame = pd.concat([f for _, f in answered], ignore_index=True)
            frame.index = pos
            for col in RUN_OUTPUT_COLUMNS:
                out.iloc[pos, out.columns.get_loc(col)] = frame[col].to_numpy()
            out.iloc[pos, out.columns.get_loc(AT_CEILING_COLUMN)] = frame[AT_CEILING_COLUMN].to_numpy(bool)
            frame = frame.drop(columns=[AT_CEILING_COLUMN])
            cleared = [*RUN_OUTPUT_COLUMNS, AT_CEILING_COLUMN]
            _refuse_implausible(out, pos, frame["step_ms"].to_numpy(dtype=float), cleared)
            if OUT_OF_DOMAIN_COLUMN in frame.columns:
                out.iloc[pos, out.columns.get_loc(OUT_OF_DOMAIN_COLUMN)] = frame[OUT_OF_DOMAIN_COLUMN].to_numpy(bool)
                frame = frame.drop(columns=[OUT_OF_DOMAIN_COLUMN])
            if CALIBRATION_COLUMN in frame.columns:  # a calibrated predictor names the correction of each row
                out.iloc[pos, out.columns.get_loc(CALIBRATION_COLUMN)] = frame[CALIBRATION_COLUMN].to_numpy(object)
                frame = frame.drop(columns=[CALIBRATION_COLUMN])
            parts.append(frame.drop(columns=list(RUN_OUTPUT_COLUMNS)))
        if progress is not None:
            progress(len(chunk))
    if progress is not None and len(runs) > len(configs):
        progress(len(runs) - len(configs))
    n_bad = len(runs) - len(configs)
    if n_bad:
        logger.info("%d of %d rows are not valid configs; see the error column", n_bad, len(out))
    if OUT_OF_DOMAIN_COLUMN in out.columns and out[OUT_OF_DOMAIN_COLUMN].fillna(False).any():
        n_ood = int(out[OUT_OF_DOMAIN_COLUMN].fillna(False).sum())
        warnings.warn(
            f"{n_ood} of {len(configs)} configs have ops outside the op predictor's training range "
            f"(see the {OUT_OF_DOMAIN_COLUMN} column): their step times extrapolate",
            OutOfDomainWarning,
            stacklevel=2,
        )
    warn_at_ceiling(out[AT_CEILING_COLUMN], stacklevel=3)
    if breakdown and parts:
        extra = pd.concat(parts).reindex(range(len(out)))
        extra.index = out.index
        out = pd.concat([out.drop(columns=[ERROR_COLUMN]), extra, out[[ERROR_COLUMN]]], axis=1)
    return out


def ceiling_note(flags: pd.Series) -> str | None:
    """The count of answered rows whose ``at_mfu_ceiling`` flag is set, as a sentence; None where there is none."""
    n_capped = int(flags.fillna(False).sum())
    if not n_capped:
        return None
    return (f"{n_capped} of {int(flags.notna().sum())} configs are predicted faster than the MFU ceiling of their "
            f"GPU generation and dtype and sit on it (see the {AT_CEILING_COLUMN} column): their step is that bound, "
            "not an estimate that tells them apart")  # fmt: skip


def warn_at_ceiling(flags: pd.Series, *, stacklevel: int = 2) -> None:
    """Warn (:class:`AtMFUCeilingWarning`) with :func:`ceiling_note`, where it has one."""
    note = ceiling_note(flags)
    if note is not None:
        warnings.warn(note, AtMFUCeilingWarning, stacklevel=stacklevel)


def _write_defaulted(out: pd.DataFrame, positions: list[int], configs: list[RunConfig]) -> None:
    """Put the ``defaulted_fields`` column just before ``error``: each valid row's defaulted
    inputs, comma-separated (an invalid row keeps the cell it was given, or "")."""
    if DEFAULTED_COLUMN in out.columns:
        given = out.pop(DEFAULTED_COLUMN)
        values = np.array(given.astype(object).where(given.notna(), ""), dtype=object)
    else:
        values = np.full(len(out), "", dtype=object)
    for pos, config in zip(positions, configs, strict=True):
        values[pos] = ",".join(config.defaulted)
    out.insert(out.columns.get_loc(ERROR_COLUMN), DEFAULTED_COLUMN, values)


def _predict_chunk(
    predictor: StepTimePredictor,
    chunk: list[RunConfig],
    pos: list[int],
    coverage: float,
    out: pd.DataFrame,
    *,
    links: bool,
) -> list[tuple[list[int], pd.DataFrame]]:
    """Predict ``chunk`` as one batch; when the predictor refuses it, halve it until each
    refused config stands alone, writing its reason into ``out``. Returns the answered
    (positions, rows) parts, in order (with the ``link_<group>`` columns when ``links``)."""
    try:
        ceilings = predictor.ceilings(chunk) if hasattr(predictor, "ceilings") else MFUCeiling().ceiling(chunk)
        frame = _step_rows(predictor.predict_configs(chunk, coverage=coverage), chunk, ceilings)
        if links:
            frame[list(LEVEL_COLUMNS)] = _link_columns(chunk, frame.index)
        return [(pos, frame)]
    except PerfcastError as exc:
        if len(chunk) == 1:
            out.iat[pos[0], out.columns.get_loc(ERROR_COLUMN)] = str(exc)
            return []
    half = len(chunk) // 2
    return _predict_chunk(predictor, chunk[:half], pos[:half], coverage, out, links=links) + _predict_chunk(
        predictor, chunk[half:], pos[half:], coverage, out, links=links
    )


def _step_rows(pred: pd.DataFrame, configs: list[RunConfig], ceilings: np.ndarray) -> pd.DataFrame:
    """Add memory, MFU, whether it sits on the predictor's MFU ``ceilings`` (one per config) and tokens/s to a
    predictor's rows for ``configs``."""
    memory = peak_memory_table(configs)
    step_ms = pred["step_ms"].to_numpy(dtype=float)
    frame = pred.reset_index(drop=True).copy()
    frame["peak_mem_gib"] = memory["peak_mem_gib"].to_numpy()
    frame["fits_memory"] = memory["fits_memory"].tolist()
    frame["mfu"] = measured_mfu(configs, step_ms)
    frame[AT_CEILING_COLUMN] = at_ceiling(frame["mfu"], ceilings)
    frame["tokens_per_s"] = tokens_per_second(configs, step_ms)
    for name in MEMORY_PART_COLUMNS:
        frame[name] = memory[name].to_numpy()
    return frame


def _link_columns(configs: list[RunConfig], index: pd.Index) -> pd.DataFrame:
    """The ``link_<group>`` breakdown columns of ``configs``: the links each group's collectives cross."""
    levels: dict[tuple[int, int, bool], list[str]] = {}
    rows = []
    for c in configs:
        key = (id(c.parallel), id(c.cluster), c.model.is_moe)
        if key not in levels:
            placement = group_placement(c.parallel, c.cluster.nvlink_domain)
            if not c.model.is_moe:  # no expert groups
                placement = {g: v for g, v in placement.items() if g not in ("ep", "edp")}
            fabric = c.cluster.inter_node_fabric
            levels[key] = [fabric_level(*placement.get(g, (1, 1)), fabric) for g in COMM_GROUPS]
        rows.append(levels[key])
    return pd.DataFrame(rows, columns=list(LEVEL_COLUMNS), index=index, dtype=object)


OP_INPUT_NAMES = (*OP_COLUMNS, "backward", OP_TIMING_COLUMN, "inter_node", "nvlink_bridged")
"""Every op-table input the predictors read; a column naming one in another case (``Batch``) is an error."""


def _same_cell(field: str, a: Any, b: Any) -> bool:
    """Whether two op-table cells state the same value (as numbers where both are, else as text)."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a).strip().lower() == str(b).strip().lower()


def check_op_row(row: pd.Series) -> None:
    """Check one op-table row: no input spelt another way (:data:`OP_INPUT_NAMES`), a known op and
    dtype, whole-number sizes within their ranges, boolean flags, a known timing method when one is
    given, and a catalog GPU with the peak the op needs.

    Raises:
        SpecError: naming the field, the value and what is allowed.
    """
    unread = unread_values_error(row, misspelt_columns(row.index, OP_INPUT_NAMES), "op", _same_cell)
    if unread is not None:
        raise unread
    op = parse_op(row.get("op"))
    dtype = DType.parse(row.get("dtype", "bf16") if cell_holds_value(row.get("dtype")) else "bf16")
    required, optional, flags = op_row_fields(op)
    for field in required:
        if not cell_holds_value(row.get(field)):
            raise SpecError(f"{field}={row.get(field)!r}: op={op.value} needs a positive whole number")
    sizes = {f: check_whole_number(f, row.get(f)) for f in (*required, *optional) if cell_holds_value(row.get(f))}
    for flag in flags:
        if cell_holds_value(row.get(flag)):
            parse_flag(flag, row.get(flag))
    if "kv_heads" in sizes and sizes["heads"] % sizes["kv_heads"]:
        raise SpecError(f"kv_heads={sizes['kv_heads']} does not divide heads={sizes['heads']}")
    if cell_holds_value(row.get(OP_TIMING_COLUMN)):  # else the predictor assumes QUERY_TIMING
        OpTiming.parse(row.get(OP_TIMING_COLUMN))
    gpu = row.get("gpu")
    if not cell_holds_value(gpu):
        raise SpecError("missing field gpu: give a catalog id or device name (see `perfcast hardware list`)")
    if op in COLLECTIVE_OPS:
        one = pd.DataFrame([row])
        fabric, bridged = inter_node_fabrics(one)[0] or None, bool(nvlink_bridged_flags(one)[0])
        collective_cluster(str(gpu), sizes["n_ranks"], sizes.get("ranks_per_node"), fabric, bridged=bridged)
        return
    hw = HardwareSpec.from_name(str(gpu))
    # the catalog may lack the figure this op needs (bf16 on a V100, H100 NVL's empty peaks)
    if op_class(op) is OpClass.VECTOR:
        hw.vector_tflops(dtype)
    else:
        hw.peak_tflops(dtype)


def _sizes_and_flags(op: OpType) -> tuple[frozenset[str], frozenset[str]]:
    required, optional, flags = op_row_fields(op)
    return frozenset((*required, *optional)), frozenset(flags)


_SHAPE_SIZES = frozenset().union(*(_sizes_and_flags(op)[0] for op in OpType))


def _floats(column: pd.Series) -> pd.Series:
    """``column`` as float64, NaN where a cell is not a number (an int beyond float range is inf)."""
    try:
        return pd.to_numeric(column, errors="coerce").astype(float)
    except OverflowError:  # pandas refuses an int beyond float range instead of coercing it
        return pd.Series([_float(v) for v in column], index=column.index, dtype=float)


def _float(value: object) -> float:
    if isinstance(value, int):  # bool included; an int beyond float range keeps its sign
        return float(value) if abs(value) < 2**1023 else (math.inf if value > 0 else -math.inf)
    try:
        return float(pd.to_numeric(value, errors="coerce"))
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _checked_op_rows(ops: pd.DataFrame) -> pd.DataFrame:
    """Checked op rows in the types the predictors read: whole-number columns as float64,
    flags as bools, dtype filled with bf16 and GPU names resolved to catalog ids.

    A size or flag that is not a field of the row's op (``n_ranks`` on a matmul,
    ``causal`` on a layernorm) was not checked by :func:`check_op_row`, so the predictor
    does not see it: sizes become NaN and flags False.
    """
    rows = ops.copy()
    kinds = [parse_op(v) for v in rows["op"]]
    fields = [_sizes_and_flags(op) for op in kinds]
    for col in OP_INT_COLUMNS:
        if col in rows.columns:
            values = rows[col]
            if col in _SHAPE_SIZES:
                values = values.where(np.array([col in sizes for sizes, _ in fields], dtype=bool))
            rows[col] = _floats(values)
    for col in OP_BOOL_COLUMNS:
        if col in rows.columns:
            rows[col] = [parse_flag(col, v) if col in flags and cell_holds_value(v) else False
                         for (_, flags), v in zip(fields, rows[col], strict=True)]  # fmt: skip
    if "inter_node" in rows.columns:  # a fabric only matters to (and is only checked on) collectives
        rows["inter_node"] = rows["inter_node"].where([op in COLLECTIVE_OPS for op in kinds], None)
    rows["dtype"] = rows["dtype"].map(lambda v: DType.parse(v).value if cell_holds_value(v) else DType.BF16.value) if (
        "dtype" in rows) else DType.BF16.value  # fmt: skip
    rows["gpu"] = rows["gpu"].astype(str).map(resolve_gpu_name)
    return rows


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
    ops = drop_output_columns(ops, OP_OUTPUT_NAMES)
    out = _error_frame(ops, OP_OUTPUT_COLUMNS)
    if predictor.flags_out_of_domain:  # the same columns for every batch of a predictor, even one with no valid row
        out.insert(out.columns.get_loc(ERROR_COLUMN), OUT_OF_DOMAIN_COLUMN, pd.array([pd.NA] * len(out), "boolean"))
    out.insert(out.columns.get_loc(ERROR_COLUMN), CALIBRATION_COLUMN, np.full(len(out), "", dtype=object))
    good: list[int] = []
    for pos, (_, row) in enumerate(ops.iterrows()):
        try:
            check_op_row(row)
            good.append(pos)
        except PerfcastError as exc:
            out.iat[pos, out.columns.get_loc(ERROR_COLUMN)] = str(exc)
    if good:
        rows = _checked_op_rows(ops.iloc[good])
        with warnings.catch_warnings():  # reported once below, per row in the out_of_domain column
            warnings.simplefilter("ignore", OutOfDomainWarning)
            prediction = predictor.predict_ops_flagged(rows, coverage=coverage)
        pred, lo, hi = (np.asarray(v, dtype=float) for v in prediction[:3])
        for col, values in zip(OP_OUTPUT_COLUMNS, (pred, lo, hi), strict=True):
            out.iloc[good, out.columns.get_loc(col)] = values
        _refuse_implausible(out, good, pred, OP_OUTPUT_COLUMNS)
        if isinstance(predictor, CalibratedPredictor):  # names the correction of each row
            out.iloc[good, out.columns.get_loc(CALIBRATION_COLUMN)] = predictor.applied_calibrations(rows)
        if predictor.flags_out_of_domain:
            flags = np.asarray(prediction.out_of_domain, dtype=bool)
            if flags.any():
                warnings.warn(
                    f"{int(flags.sum())} of {len(rows)} rows lie outside the predictor's training range "
                    f"(see the {OUT_OF_DOMAIN_COLUMN} column): their predictions extrapolate",
                    OutOfDomainWarning,
                    stacklevel=2,
                )
            out.iloc[good, out.columns.get_loc(OUT_OF_DOMAIN_COLUMN)] = flags
    if progress is not None:
        progress(len(ops))
    return out
