"""Record containers shared by the source readers.

Every reader turns one external source into rows of an interface table (op or run
table, see :mod:`perfcast.data.tables`) and drops nothing silently: rows it cannot use
go to a rejected frame with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

REASON_COLUMN = "reason"
"""Column of :attr:`ReadResult.rejected` that says why a row was rejected."""


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
