"""Tables of any size, in chunks: read CSV/Parquet a block of rows at a time, write atomically.

Batch prediction of millions of configs holds one chunk in memory, not the table.
:func:`iter_table_chunks` yields ``chunk_rows`` rows at a time (CSV through pandas'
chunked reader, Parquet through pyarrow's batch iterator); :class:`TableWriter` appends
chunks to a temporary file beside the target and moves it into place only when every
chunk is written, so a failure or an interrupt (SIGINT, SIGTERM) leaves an existing
target untouched and no temporary file behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pandas as pd

from perfcast.data.tables import (
    STDOUT,
    TEXT_FORMATS,
    check_output_path,
    read_errors,
    read_table,
    sweep_stale_temps,
    table_format,
    table_suffix,
    table_text,
    temp_path,
    terminate_as_exit,
)
from perfcast.errors import DatasetError

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_ROWS = 50_000


def count_rows(path: str | Path) -> int | None:
    """Rows of a table without parsing it (Parquet metadata, CSV or JSON Lines lines); None
    if unknown (gzip, JSON) or unreadable."""
    path = Path(path)
    try:
        fmt = table_format(path)
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(path).metadata.num_rows)
        if fmt == "json" or path.name.lower().endswith(".gz"):
            return None
        header = 1 if fmt == "csv" else 0
        with path.open("rb") as handle:
            return max(sum(1 for line in handle if line.strip()) - header, 0)
    except (DatasetError, *read_errors()):
        return None


def iter_table_chunks(path: str | Path, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[pd.DataFrame]:
    """Consecutive blocks of at most ``chunk_rows`` rows; the index counts rows from 0 across blocks.

    A table without rows yields one empty block that has the table's columns.

    Raises:
        DatasetError: a missing file, an unsupported suffix, a bad ``chunk_rows``, or a
            damaged or truncated file (naming the path, the last good row and the reason).
    """
    path = Path(path)
    fmt = table_format(path)
    if chunk_rows < 1:
        raise DatasetError(f"chunk_rows={chunk_rows} must be >= 1")
    if not path.exists():
        raise DatasetError(f"no such file: {path}")
    if not path.is_file():
        raise DatasetError(f"not a file: {path}")
    start = 0
    try:
        if fmt == "csv":
            blocks: Iterator[pd.DataFrame] = pd.read_csv(path, chunksize=chunk_rows)
        elif fmt == "jsonl":
            blocks = pd.read_json(path, lines=True, chunksize=chunk_rows, dtype=False)
        elif fmt == "json":  # one array: read whole
            whole = read_table(path)
            blocks = iter([whole.iloc[i : i + chunk_rows] for i in range(0, max(len(whole), 1), chunk_rows)])
        else:
            blocks = _parquet_blocks(path, chunk_rows)
        for block in blocks:
            block.index = pd.RangeIndex(start, start + len(block))
            start += len(block)
            yield block
    except read_errors() as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, EOFError):
            reason = f"the file is truncated ({reason})"
        raise DatasetError(f"cannot parse {fmt} table {path} after row {start}: {reason}") from exc


def _parquet_blocks(path: Path, chunk_rows: int) -> Iterator[pd.DataFrame]:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path)
    empty = True
    for batch in table.iter_batches(batch_size=chunk_rows):
        empty = False
        yield batch.to_pandas()
    if empty:
        yield table.schema_arrow.empty_table().to_pandas()


def check_table_target(path: str | Path, fmt: str | None = None) -> str:
    """The format a table written to ``path`` takes: standard output (``-``) in ``fmt``
    (default CSV), a file by its suffix (``fmt``, when given, must agree).

    Raises:
        DatasetError: an unsupported suffix or format, Parquet to standard output, a
            ``fmt`` that contradicts the suffix, or a path naming a folder.
    """
    if str(path) == STDOUT:
        chosen = fmt or "csv"
        if chosen not in TEXT_FORMATS:
            raise DatasetError(f"format={chosen!r} cannot go to standard output; allowed: {', '.join(TEXT_FORMATS)}")
        return chosen
    target = Path(path)
    by_suffix = table_format(target)
    if fmt is not None and fmt != by_suffix:
        raise DatasetError(f"format={fmt!r} contradicts the output {target.name!r} ({by_suffix}); drop one")
    check_output_path(target)
    return by_suffix


class TableWriter:
    """Append DataFrame chunks to a CSV (``.csv``, ``.csv.gz``), JSON, JSON Lines or Parquet
    file, atomically, or to standard output (path ``-``, a text ``fmt``).

    Use as a context manager: the target appears (or is replaced) when the block exits
    without an error; on an error, SIGINT or SIGTERM the temporary files are removed.
    Standard output gets each chunk as it is written.
    Every chunk must have the first chunk's columns, in order. Parquet chunks may differ
    in column types: each chunk is kept as a temporary piece, and on exit the pieces are
    stacked under one schema that promotes types (int to float, null to anything); a
    column whose types cannot be reconciled (numbers in one chunk, text in another) is
    written as text. Memory stays bounded by one chunk.
    """

    def __init__(self, path: str | Path, fmt: str | None = None) -> None:
        self.path = Path(path)
        self.to_stdout = str(path) == STDOUT
        self.format = check_table_target(path, fmt)
        self._tmp = temp_path(self.path, table_suffix(self.path))
        self._parts_dir = temp_path(self.path, ".parts")
        self._parts: list[Path] = []
        self._types: dict[str, Any] = {}
        self._text_columns: set[str] = set()
        self._first_schema: Any = None
        self._columns: list[str] | None = None
        self._signals: contextlib.ExitStack | None = None
        self.rows = 0

    def __enter__(self) -> TableWriter:
        if self.to_stdout:
            if self.format == "json":
                sys.stdout.write("[")
            return self
        check_output_path(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatasetError(f"cannot create directory {self.path.parent}: {exc}") from exc
        sweep_stale_temps(self.path.parent)
        self._signals = contextlib.ExitStack()
        self._signals.enter_context(terminate_as_exit())
        return self

    def write(self, chunk: pd.DataFrame) -> None:
        """Append ``chunk`` (its index is not written); columns must match the first chunk's."""
        if self._columns is None:
            self._columns = list(chunk.columns)
        elif list(chunk.columns) != self._columns:
            missing = sorted(set(self._columns) ^ set(chunk.columns))
            raise DatasetError(f"{self.path}: chunk columns differ from the first chunk's: {missing}")
        try:
            if self.format == "parquet":
                self._write_piece(chunk)
            elif self.to_stdout:
                sys.stdout.write(table_text(chunk, self.format, first=self.rows == 0))
                sys.stdout.flush()
            elif self.format == "csv":
                chunk.to_csv(self._tmp, mode="a", header=self.rows == 0, index=False)
            else:
                with self._tmp.open("a", encoding="utf-8") as handle:
                    handle.write(("[" if self.rows == 0 and self.format == "json" else "")
                                 + table_text(chunk, self.format, first=self.rows == 0))  # fmt: skip
        except OSError as exc:
            raise DatasetError(f"cannot write {self.path}: {exc}") from exc
        self.rows += len(chunk)

    def _write_piece(self, chunk: pd.DataFrame) -> None:
        import pyarrow.parquet as pq

        table = _to_arrow(chunk)
        if self._first_schema is None:
            self._first_schema = table.schema
            self._parts_dir.mkdir()
        for arrow_field in table.schema:
            self._types[arrow_field.name] = self._merged_type(arrow_field.name, arrow_field.type)
        piece = self._parts_dir / f"{len(self._parts):06d}.parquet"
        pq.write_table(table, piece)
        self._parts.append(piece)

    def _merged_type(self, name: str, new: Any) -> Any:
        """The type column ``name`` takes once a chunk of type ``new`` joins it."""
        import pyarrow as pa

        old = self._types.get(name)
        if old is None or old == new:
            return new
        if name in self._text_columns:
            return pa.large_string()
        try:
            one = pa.unify_schemas([pa.schema([(name, old)]), pa.schema([(name, new)])], promote_options="permissive")
            return one.field(name).type
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            logger.warning(
                "%s: column %r is %s in one chunk and %s after row %d; it is written as text",
                self.path, name, old, new, self.rows,
            )  # fmt: skip
            self._text_columns.add(name)
            return pa.large_string()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.to_stdout:
            if self.rows == 0 and self.format == "csv" and self._columns:
                sys.stdout.write(",".join(self._columns) + "\n")
            sys.stdout.write("]\n" if self.format == "json" else "")
            sys.stdout.flush()
            return
        try:
            if kind is None:
                self._finish()
        finally:
            with contextlib.suppress(OSError):
                self._tmp.unlink(missing_ok=True)
            shutil.rmtree(self._parts_dir, ignore_errors=True)
            if self._signals is not None:
                self._signals.close()

    def _finish(self) -> None:
        try:
            if self.format == "parquet":
                self._stack_pieces()
            elif self.format == "json":
                with self._tmp.open("a", encoding="utf-8") as handle:
                    handle.write("]\n" if self.rows else "[]\n")
            elif not self._tmp.exists():  # no chunk at all: an empty table
                pd.DataFrame(columns=self._columns or []).to_csv(self._tmp, index=False)
            os.replace(self._tmp, self.path)
        except OSError as exc:
            raise DatasetError(f"cannot write {self.path}: {exc}") from exc

    def _stack_pieces(self) -> None:
        """Write the pieces into the temporary target under their unified schema, one piece in memory."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._parts:
            pd.DataFrame(columns=self._columns or []).to_parquet(self._tmp, index=False)
            return
        fields = [pa.field(name, self._types[name]) for name in self._first_schema.names]
        same = all(f.type == self._first_schema.field(f.name).type for f in fields)
        schema = self._first_schema if same else pa.schema(fields)  # pandas metadata fits the first types only
        if len(self._parts) == 1 and same:
            os.replace(self._parts[0], self._tmp)
            return
        with pq.ParquetWriter(self._tmp, schema) as writer:
            for piece in self._parts:
                table = pq.read_table(piece)
                if not same:
                    table = pa.table([_cast(table.column(f.name), f, self.path) for f in fields], schema=schema)
                writer.write_table(table)
                piece.unlink()


def _to_arrow(chunk: pd.DataFrame) -> Any:
    """``chunk`` as an Arrow table; object columns that mix types within the chunk become text."""
    import pyarrow as pa

    try:
        return pa.Table.from_pandas(chunk, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        fixed = chunk.copy()
        for col in fixed.columns:
            if fixed[col].dtype == object:
                fixed[col] = fixed[col].map(lambda v: None if _is_null(v) else str(v)).astype(object)
        return pa.Table.from_pandas(fixed, preserve_index=False)


def _is_null(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # list-like cells
        return False


def _cast(column: Any, target: Any, path: Path) -> Any:
    """``column`` as the unified field's type; to text through Python strings when Arrow cannot cast."""
    import pyarrow as pa

    if column.type == target.type:
        return column
    try:
        return column.cast(target.type, safe=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        if not pa.types.is_large_string(target.type):
            raise DatasetError(f"{path}: column {target.name!r} cannot be stored as {target.type}: {exc}") from exc
        values = [None if v is None else str(v) for v in column.to_pylist()]
        return pa.array(values, type=target.type)
