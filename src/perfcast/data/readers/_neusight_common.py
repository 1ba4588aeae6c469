"""What the NeuSight readers share: provenance names, the repeat count, and the column checks.

See :mod:`perfcast.data.readers.neusight` for the source and its time statistic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.schema import DType, OpTiming
from perfcast.errors import DatasetError, SpecError

SOURCE_NAME = "neusight"
TIMING = OpTiming.CUDA_EVENTS
"""NeuSight times each call with CUDA events (collect.py): launch and host overhead included."""
"""Prefix of the ``source`` provenance column."""

NEUSIGHT_REPEATS = 25
"""Runs per op in NeuSight's collection; ``measured_ms`` is the mean of the 5 fastest."""

MAX_ELEMENTS = 2**62
"""Largest shape product accepted from a parsed shape (guards against garbage cells)."""


def check_columns(raw: pd.DataFrame, required: Sequence[str], path: str | Path, what: str) -> None:
    """Raise DatasetError naming every required column the source lacks."""
    missing = [c for c in required if c not in raw.columns]
    if missing:
        raise DatasetError(f"{path}: missing required {what} columns: {', '.join(missing)}")


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


def label_to_device(label: pd.Series) -> pd.Series:
    """NeuSight's label directory (torch device name with ``_`` for spaces) -> device name."""
    return label.astype("string").str.replace("_", " ", regex=False).astype(object)
