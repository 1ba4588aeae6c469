"""Tables of any size, in chunks: read CSV/Parquet a block of rows at a time, write atomically.

Batch prediction of millions of configs holds one chunk in memory, not the table.
:func:`iter_table_chunks` yields ``chunk_rows`` rows at a time (CSV through pandas'
chunked reader, Parquet through pyarrow's batch iterator); :class:`TableWriter` appends
chunks to a temporary file beside the target and moves it into place only when every
chunk is written, so a failure leaves an existing target untouched.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pandas as pd

from perfcast.data.tables import table_format
from perfcast.errors import DatasetError

DEFAULT_CHUNK_ROWS = 50_000


def count_rows(path: str | Path) -> int | None:
    """Rows of a table without reading it (Parquet metadata, or CSV lines); None if unknown."""
    path = Path(path)
    try:
        if table_format(path) == "parquet":
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(path).metadata.num_rows)
        if path.name.lower().endswith(".gz"):
            return None
        with path.open("rb") as handle:
            return max(sum(1 for _ in handle) - 1, 0)
    except OSError:
        return None


def iter_table_chunks(path: str | Path, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[pd.DataFrame]:
    """Consecutive blocks of at most ``chunk_rows`` rows; the index counts rows from 0 across blocks.

    Raises:
        DatasetError: a missing file, an unsupported suffix, a bad ``chunk_rows``, or a
            parse failure (naming the path and the reason).
    """
    path = Path(path)
    fmt = table_format(path)
    if chunk_rows < 1:
        raise DatasetError(f"chunk_rows={chunk_rows} must be >= 1")
    if not path.is_file():
        raise DatasetError(f"no such file: {path}")
    start = 0
    try:
        if fmt == "csv":
            blocks: Iterator[pd.DataFrame] = pd.read_csv(path, chunksize=chunk_rows)
        else:
            import pyarrow.parquet as pq

            blocks = (b.to_pandas() for b in pq.ParquetFile(path).iter_batches(batch_size=chunk_rows))
        for block in blocks:
            block.index = pd.RangeIndex(start, start + len(block))
            start += len(block)
            yield block
    except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise DatasetError(f"cannot parse {fmt} table {path} after row {start}: {exc}") from exc


class TableWriter:
    """Append DataFrame chunks to a CSV (``.csv``, ``.csv.gz``) or Parquet file, atomically.

    Use as a context manager: the target appears (or is replaced) when the block exits
    without an error; on an error the temporary file is removed. Parquet chunks take the
    schema of the first chunk; a later chunk whose columns cannot be cast to it raises
    :class:`DatasetError` naming the column.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.format = table_format(self.path)
        suffix = ".csv.gz" if self.path.name.lower().endswith(".csv.gz") else self.path.suffix
        self._tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.tmp{suffix}")
        self._writer = None
        self._schema = None
        self._columns: list[str] | None = None
        self.rows = 0

    def __enter__(self) -> TableWriter:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatasetError(f"cannot create directory {self.path.parent}: {exc}") from exc
        return self

    def write(self, chunk: pd.DataFrame) -> None:
        """Append ``chunk`` (its index is not written); columns must match the first chunk's."""
        if self._columns is None:
            self._columns = list(chunk.columns)
        elif list(chunk.columns) != self._columns:
            missing = sorted(set(self._columns) ^ set(chunk.columns))
            raise DatasetError(f"{self.path}: chunk columns differ from the first chunk's: {missing}")
        try:
            if self.format == "csv":
                chunk.to_csv(self._tmp, mode="a", header=self.rows == 0, index=False)
            else:
                self._write_parquet(chunk)
        except OSError as exc:
            raise DatasetError(f"cannot write {self.path}: {exc}") from exc
        self.rows += len(chunk)

    def _write_parquet(self, chunk: pd.DataFrame) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._writer is None:
            table = pa.Table.from_pandas(chunk, preserve_index=False)
            self._schema = table.schema
            self._writer = pq.ParquetWriter(self._tmp, self._schema)
        else:
            try:
                table = pa.Table.from_pandas(chunk, schema=self._schema, preserve_index=False, safe=False)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise DatasetError(
                    f"{self.path}: a column changes type after row {self.rows} ({exc}); write CSV instead"
                ) from exc
        self._writer.write_table(table)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._writer is not None:
            self._writer.close()
        if kind is not None:
            self._tmp.unlink(missing_ok=True)
            return
        if not self._tmp.exists():  # no chunk at all: an empty table
            empty = pd.DataFrame(columns=self._columns or [])
            empty.to_csv(self._tmp, index=False) if self.format == "csv" else empty.to_parquet(self._tmp, index=False)
        os.replace(self._tmp, self.path)
