"""How far off is perfcast on a user's own measurements: ``perfcast evaluate ops|steps DATA``.

:func:`load_measured` reads measured ops or runs from whatever the user has: a run or op
table with its measured column (CSV, Parquet, JSON), a perfcast dataset folder, or any
source file a reader knows (a torch.profiler trace, an Nsight Systems export, a Megatron
or NeMo training log, an MLPerf results file). :func:`evaluate_measured` predicts every
row with the predictor the user names and scores the answered rows: MAPE, median and p90
absolute percentage error, coverage and width of the interval, and the Spearman rank
correlation (what a layout search needs), overall and per group (op kind or GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast.data.tables import ERROR_COLUMN, OP_MEASURED_COLUMN, RUN_MEASURED_COLUMN, read_table, table_format
from perfcast.errors import DatasetError, PerfcastError
from perfcast.serve.batch import predict_ops_table, predict_steps_table
from perfcast.training.metrics import spearman, summarize

MEASURED = {"ops": OP_MEASURED_COLUMN, "steps": RUN_MEASURED_COLUMN}
"""The measured-time column of each table kind, ms."""
PREDICTED = {"ops": ("pred_ms", "pred_lo_ms", "pred_hi_ms"), "steps": ("step_ms", "step_lo_ms", "step_hi_ms")}
GROUP = {"ops": "op", "steps": "gpu"}
"""The column the per-group table splits by."""


@dataclass(frozen=True)
class MeasuredEvaluation:
    """Predictions of measured rows and their scores.

    Attributes:
        rows: every row with ``measured_ms`` (the measured column, renamed), the predicted
            columns and ``ape`` (percent, NaN where the row was not answered).
        summary: the scores of the answered rows (see :func:`perfcast.training.metrics.summarize`)
            plus ``spearman`` and ``n_unanswered``.
        by_group: the same scores per op kind or GPU.
    """

    rows: pd.DataFrame
    summary: dict[str, float]
    by_group: pd.DataFrame


def load_measured(path: str | Path, kind: str, **reader_options: Any) -> pd.DataFrame:
    """Measured ``ops`` or ``steps`` rows from a table, a dataset folder or a source file.

    Raises:
        DatasetError: an unreadable input, or one with no measured rows of this kind.
    """
    from perfcast.data.dataset import load_dataset
    from perfcast.data.sources import detect_reader, read_source
    from perfcast.features.hardware_spec import resolve_gpu_name

    path = Path(path)
    column = MEASURED[kind]
    if path.is_dir():
        dataset = load_dataset(path, resolve_gpu=resolve_gpu_name)
        table = dataset.ops if kind == "ops" else dataset.runs
    else:
        try:
            table_format(path)
            table = read_table(path)
        except DatasetError:
            table = pd.DataFrame()
        if column not in table.columns:  # not a measured table: a reader may recognise the file
            try:
                detect_reader(path)
            except DatasetError:
                if not table.empty:
                    raise DatasetError(
                        f"{path}: no {column} column to compare with (a {kind} table needs it)"
                    ) from None
                raise
            loaded = read_source(path, resolve_gpu=resolve_gpu_name, **reader_options)
            if loaded.kind != ("ops" if kind == "ops" else "runs"):
                raise DatasetError(f"{path} holds {loaded.kind} records, not {kind}")
            table = loaded.records
    if column not in table.columns or table[column].notna().sum() == 0:
        raise DatasetError(f"{path}: no {column} values to compare with (a {kind} table needs that column)")
    table = table[pd.to_numeric(table[column], errors="coerce") > 0]
    if table.empty:
        raise DatasetError(f"{path}: no positive {column} values")
    return table.reset_index(drop=True)


def evaluate_measured(
    measured: pd.DataFrame, kind: str, predictor: Any, *, coverage: float = 0.9
) -> MeasuredEvaluation:
    """Predict ``measured`` (rows of ``kind`` with their measured column) and score the answers.

    Raises:
        PerfcastError: no row could be predicted.
    """
    column = MEASURED[kind]
    inputs = measured.drop(columns=[column])
    if kind == "ops":
        out = predict_ops_table(inputs, predictor=predictor, coverage=coverage)
    else:
        out = predict_steps_table(inputs, predictor=predictor, coverage=coverage)
    pred_col, lo_col, hi_col = PREDICTED[kind]
    out["measured_ms"] = pd.to_numeric(measured[column], errors="coerce").to_numpy()
    answered = (out[ERROR_COLUMN] == "") & out[pred_col].notna()
    if not answered.any():
        reasons = out[ERROR_COLUMN].value_counts().index[:3]
        raise PerfcastError(f"none of the {len(out)} measured rows could be predicted: {'; '.join(reasons)}")
    out["ape"] = np.where(answered, 100.0 * (out[pred_col] - out["measured_ms"]).abs() / out["measured_ms"], np.nan)
    summary = _scores(out[answered], pred_col, lo_col, hi_col)
    summary["n_unanswered"] = float((~answered).sum())
    group = GROUP[kind]
    by_group = pd.DataFrame(
        [{group: name, **_scores(block, pred_col, lo_col, hi_col)} for name, block in out[answered].groupby(group)]
    ).sort_values("mape", ascending=False)
    return MeasuredEvaluation(rows=out, summary=summary, by_group=by_group.reset_index(drop=True))


def _scores(rows: pd.DataFrame, pred_col: str, lo_col: str, hi_col: str) -> dict[str, float]:
    pred, true = rows[pred_col].to_numpy(float), rows["measured_ms"].to_numpy(float)
    lo, hi = rows[lo_col].to_numpy(float), rows[hi_col].to_numpy(float)
    has_interval = bool(np.isfinite(lo).all() and np.isfinite(hi).all())
    scores = summarize(pred, true, lo, hi) if has_interval else summarize(pred, true)
    scores["spearman"] = spearman(pred, true) if len(rows) > 2 else float("nan")
    return scores
