"""What the NeuSight readers share: provenance names, the repeat count, reading a source file and the cell checks.

See :mod:`perfcast.data.readers.neusight` for the source and its time statistic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.records import RejectionReasons
from perfcast.data.schema import DType, OpTiming
from perfcast.data.tables import read_table, require_columns
from perfcast.errors import SpecError

SOURCE_NAME = "neusight"
"""Prefix of the ``source`` provenance column."""
TIMING = OpTiming.CUDA_EVENTS
"""NeuSight times each call with CUDA events (collect.py): launch and host overhead included."""

NEUSIGHT_REPEATS = 25
"""Runs per op in NeuSight's collection; ``measured_ms`` is the mean of the 5 fastest."""

MAX_ELEMENTS = 2**62
"""Largest shape product accepted from a parsed shape (guards against garbage cells)."""


def read_source(path: str | Path, required: Sequence[str], what: str) -> pd.DataFrame:
    """The rows of a NeuSight file, indexed 0..n-1 (the ``source_row`` of each record).

    Raises:
        DatasetError: the file cannot be read, or lacks required columns (each named, with
            ``what``: ``"NeuSight GEMM"``).
    """
    raw = read_table(path).reset_index(drop=True)
    require_columns(raw, required, path, what)
    return raw


def numeric_columns(raw: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """The columns as float64; unparseable cells become NaN."""
    return raw[list(columns)].apply(pd.to_numeric, errors="coerce").astype("float64")


def bad_positive_int(value: pd.Series) -> pd.Series:
    """Mask of cells that are not positive whole numbers (NaN included)."""
    return ~(np.isfinite(value) & (value > 0) & (value == np.round(value)) & (value < MAX_ELEMENTS))


def bad_time(value: pd.Series) -> pd.Series:
    """Mask of cells that are not positive finite times."""
    return ~(np.isfinite(value) & (value > 0))


def map_names(values: pd.Series, parse: Callable[[str], object]) -> tuple[pd.Series, pd.Series]:
    """Map a name column per distinct value; (mapped values, error text or "" per row)."""
    mapping: dict[object, object] = {}
    errors: dict[object, str] = {}
    for raw in pd.unique(values):
        try:
            mapping[raw] = parse(str(raw).strip())
            errors[raw] = ""
        except (SpecError, KeyError, ValueError) as exc:
            mapping[raw] = None
            errors[raw] = str(exc.args[0]) if isinstance(exc, KeyError) else str(exc)
    return values.map(mapping), values.map(errors).fillna("").astype(object)


def parse_dtype(name: str) -> str:
    """The op-table dtype of a source dtype name (``float32`` -> ``fp32``); SpecError when unknown."""
    return DType.parse(name).value


def checked_dtypes(values: pd.Series, reasons: RejectionReasons) -> pd.Series:
    """The op-table dtype of each row (:func:`parse_dtype`); a row whose name is unknown is
    rejected in ``reasons`` with the parser's message."""
    dtype, error = map_names(values, parse_dtype)
    reasons.add((error != "").to_numpy(dtype=bool), error.to_numpy(dtype=object))
    return dtype


def label_to_device(label: pd.Series) -> pd.Series:
    """NeuSight's label directory (torch device name with ``_`` for spaces) -> device name."""
    return label.astype("string").str.replace("_", " ", regex=False).astype(object)
