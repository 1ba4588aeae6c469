"""Record containers shared by the source readers.

Every reader turns one external source into rows of an interface table (op or run
table, see :mod:`perfcast.data.tables`) and drops nothing silently: rows it cannot use
go to a rejected frame with the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)

REASON_COLUMN = "reason"
"""Column of :attr:`ReadResult.rejected` that says why a row was rejected."""


def name_defaulted(defaulted: pd.Series, rows: np.ndarray, field: str) -> pd.Series:
    """``defaulted`` (per record, the ``;``-separated names of the fields a default filled; empty
    or NA for none) with ``field`` appended on the boolean ``rows``; the other rows unchanged."""
    current = defaulted.astype(object)
    named = current.fillna("").astype(str).map(lambda v: f"{v};{field}" if v else field)
    return current.where(~np.asarray(rows, dtype=bool), named)


@dataclass(frozen=True)
class ReadResult:
    """What a reader returns: the accepted records and the rejected source rows.

    Attributes:
        records: accepted rows in the target table's columns (op or run table), plus
            provenance columns (``source``, ``setting``, ``source_row`` ...).
        rejected: the source rows that were not accepted, as read, with a
            :data:`REASON_COLUMN` column stating why (several reasons joined by ``"; "``).
    """

    records: pd.DataFrame
    rejected: pd.DataFrame

    @property
    def n_records(self) -> int:
        """Number of accepted rows."""
        return len(self.records)

    @property
    def n_rejected(self) -> int:
        """Number of rejected rows."""
        return len(self.rejected)


class RejectionReasons:
    """Why each source row is rejected: reasons joined by ``"; "``, ``""`` for an accepted row.

    Masks and per-row reasons are positional (aligned with the rows the collector was
    made for).
    """

    def __init__(self, n: int) -> None:
        self.text = np.full(n, "", dtype=object)

    def add(self, mask: pd.Series | np.ndarray, reason: str | pd.Series | np.ndarray) -> None:
        """Record ``reason`` (one text, or one per row) for the rows where ``mask`` is true."""
        hit = np.asarray(mask, dtype=bool)
        if not hit.any():
            return
        why = np.asarray(reason, dtype=object)[hit] if isinstance(reason, (pd.Series, np.ndarray)) else reason
        current = self.text[hit]
        self.text[hit] = np.where(current == "", why, current + "; " + why)

    @property
    def ok(self) -> np.ndarray:
        """Mask of the accepted rows."""
        return self.text == ""

    def split(self, raw: pd.DataFrame, path: str | Path) -> tuple[np.ndarray, pd.DataFrame]:
        """(accepted mask, the rejected source rows with a :data:`REASON_COLUMN`)."""
        ok = self.ok
        if not ok.all():
            logger.info("%s: rejected %d of %d rows", path, int((~ok).sum()), len(raw))
        rejected = raw[~ok].assign(**{REASON_COLUMN: self.text[~ok]}).reset_index(drop=True)
        return ok, rejected
