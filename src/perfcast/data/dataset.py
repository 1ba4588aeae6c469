"""Datasets on disk: a folder of Parquet record tables and a card that describes them.

Layout of a dataset folder::

    card.json          what it is: source, how it was measured, counts, hashes, hardware
    ops.parquet        op records (if any)       -- see perfcast.data.schema
    runs.parquet       run records (if any)
    rejected.parquet   source rows that were not accepted, with their reasons (if any)

A dataset is written atomically: everything goes to a temporary sibling folder that is
renamed into place, so a reader never sees half a dataset and a failed write leaves the
previous version untouched. A write replaces only an empty folder or a perfcast dataset
(a folder holding nothing but the files above), never a folder with other content. The
card's hashes are taken from the tables as written and read back, so a dataset validates
as soon as it is written. Loading checks the card, the files, the row counts, the content
hashes and every record against the schema; any failure is a
:class:`~perfcast.errors.DatasetError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from perfcast._version import perfcast_version
from perfcast.data.records import REASON_COLUMN
from perfcast.data.tables import read_errors, sweep_stale_temps, temp_path, terminate_as_exit
from perfcast.data.validate import GpuResolver, check_op_records, check_run_records
from perfcast.errors import DatasetError

logger = logging.getLogger(__name__)

CARD_FILE = "card.json"
TABLE_FILES = {"ops": "ops.parquet", "runs": "runs.parquet"}
REJECTED_FILE = "rejected.parquet"
PARTIAL_DIR = ".partial"
"""The journal folder ``perfcast profile`` keeps in its output while it measures."""
DATASET_ENTRIES = frozenset({CARD_FILE, REJECTED_FILE, PARTIAL_DIR, *TABLE_FILES.values()})
"""Every entry a dataset folder may hold; a folder with anything else is not perfcast's to replace."""
CARD_SCHEMA_VERSION = 1
TOP_REASONS = 20


@dataclass(frozen=True)
class Dataset:
    """A loaded dataset: its op and run records (empty frames when absent) and its card."""

    path: Path
    card: dict[str, Any]
    ops: pd.DataFrame
    runs: pd.DataFrame
    rejected: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def name(self) -> str:
        """The dataset's name (from its card)."""
        return str(self.card.get("name", self.path.name))


def content_hash(df: pd.DataFrame) -> str:
    """SHA-256 of a table's content (column names and values, not the file encoding)."""
    digest = hashlib.sha256()
    digest.update("\x1f".join(map(str, df.columns)).encode())
    if len(df):
        digest.update(pd.util.hash_pandas_object(df.astype(object), index=False).to_numpy().tobytes())
    return digest.hexdigest()


def _reason_counts(rejected: pd.DataFrame) -> dict[str, int]:
    if rejected.empty or REASON_COLUMN not in rejected:
        return {}
    reasons = rejected[REASON_COLUMN].astype(str).str.split("; ").explode()
    return {str(k): int(v) for k, v in reasons.value_counts().head(TOP_REASONS).items()}


