"""Stream a run or op table of any size through a predictor, a chunk at a time.

Memory stays bounded by the chunk (``chunk_rows`` rows, 50,000 by default), whatever the
file's size; each chunk is predicted as one batch (every distinct op of the chunk once),
appended to the output, and reported to ``progress``. The output is written atomically
(:class:`~perfcast.data.table_stream.TableWriter`), whatever the column types of each chunk
(a chunk of only invalid rows has all-NaN predictions); a table without rows gives its
input columns and the output columns, no rows. With ``breakdown`` every chunk gets
the same breakdown columns (a communication group absent from a chunk is 0 there), so
chunks stack into one table.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from perfcast.data.table_stream import DEFAULT_CHUNK_ROWS, TableWriter, iter_table_chunks
from perfcast.data.tables import ERROR_COLUMN
from perfcast.features.run_features import COMM_GROUPS
from perfcast.serve.batch import BREAKDOWN_COLUMNS, DEFAULT_COVERAGE, predict_ops_table, predict_steps_table


@dataclass(frozen=True)
class StreamResult:
    """Rows written, rows with an error, and the first rows (for a preview table)."""

    rows: int
    n_errors: int
    preview: pd.DataFrame


def _with_breakdown(out: pd.DataFrame) -> pd.DataFrame:
    """``out`` with exactly :data:`BREAKDOWN_COLUMNS` between the predictions and ``error``."""
    parts = out.reindex(columns=list(BREAKDOWN_COLUMNS))
    comm = [f"comm_{g}_ms" for g in COMM_GROUPS]
    valid = out[ERROR_COLUMN] == ""
    parts.loc[valid, comm] = parts.loc[valid, comm].fillna(0.0)
    head = out[[c for c in out.columns if c not in BREAKDOWN_COLUMNS and c != ERROR_COLUMN]]
    return pd.concat([head, parts, out[[ERROR_COLUMN]]], axis=1)


def stream_predict(
    source: str | Path,
    target: str | Path | None,
    kind: str,
    predictor: Any,
    *,
    coverage: float = DEFAULT_COVERAGE,
    breakdown: bool = False,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    preview_rows: int = 20,
    progress: Callable[[int], None] | None = None,
    fmt: str | None = None,
) -> StreamResult:
    """Predict the ``steps`` or ``ops`` table at ``source`` into ``target``, chunk by chunk
    (``target`` ``-`` is standard output, in text format ``fmt``; a file's format is its suffix;
    None writes nothing and keeps up to ``preview_rows`` rows in the result).

    Raises:
        DatasetError: the input cannot be read or the output written (nothing is left
            half-written).
        SpecError: a bad coverage.
    """
    n_errors, previews, rows = 0, [], 0
    with TableWriter(target, fmt) if target is not None else contextlib.nullcontext() as writer:
        for chunk in iter_table_chunks(source, chunk_rows):
            if kind == "steps":
                out = predict_steps_table(chunk, predictor=predictor, coverage=coverage, breakdown=breakdown)
                out = _with_breakdown(out) if breakdown else out
            else:
                out = predict_ops_table(chunk, predictor=predictor, coverage=coverage)
            if writer is not None:
                writer.write(out)
            rows += len(out)
            n_errors += int((out[ERROR_COLUMN] != "").sum())
            if sum(len(p) for p in previews) < preview_rows:
                previews.append(out.head(preview_rows))
            if progress is not None:
                progress(len(chunk))
    preview = pd.concat(previews).head(preview_rows) if previews else pd.DataFrame()
    return StreamResult(rows=rows, n_errors=n_errors, preview=preview)
