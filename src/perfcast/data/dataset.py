"""Datasets on disk: a folder of Parquet record tables and a card that describes them.

Layout of a dataset folder::

    card.json          what it is: source, how it was measured, counts, hashes, hardware
    ops.parquet        op records (if any)       -- see perfcast.data.schema
    runs.parquet       run records (if any)
    rejected.parquet   source rows that were not accepted, with their reasons (if any)

A dataset is written atomically: everything goes to a temporary sibling folder that is
renamed into place, so a reader never sees half a dataset and a failed write leaves the
previous version untouched. Loading checks the card, the files, the content hashes and
every record against the schema; any failure is a :class:`~perfcast.errors.DatasetError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from perfcast._version import perfcast_version
from perfcast.data.records import REASON_COLUMN
from perfcast.data.validate import GpuResolver, check_op_records, check_run_records
from perfcast.errors import DatasetError

logger = logging.getLogger(__name__)

CARD_FILE = "card.json"
TABLE_FILES = {"ops": "ops.parquet", "runs": "runs.parquet"}
REJECTED_FILE = "rejected.parquet"
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
    for col in ("gpu", "dtype", "op", "timing_scope"):
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
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "perfcast_version": perfcast_version(),
        "tables": {kind: _summary(df) for kind, df in tables.items()},
        "rejected": {"rows": len(rejected), "by_reason": _reason_counts(rejected)},
        "extra": extra or {},
    }


def _to_parquet(df: pd.DataFrame, path: Path) -> None:
    clean = df.copy()
    for col in clean.columns:  # mixed-type object columns (as read from CSV) become strings
        if clean[col].dtype == object:
            clean[col] = clean[col].map(lambda v: v if v is None or isinstance(v, str) else str(v))
    clean.to_parquet(path, index=False)


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
) -> Path:
    """Write a dataset folder atomically (see the module docstring); returns its path.

    Records are written as given: validate them first with
    :func:`~perfcast.data.validate.check_op_records` / ``check_run_records``.

    Raises:
        DatasetError: nothing to write, or the write failed (the old dataset, if any, is kept).
    """
    path = Path(path)
    tables = {k: v for k, v in (("ops", ops), ("runs", runs)) if v is not None and len(v)}
    if not tables and (rejected is None or rejected.empty):
        raise DatasetError(f"nothing to write to {path}: no records and no rejected rows")
    card = build_card(name or path.name, source=source, how_measured=how_measured, tables=tables,
                      rejected=rejected, extra=extra)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    backup = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        for kind, df in tables.items():
            _to_parquet(df, tmp / TABLE_FILES[kind])
        if rejected is not None and not rejected.empty:
            _to_parquet(rejected, tmp / REJECTED_FILE)
        (tmp / CARD_FILE).write_text(json.dumps(card, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, backup)
        os.rename(tmp, path)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if backup.exists() and not path.exists():
            os.rename(backup, path)
        raise DatasetError(f"cannot write dataset {path}: {exc}") from exc
    shutil.rmtree(backup, ignore_errors=True)
    logger.info("wrote dataset %s (%s)", path, ", ".join(f"{k}: {len(v)} rows" for k, v in tables.items()))
    return path


def read_card(path: str | Path) -> dict[str, Any]:
    """The card of the dataset folder ``path``."""
    card_path = Path(path) / CARD_FILE
    if not card_path.is_file():
        raise DatasetError(f"{path} is not a dataset: no {CARD_FILE}")
    try:
        card = json.loads(card_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{card_path}: unreadable card: {exc}") from None
    if not isinstance(card, dict) or card.get("schema_version") != CARD_SCHEMA_VERSION:
        raise DatasetError(f"{card_path}: schema_version must be {CARD_SCHEMA_VERSION}")
    return card


def load_dataset(path: str | Path, *, resolve_gpu: GpuResolver | None = None) -> Dataset:
    """Load and check a dataset folder.

    Raises:
        DatasetError: a missing card or table, content that no longer matches the card's
            hash, or any record that breaks the schema (with the first reasons).
    """
    path = Path(path)
    card = read_card(path)
    frames: dict[str, pd.DataFrame] = {}
    for kind, meta in card.get("tables", {}).items():
        file = path / TABLE_FILES.get(kind, "")
        if kind not in TABLE_FILES or not file.is_file():
            raise DatasetError(f"{path}: card lists {kind!r} records but {TABLE_FILES.get(kind, kind)} is missing")
        try:
            df = pd.read_parquet(file)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise DatasetError(f"{file}: unreadable: {exc}") from None
        if content_hash(df) != meta.get("content_hash"):
            raise DatasetError(f"{file}: content does not match the card's hash (modified after writing?)")
        check = check_op_records if kind == "ops" else check_run_records
        result = check(df, resolve_gpu=resolve_gpu)
        if result.n_rejected:
            reasons = "; ".join(result.rejected[REASON_COLUMN].astype(str).head(3))
            raise DatasetError(f"{file}: {result.n_rejected} of {len(df)} records break the schema, e.g. {reasons}")
        frames[kind] = result.records
    rejected_file = path / REJECTED_FILE
    rejected = pd.read_parquet(rejected_file) if rejected_file.is_file() else pd.DataFrame()
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