def _summary(df: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": len(df), "content_hash": content_hash(df)}
    for col in ("gpu", "dtype", "op", "timing", "timing_scope"):
        if col in df and len(df):
            out[f"{col}_counts"] = {str(k): int(v) for k, v in df[col].astype(str).value_counts().items()}
    return out


def build_card(
    name: str,
    *,
    source: str,
    how_measured: str,
    tables: dict[str, pd.DataFrame],
    rejected: pd.DataFrame | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The card of a dataset: provenance, measurement method, counts and hashes."""
    rejected = rejected if rejected is not None else pd.DataFrame()
    return {
        "schema_version": CARD_SCHEMA_VERSION,
        "name": name,
        "source": source,
        "how_measured": how_measured,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "perfcast_version": perfcast_version(),
        "tables": {kind: _summary(df) for kind, df in tables.items()},
        "rejected": {
            "rows": len(rejected),
            "content_hash": content_hash(rejected),
            "by_reason": _reason_counts(rejected),
        },
        "extra": extra or {},
    }


def _to_parquet(df: pd.DataFrame, path: Path) -> None:
    """Write ``df``; an object column Arrow cannot type (mixed text and numbers) is stored as
    text, its empty cells (None, NaN, NA) staying null."""
    import pyarrow as pa

    clean = df.copy()
    for col in clean.columns:
        if clean[col].dtype != object:
            continue
        try:
            pa.array(clean[col], from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            clean[col] = clean[col].map(lambda v: None if _is_null(v) else str(v)).astype(object)
    clean.to_parquet(path, index=False)


def _is_null(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # list-like cells
        return False


def check_dataset_target(path: str | Path, *, replace: bool) -> None:
    """Refuse a write to ``path`` that would delete something perfcast did not create.

    Allowed: a path that does not exist, an empty folder, and (with ``replace``) a folder
    holding only dataset entries (:data:`DATASET_ENTRIES`): an earlier dataset, or an
    unfinished profile.

    Raises:
        DatasetError: ``path`` is a file, a folder with other content, or a dataset while
            ``replace`` is off.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        raise DatasetError(f"{path} exists and is not a folder; choose a new or empty folder for the dataset")
    try:
        names = sorted(p.name for p in path.iterdir())
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    if not names:
        return
    foreign = [n for n in names if n not in DATASET_ENTRIES]
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise DatasetError(
            f"{path} is a non-empty folder that is not a perfcast dataset (it holds {shown}); refusing to "
            "replace it: choose a new or empty folder"
        )
    if not replace:
        raise DatasetError(f"{path} is already a dataset; pass --force to replace it")


def write_dataset(
    path: str | Path,
    *,
    name: str | None = None,
    source: str,
    how_measured: str,
    ops: pd.DataFrame | None = None,
    runs: pd.DataFrame | None = None,
    rejected: pd.DataFrame | None = None,
    extra: dict[str, Any] | None = None,
    replace: bool = True,
) -> Path:
    """Write a dataset folder atomically (see the module docstring); returns its path.

    Records are written as given: validate them first with
    :func:`~perfcast.data.validate.check_op_records` / ``check_run_records``.

    Args:
        replace: whether an existing dataset at ``path`` may be replaced. A folder that is
            not a dataset (:func:`check_dataset_target`) is never replaced.

    Raises:
        DatasetError: no records (every source row rejected, or none at all), a target
            that may not be replaced, or the write failed (the old dataset, if any, is kept).
    """
    path = Path(path)
    tables = {k: v for k, v in (("ops", ops), ("runs", runs)) if v is not None and len(v)}
    if not tables:
        n_rejected = 0 if rejected is None else len(rejected)
        if not n_rejected:
            raise DatasetError(f"nothing to write to {path}: no records and no rejected rows")
        top = "; ".join(f"{k} ({v})" for k, v in list(_reason_counts(rejected).items())[:3])
        raise DatasetError(f"no records to write to {path}: all {n_rejected} source rows were rejected, e.g. {top}")
    check_dataset_target(path, replace=replace)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatasetError(f"cannot create folder {path.parent}: {exc}") from None
    sweep_stale_temps(path.parent)
    tmp = temp_path(path)
    backup = temp_path(path, kind="old")
    try:
        with terminate_as_exit():
            tmp.mkdir()
            written = {}
            for kind, df in tables.items():
                _to_parquet(df, tmp / TABLE_FILES[kind])
                written[kind] = pd.read_parquet(tmp / TABLE_FILES[kind])  # hash what a reader will see
            kept = pd.DataFrame()
            if rejected is not None and not rejected.empty:
                _to_parquet(rejected, tmp / REJECTED_FILE)
                kept = pd.read_parquet(tmp / REJECTED_FILE)
            card = build_card(name or path.name, source=source, how_measured=how_measured, tables=written,
                              rejected=kept, extra=extra)  # fmt: skip
            (tmp / CARD_FILE).write_text(json.dumps(card, indent=2, sort_keys=False) + "\n", encoding="utf-8")
            check_dataset_target(path, replace=replace)  # again: the folder may have changed meanwhile
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, backup)
            os.rename(tmp, path)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if backup.exists() and not path.exists():
            os.rename(backup, path)
        if isinstance(exc, DatasetError) or not isinstance(exc, Exception):
            raise
        raise DatasetError(f"cannot write dataset {path}: {exc}") from exc
    shutil.rmtree(backup, ignore_errors=True)
    logger.info("wrote dataset %s (%s)", path, ", ".join(f"{k}: {len(v)} rows" for k, v in tables.items()))
    return path


def read_card(path: str | Path) -> dict[str, Any]:
    """The card of the dataset folder ``path``, its shape checked.

    Raises:
        DatasetError: no card, an unreadable one, another schema version, or a ``tables`` or
            ``rejected`` entry of the wrong shape (named with the value found).
    """
    card_path = Path(path) / CARD_FILE
    if not card_path.is_file():
        raise DatasetError(f"{path} is not a dataset: no {CARD_FILE}")
    try:
        card = json.loads(card_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{card_path}: unreadable card: {exc}") from None
    if not isinstance(card, dict) or card.get("schema_version") != CARD_SCHEMA_VERSION:
        raise DatasetError(f"{card_path}: schema_version must be {CARD_SCHEMA_VERSION}")
    tables = card.get("tables")
    if not isinstance(tables, dict):
        raise DatasetError(f"{card_path}: tables must be an object of ops/runs summaries, got {tables!r}")
    for kind, meta in tables.items():
        if kind not in TABLE_FILES:
            raise DatasetError(f"{card_path}: tables.{kind}: unknown table; allowed: {', '.join(TABLE_FILES)}")
        _check_summary(card_path, f"tables.{kind}", meta, need_hash=True)
    _check_summary(card_path, "rejected", card.get("rejected"), need_hash=False)
    return card


def _check_summary(card_path: Path, where: str, meta: Any, *, need_hash: bool) -> None:
    if not isinstance(meta, dict):
        raise DatasetError(f"{card_path}: {where} must be an object with rows and content_hash, got {meta!r}")
    rows = meta.get("rows")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise DatasetError(f"{card_path}: {where}.rows must be a whole number >= 0, got {rows!r}")
    digest = meta.get("content_hash")
    if (need_hash or digest is not None) and not isinstance(digest, str):
        raise DatasetError(f"{card_path}: {where}.content_hash must be a sha256 hex string, got {digest!r}")


def _read_parquet(file: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(file)
    except read_errors() as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise DatasetError(f"{file}: unreadable Parquet file: {reason}") from None


def _check_table(file: Path, df: pd.DataFrame, meta: dict[str, Any]) -> None:
    """``df`` (read from ``file``) has the row count and, when the card records one, the hash of ``meta``."""
    if len(df) != meta["rows"]:
        raise DatasetError(f"{file}: {len(df)} rows, but the card says {meta['rows']} (modified after writing?)")
    digest = meta.get("content_hash")
    if digest is not None and content_hash(df) != digest:
        raise DatasetError(f"{file}: content does not match the card's hash (modified after writing?)")


def load_dataset(path: str | Path, *, resolve_gpu: GpuResolver | None = None) -> Dataset:
    """Load and check a dataset folder.

    Raises:
        DatasetError: a missing or malformed card, a card listing no record table, a table
            file the card does not list (or lists but is missing), a damaged file, a row
            count or content that no longer matches the card, or any record that breaks
            the schema (with the first reasons).
    """
    path = Path(path)
    card = read_card(path)
    tables = card["tables"]
    if not tables:
        raise DatasetError(f"{path / CARD_FILE}: tables is empty; a dataset holds op and/or run records")
    for kind, file_name in TABLE_FILES.items():
        if kind not in tables and (path / file_name).exists():
            raise DatasetError(f"{path / file_name}: the card does not list {kind!r} records (modified after writing?)")
    frames: dict[str, pd.DataFrame] = {}
    for kind, meta in tables.items():
        file = path / TABLE_FILES[kind]
        if not file.is_file():
            raise DatasetError(f"{path}: card lists {kind!r} records but {TABLE_FILES[kind]} is missing")
        df = _read_parquet(file)
        _check_table(file, df, meta)
        check = check_op_records if kind == "ops" else check_run_records
        result = check(df, resolve_gpu=resolve_gpu)
        if result.n_rejected:
            reasons = "; ".join(result.rejected[REASON_COLUMN].astype(str).head(3))
            raise DatasetError(f"{file}: {result.n_rejected} of {len(df)} records break the schema, e.g. {reasons}")
        frames[kind] = result.records
    rejected_file = path / REJECTED_FILE
    rejected_meta = card["rejected"]
    if rejected_file.exists():
        rejected = _read_parquet(rejected_file)
        _check_table(rejected_file, rejected, rejected_meta)
    elif rejected_meta["rows"]:
        raise DatasetError(f"{path}: card lists {rejected_meta['rows']} rejected rows but {REJECTED_FILE} is missing")
    else:
        rejected = pd.DataFrame()
    return Dataset(
        path=path,
        card=card,
        ops=frames.get("ops", pd.DataFrame()),
        runs=frames.get("runs", pd.DataFrame()),
        rejected=rejected,
    )


def list_datasets(root: str | Path) -> list[Path]:
    """Dataset folders (folders with a card) under ``root``, at any depth, sorted."""
    root = Path(root)
    if (root / CARD_FILE).is_file():
        return [root]
    return sorted(p.parent for p in root.rglob(CARD_FILE) if not p.parent.name.startswith("."))
