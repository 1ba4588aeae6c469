"""The timing method of each op record: its ``timing`` cell, else what its source documents.

Readers write ``timing`` (:class:`~perfcast.data.schema.OpTiming`) on every record they make.
Records written before that column existed (datasets on disk, user tables) get their
source's documented method from :data:`SOURCE_TIMING`, keyed by the ``source`` column's
prefix (the text before the first ``:``); rows that say neither take ``default``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfcast.data.readers import _neusight_common as neusight
from perfcast.data.readers import deepbench, nsys, vidur
from perfcast.data.schema import OP_TIMING_COLUMN, OpTiming

__all__ = ["PROFILER_SOURCE", "SOURCE_TIMING", "record_timing"]

PROFILER_SOURCE = "perfcast-profiler"
"""``source`` of ``perfcast profile``'s records (``perfcast.data.profiler.run.SOURCE``)."""

SOURCE_TIMING: dict[str, OpTiming] = {
    neusight.SOURCE_NAME: neusight.TIMING,
    PROFILER_SOURCE: OpTiming.CUDA_EVENTS,  # profiles written before their records carried the column
    vidur.SOURCE_NAME: vidur.TIMING,
    deepbench.SOURCE_NAME: deepbench.TIMING,
    nsys.SOURCE_NAME: OpTiming(nsys.TIMING),
}
"""Timing method of each source (``source`` prefix) whose records may lack the column."""


def record_timing(records: pd.DataFrame, default: OpTiming) -> np.ndarray:
    """The :class:`OpTiming` value (its string) of each row, shape ``(n,)``.

    The row's ``timing`` cell if set, else its source's :data:`SOURCE_TIMING` entry, else
    ``default``.

    Raises:
        SpecError: a ``timing`` cell that is not a known timing (naming it and the allowed values).
    """
    n = len(records)
    out = np.full(n, default.value, dtype=object)
    if "source" in records:
        prefix = records["source"].astype(str).str.split(":", n=1).str[0].str.strip().str.lower()
        known = prefix.map({k: v.value for k, v in SOURCE_TIMING.items()})
        has = known.notna().to_numpy()
        out[has] = known.to_numpy(dtype=object)[has]
    if OP_TIMING_COLUMN in records:
        cells = records[OP_TIMING_COLUMN]
        given = cells.notna().to_numpy() & (cells.astype(str).str.strip() != "").to_numpy()
        if given.any():
            parsed = {v: OpTiming.parse(v).value for v in pd.unique(cells[given])}
            out[given] = cells[given].map(parsed).to_numpy(dtype=object)
    return out.astype(str)
