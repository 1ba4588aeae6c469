"""Reading and writing the op and run tables (CSV, gzip CSV, Parquet), and perfcast's temporary files.

This module knows the column names of the interface tables (DESIGN.md,
"Interfaces") and the file formats; it knows nothing about what a GPU is.
Times in these tables are milliseconds (``_ms`` columns).

Every write of perfcast (tables, datasets, bundles) goes to a temporary sibling of its
target named ``.<NAME>.perfcast-<pid>-<hex>.tmp<suffix>`` (:func:`temp_path`), moved into
place when complete. :func:`terminate_as_exit` turns SIGTERM into ``SystemExit`` while a
write runs, so the writer's cleanup removes the temporary file on SIGINT and SIGTERM alike;
:func:`sweep_stale_temps` removes those a killed process (SIGKILL, power loss) left behind,
on the next write to the same folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import threading
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pandas as pd

from perfcast.errors import DatasetError, SpecError

logger = logging.getLogger(__name__)

OP_COLUMNS: tuple[str, ...] = (
    "op",
    # GEMM-like ops (batch is shared with attention)
    "batch",
    "m",
    "n",
    "k",
    # vector ops
    "rows",
    "cols",
    "scalar",
    # attention
    "heads",
    "kv_heads",
    "seq_q",
    "seq_kv",
    "head_dim",
    "causal",
    # collectives
    "bytes",
    "n_ranks",
    "ranks_per_node",
    "dtype",
    "gpu",
)
"""Input columns of the op table, in DESIGN.md order (a row uses those its op needs)."""

OP_SHAPE_COLUMNS: tuple[str, ...] = (*(c for c in OP_COLUMNS if c != "gpu"), "backward")
"""What identifies an op apart from its device: the op-table inputs less ``gpu``, plus ``backward``."""

OP_MEASURED_COLUMN = "measured_ms"
"""Optional measured op time of the op table, ms."""

OP_OUTPUT_COLUMNS: tuple[str, ...] = ("pred_ms", "pred_lo_ms", "pred_hi_ms")
"""Columns batch op prediction adds: median and interval bounds, ms."""

RUN_COLUMNS: tuple[str, ...] = (
    # model
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "ffn_hidden_size",
    "vocab_size",
    "seq_len",
    # parallel layout
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "micro_batch",
    "global_batch",
    "vpp",
    "sequence_parallel",
    "zero_stage",
    "recompute",
    "finetune",
    "lora_rank",
    "dtype",
    # cluster
    "gpu",
    "num_gpus",
    "gpus_per_node",
)
"""Input columns of the run table, in DESIGN.md order."""

PIPELINE_SPLIT_COLUMNS: tuple[str, ...] = (
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "first_stage_layers",
    "last_stage_layers",
)
"""Optional run-table inputs setting how layers split over pipeline stages (Megatron-Core's switches)."""

SOFTWARE_SWITCH_COLUMNS: tuple[str, ...] = (
    "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "fsdp_prefetch", "ep_comm_overlap", "cuda_graphs",
    "torch_compile",
)  # fmt: skip
"""Optional boolean run-table inputs saying what the training framework overlaps or fuses;
unstated ones take the ``framework``'s shipped defaults (``docs/frameworks.md``)."""

SOFTWARE_COLUMNS: tuple[str, ...] = ("framework", *SOFTWARE_SWITCH_COLUMNS)
"""Optional run-table inputs naming the training framework and its switches."""

RUN_OPTIONAL_COLUMNS: tuple[str, ...] = (
    "num_experts", "top_k", "etp", "dp_replicate", "gated_mlp", "model", "nvlink_domain", "inter_node", "fp8_recipe",
    "document_tokens", *PIPELINE_SPLIT_COLUMNS, *SOFTWARE_COLUMNS,
)  # fmt: skip
"""Optional run-table inputs (MoE, expert tensor parallelism ``etp`` (default 1) and gating, the
replicas of hybrid-sharded ZeRO state ``dp_replicate`` (default 1: fully sharded), a
model preset/config instead of the shape, the GPUs of one NVLink domain (72 on NVL72 racks;
default from the catalog), fabric, the scaling recipe of fp8 runs: tensorwise | delayed |
rowwise | blockwise | mxfp8, the attention length of sequences packed from several documents, the
uneven-pipeline switches)."""

RUN_MEASURED_COLUMN = "measured_step_ms"
"""Optional measured training-step time of the run table, ms."""

RUN_OUTPUT_COLUMNS: tuple[str, ...] = (
    "step_ms",
    "step_lo_ms",
    "step_hi_ms",
    "peak_mem_gib",
    "fits_memory",
    "mfu",
    "tokens_per_s",
)
"""Columns batch step prediction adds (ms, GiB, fraction 0..1, tokens/s)."""

DEFAULT_COVERAGE = 0.9
"""Nominal coverage of the prediction intervals (``*_lo_ms``..``*_hi_ms``) unless asked otherwise."""

ERROR_COLUMN = "error"
"""Column holding the reason a row is not a valid config (empty when valid)."""

_SUFFIXES = {
    "csv": (".csv", ".csv.gz"),
    "parquet": (".parquet", ".pq"),
    "jsonl": (".jsonl", ".ndjson"),
    "json": (".json",),
}
SUPPORTED_SUFFIXES: tuple[str, ...] = tuple(s for suffixes in _SUFFIXES.values() for s in suffixes)
"""File name endings :func:`read_table` and :func:`write_table` accept (case-insensitive)."""
TEXT_FORMATS = ("csv", "json", "jsonl")
"""Table formats that can be written to a stream (standard output): JSON is an array of row
objects, JSON Lines one row object per line; empty cells are ``null``."""
STDOUT = "-"
"""The output name that means standard output."""


def distinct_rows(columns: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(inverse, first)`` of the rows that equal-length ``columns`` form: each row's index into
    the distinct rows, and the index of each distinct row's first occurrence (one hash pass per
    column, then one mixed-radix code per row; NaN is a value like any other). The product of
    the columns' distinct-value counts must fit an int64."""
    code = np.zeros(len(columns[0]) if len(columns) else 0, dtype=np.int64)
    for column in columns:
        values, distinct = pd.factorize(np.asarray(column), use_na_sentinel=False)
        code = code * max(len(distinct), 1) + values
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return inverse.reshape(-1), first


def cell_holds_value(value: object) -> bool:
    """Whether a table cell holds a value: not None, NaN, ``pd.NA``/``NaT`` (nullable dtypes) or blank text."""
    if isinstance(value, str):
        return bool(value.strip())
    missing = pd.isna(value)  # None, NaN of any float type, pd.NA, NaT; False for a mapping (an inline config)
    return True if hasattr(missing, "__len__") else not bool(missing)  # a list-like cell holds a value


def misspelt_columns(
    columns: Iterable[Any], inputs: Iterable[str], aliases: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Columns that are not among a table's ``inputs`` but name one another way -> that input.

    A column is misspelt when it equals an input in another case (``TP``, ``Batch``) or is one
    of ``aliases`` (lowercase name -> input; e.g. Megatron-LM's ``global_batch_size``). Other
    columns pass through unread.
    """
    names = list(inputs)
    lowered = {name.lower(): name for name in names}
    out = {}
    for column in columns:
        if not isinstance(column, str) or column in names:
            continue
        key = column.strip().lower()
        target = lowered.get(key) or (aliases or {}).get(key)
        if target is not None:
            out[column] = target
    return out


def unread_values_error(
    row: Mapping[str, Any], misspelt: Mapping[str, str], table: str, same: Callable[[str, Any, Any], bool]
) -> SpecError | None:
    """The error of a row that states a value under a :func:`misspelt_columns` column, which would go unread;
    None where each such value is empty or repeats (``same(input, value, stated)``) what the input's own
    column states. ``table`` names the table kind in the message (``run``, ``op``)."""
    ignored: dict[str, str] = {}
    conflicts = []
    for column, field in misspelt.items():
        value = row.get(column)
        if not cell_holds_value(value):
            continue
        if field in row and cell_holds_value(row[field]):
            if not same(field, value, row[field]):
                conflicts.append(f"column {column!r}={_shown(value)} conflicts with {field}={_shown(row[field])}")
        else:
            ignored[column] = field
    if conflicts:
        return SpecError(f"{'; '.join(conflicts)}: give each value once, under the input's own name")
    if not ignored:
        return None
    names = ", ".join(map(repr, ignored))
    verb = f"is not a {table}-table input" if len(ignored) == 1 else f"are not {table}-table inputs"
    spelt = ", ".join(f"{column!r} as {field!r}" for column, field in ignored.items())
    return SpecError(f"column{'s' * (len(ignored) > 1)} {names} {verb} and would be ignored; write {spelt} "
                     "(input names are lowercase)")  # fmt: skip


def _shown(value: Any) -> Any:
    """A cell as a message quotes it: a whole float (a NaN-widened integer column's) as an int."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def table_format(path: Path) -> str:
    """Return ``"csv"``, ``"parquet"``, ``"json"`` or ``"jsonl"`` from the file name, or raise DatasetError."""
    name = path.name.lower()
    for fmt, suffixes in _SUFFIXES.items():
        if name.endswith(suffixes):
            return fmt
    allowed = ", ".join(SUPPORTED_SUFFIXES)
    raise DatasetError(f"unsupported table file {str(path)!r}: the name must end with one of {allowed}")


def table_text(df: pd.DataFrame, fmt: str, *, first: bool) -> str:
    """Rows of ``df`` in a text format, to append after earlier chunks: CSV with its header
    only when ``first``; JSON Lines; or JSON array elements (the caller writes the brackets,
    this adds the separating comma when not ``first``)."""
    if fmt == "csv":
        return df.to_csv(index=False, header=first)
    if df.empty:
        return ""
    text = df.to_json(orient="records", lines=True, date_format="iso", force_ascii=False)
    if fmt == "jsonl":
        return text if text.endswith("\n") else text + "\n"
    return ("" if first else ",\n") + ",\n".join(text.rstrip("\n").split("\n"))


def _read_json_table(path: Path, fmt: str) -> pd.DataFrame:
    return pd.read_json(path, orient="records", lines=fmt == "jsonl", dtype=False)


def read_errors() -> tuple[type[BaseException], ...]:
    """What pandas, gzip and pyarrow raise for a damaged or truncated table file.

    Meant for ``except read_errors():`` (evaluated only when an exception is matched, so
    pyarrow is imported only then).
    """
    import pyarrow as pa

    return (
        OSError,  # also gzip.BadGzipFile and pyarrow's ArrowIOError
        ValueError,  # also pandas' EmptyDataError and pyarrow.ArrowInvalid
        EOFError,  # a truncated .gz
        zlib.error,
        UnicodeDecodeError,
        pd.errors.ParserError,
        pa.ArrowException,  # a damaged Parquet footer, page or schema
    )


def require_columns(raw: pd.DataFrame, required: Sequence[str], path: str | Path, what: str) -> None:
    """Check that a source table holds every required column.

    Raises:
        DatasetError: ``"<path>: missing required <what> columns: <each one missing>"``.
    """
    missing = [c for c in required if c not in raw.columns]
    if missing:
        raise DatasetError(f"{path}: missing required {what} columns: {', '.join(missing)}")


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``), Parquet (``.parquet``, ``.pq``), JSON (an array of
    row objects, ``.json``) or JSON Lines (``.jsonl``, ``.ndjson``) table.

    Args:
        path: the file; its name ending selects the format.

    Returns:
        The table as read, with no column checks (readers and specs check columns).

    Raises:
        DatasetError: the file is missing, its suffix is not supported, or it cannot be parsed
            (the message names the path and the parser's reason).
    """
    path = Path(path)
    fmt = table_format(path)
    if not path.exists():
        raise DatasetError(f"no such file: {path}")
    if not path.is_file():
        raise DatasetError(f"not a file: {path}")
    try:
        if fmt == "csv":
            return pd.read_csv(path)
        if fmt in ("json", "jsonl"):
            return _read_json_table(path, fmt)
        return pd.read_parquet(path)
    except read_errors() as exc:
        raise DatasetError(f"cannot parse {fmt} table {path}: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    """One line saying why a read failed (an EOFError's message alone is cryptic)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, EOFError):
        return f"the file is truncated ({text})"
    return text


def check_output_path(path: Path) -> None:
    """Refuse an output path that names a folder (or a file inside a non-folder).

    Raises:
        DatasetError: ``path`` is an existing folder, or its parent exists and is not a folder.
    """
    if path.is_dir():
        raise DatasetError(f"output {path} is a folder; name a file ending in {', '.join(SUPPORTED_SUFFIXES)}")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise DatasetError(f"output {path}: {parent} is not a folder")


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write ``df`` (without its index) as CSV, Parquet, JSON or JSON Lines, chosen by suffix, atomically.

    The table goes to a temporary file in the target's directory, which then replaces
    the target with :func:`os.replace`. On any failure the temporary file is removed and
    an existing target is left untouched. Missing parent directories are created.

    Args:
        df: the table.
        path: the target file; ``.csv.gz`` is written gzip-compressed.

    Returns:
        The target path.

    Raises:
        DatasetError: unsupported suffix, or the write failed (naming the path and reason).
    """
    path = Path(path)
    fmt = table_format(path)
    check_output_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatasetError(f"cannot create directory {path.parent}: {exc}") from exc
    sweep_stale_temps(path.parent)
    # the temporary name keeps the suffix so pandas infers gzip compression for .csv.gz
    tmp = temp_path(path, table_suffix(path))
    try:
        with terminate_as_exit():
            if fmt == "parquet":
                df.to_parquet(tmp, index=False)
            elif fmt == "json":
                tmp.write_text("[" + table_text(df, fmt, first=True) + "]\n", encoding="utf-8")
            else:
                df.to_csv(tmp, index=False) if fmt == "csv" else tmp.write_text(table_text(df, fmt, first=True))
            os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, Exception):
            raise DatasetError(f"cannot write {fmt} table {path}: {exc}") from exc
        raise
    logger.debug("wrote %d rows to %s", len(df), path)
    return path


def table_suffix(path: Path) -> str:
    """The format suffix of a table file name (``.csv.gz`` counts as one), kept by its temporary files."""
    return ".csv.gz" if path.name.lower().endswith(".csv.gz") else path.suffix


# ----------------------------------------------------------------------------- temporary files

_HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.perfcast-(?P<pid>\d+)-(?P<host>[0-9a-f]{8})[0-9a-f]{8}\.(?P<kind>tmp|old)")


def temp_path(target: Path, suffix: str = "", *, kind: str = "tmp") -> Path:
    """A fresh temporary sibling of ``target``: ``.<NAME>.perfcast-<pid>-<hex>.<kind><suffix>``.

    ``kind`` is ``tmp`` (a write in progress) or ``old`` (a previous version being swapped
    out, restored by :func:`sweep_stale_temps` if its process died before replacing it).
    """
    if kind not in ("tmp", "old"):
        raise ValueError(f"kind={kind!r}; allowed: tmp, old")
    tag = f"{os.getpid()}-{_HOST_TAG}{uuid.uuid4().hex[:8]}"
    return target.with_name(f".{target.name}.perfcast-{tag}.{kind}{suffix}")


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # no permission to signal it: it exists
        return True
    return True


def sweep_stale_temps(folder: Path) -> list[Path]:
    """Remove the temporary files and folders (:func:`temp_path`) that dead processes left in ``folder``.

    Only names of this pattern written on this host by a process that no longer runs are
    touched. A swapped-out previous version (``.old``) whose target is missing is renamed
    back to the target instead of removed. Returns the paths removed or restored; failures
    are logged, never raised.
    """
    done: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return done
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        if not match or match["host"] != _HOST_TAG or _process_alive(int(match["pid"])):
            continue
        try:
            target = folder / match["name"]
            if match["kind"] == "old" and not target.exists():
                os.rename(entry, target)
                logger.warning("restored %s from %s, left by a perfcast process that was killed", target, entry.name)
            elif entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
                logger.info("removed %s, left by a perfcast process that was killed", entry)
            else:
                entry.unlink()
                logger.info("removed %s, left by a perfcast process that was killed", entry)
            done.append(entry)
        except OSError as exc:
            logger.warning("cannot remove stale temporary %s: %s", entry, exc)
    return done


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``SystemExit(143)`` so ``finally`` and ``__exit__`` cleanups run.

    Installed only in the main thread and only over the default handler (a handler the
    application set stays); the previous handler is restored when the block exits.
    """
    installed = False
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _exit_on_sigterm)
                installed = True
    try:
        yield
    finally:
        if installed:
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
