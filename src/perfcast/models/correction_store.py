"""Stored corrections: their keys, their files, and the screening of measurements they are fitted on.

Shared by the op corrections (:mod:`perfcast.models.calibration`) and the step corrections
(:mod:`perfcast.models.step_calibration`):

* :func:`predictor_identity`, the key a correction is fitted for, and :func:`applicable`,
  which keeps the corrections of one predictor (logging each other one once);
* :func:`screen_measurements`, the plausibility and outlier screen of measured times;
* the JSON store: one file per (GPU or cluster, predictor) (:func:`store_stem`), written
  atomically (:func:`save_stored`), read back with every field checked (:func:`stored_fields`,
  :class:`FieldCheck`: a bad field is a :class:`~perfcast.errors.BundleError` naming the
  file, the field and what is allowed) and kept for one predictor (:func:`load_stored`);
* :data:`CALIBRATION_COLUMN`, the output column naming the correction applied to a row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import pandas as pd

from perfcast.errors import BundleError, SpecError

T = TypeVar("T")
logger = logging.getLogger(__name__)

CALIBRATION_COLUMN = "calibration"
"""Output column naming the stored correction applied to a row ("" where none applied)."""
OUTLIER_LOG_RATIO = math.log(3.0)
"""A measured row whose log ratio lies further than this from its group's median is an outlier."""
OUTLIER_MADS = 3.0
"""... or further than this many robust deviations (1.4826 MAD) when the group is wider."""
MIN_ROWS_FOR_OUTLIERS = 3
"""Fewer measured rows of a group cannot tell an outlier from the rest: none is left out."""


def screen_measurements(
    measured_ms: np.ndarray,
    predicted_ms: np.ndarray,
    labels: Sequence[str] | None = None,
    *,
    max_ratio: float,
    field_name: str = "measured_ms",
    groups: np.ndarray | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Which measured rows a correction may be fitted on, and why each other row is left out.

    A row is refused when its measured time is not a positive finite number, its
    prediction is not, or ``measured / predicted`` lies outside ``[1/max_ratio, max_ratio]``.
    Among the rows left in each group (``groups``: one label per row; None is one group) of
    at least :data:`MIN_ROWS_FOR_OUTLIERS` rows, a row is an outlier when
    ``|log ratio - median| > max(OUTLIER_LOG_RATIO, OUTLIER_MADS * 1.4826 * MAD)``.

    Returns:
        A boolean mask of the rows to fit on, and one reason per row left out, naming the
        row (``labels``, default ``row <position>``) and its value.
    """
    measured = np.asarray(measured_ms, dtype=float)
    predicted = np.asarray(predicted_ms, dtype=float)
    names = list(labels) if labels is not None else [f"row {i}" for i in range(len(measured))]
    keep = np.ones(len(measured), dtype=bool)
    reasons: list[str] = []
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = measured / predicted
    for i in range(len(measured)):
        m, p = measured[i], predicted[i]
        if not (np.isfinite(m) and m > 0):
            reason = f"{field_name}={m:g} is not a positive finite time"
        elif not (np.isfinite(p) and p > 0):
            reason = f"the predicted time {p:g} ms is not a positive finite time"
        elif not 1.0 / max_ratio <= ratio[i] <= max_ratio:
            reason = (
                f"{field_name}={m:g} is {ratio[i]:.3g}x the predicted {p:.4g} ms; "
                f"allowed 1/{max_ratio:g}..{max_ratio:g}x: not a plausible measurement of this config"
            )
        else:
            continue
        keep[i] = False
        reasons.append(f"{names[i]}: {reason}")
    log_ratio = np.log(np.where(keep, ratio, 1.0))
    group_of = np.asarray(groups, dtype=object) if groups is not None else np.zeros(len(measured), dtype=object)
    for group in pd.unique(group_of[keep]):
        rows = np.flatnonzero(keep & (group_of == group))
        if len(rows) < MIN_ROWS_FOR_OUTLIERS:
            continue
        r = log_ratio[rows]
        centre = float(np.median(r))
        limit = max(OUTLIER_LOG_RATIO, OUTLIER_MADS * 1.4826 * float(np.median(np.abs(r - centre))))
        for i in rows[np.abs(r - centre) > limit]:
            keep[i] = False
            reasons.append(
                f"{names[i]}: outlier, {field_name}={measured[i]:g} is {ratio[i]:.3g}x the predicted time "
                f"while the median of its {len(rows)} rows is {np.exp(centre):.3g}x (allowed within "
                f"{np.exp(limit):.3g}x of it)"
            )
    return keep, reasons


def summarize_reasons(reasons: Sequence[str], shown: int = 5) -> str:
    """The first ``shown`` reasons joined, with a count of the rest."""
    more = f"; and {len(reasons) - shown} more" if len(reasons) > shown else ""
    return "; ".join(reasons[:shown]) + more


def predictor_identity(predictor: Any) -> str:
    """The key a stored correction is fitted for: ``<name>`` or ``<name>@<hash>``.

    ``<name>`` is the predictor's ``name``; ``<hash>`` the first 12 hex digits of the
    SHA-256 of its bundle manifest as canonical JSON, for a bundle or a step predictor over
    a bundle (the analytic predictor has none). A calibrated wrapper has its base's identity.
    """
    own = getattr(predictor, "identity", None)
    if isinstance(own, str):
        return own
    name = str(getattr(predictor, "name", type(predictor).__name__))
    manifest = getattr(predictor, "manifest", None)
    if manifest is None:
        manifest = getattr(getattr(predictor, "op_predictor", None), "manifest", None)
    if not isinstance(manifest, Mapping):
        return name
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), default=str)
    return f"{name}@{hashlib.sha256(text.encode()).hexdigest()[:12]}"


_LOGGED: set[str] = set()


def log_once(level: int, message: str) -> None:
    """Log ``message`` at ``level`` the first time this process sees it (predictions reload corrections)."""
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.log(level, message)


def applicable(corrections: Mapping[str, T], identity: str, where: str, what: str) -> dict[str, T]:
    """The corrections of ``corrections`` (key -> correction) fitted for the predictor ``identity``.

    Each other one is logged once: a file written before corrections carried a predictor
    key at warning level (it is never applied), one fitted for another predictor at info.
    """
    kept: dict[str, T] = {}
    for key, corr in corrections.items():
        fitted_for = str(getattr(corr, "predictor", ""))
        if fitted_for == identity:
            kept[key] = corr
        elif not fitted_for:
            log_once(
                logging.WARNING,
                f"{what} correction {key} in {where} names no predictor (written by an older perfcast, "
                f"for model {getattr(corr, 'model', '') or '?'!r}): not applied; re-run the calibration "
                "for the predictor you use and delete the old file",
            )
        else:
            log_once(
                logging.INFO,
                f"{what} correction {key} in {where} was fitted for {fitted_for}, not {identity}: not applied",
            )
    return kept


def write_json_atomic(text: str, directory: str | Path, stem: str) -> Path:
    """Write ``<directory>/<stem>.json`` through a temporary file of this process (replacing an
    older one; concurrent writers never share a temporary file, and the last rename wins)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}.json"
    tmp = directory / f".{stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_json_files(directory: str | Path, parse: Callable[[str, str], T]) -> list[T]:
    """``parse(text, path)`` of every ``*.json`` in ``directory``, by name (none when it does not exist).

    Raises:
        BundleError: a file that cannot be read as UTF-8 text (named).
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BundleError(f"{path}: cannot read the stored correction: {exc}") from None
        out.append(parse(text, str(path)))
    return out


_SAFE = str.maketrans({c: "_" for c in '/\\:* ?"<>|'})


def store_stem(key: str, predictor: str) -> str:
    """File stem of the correction of ``key`` (a GPU or cluster) fitted for ``predictor``:
    ``<key>--<predictor>`` with characters unsafe in file names replaced by ``_``."""
    return f"{key}--{predictor}".translate(_SAFE)


def corrections_for(
    parsed: Sequence[tuple[str, T]], key: Callable[[T], str], predictor: str, where: str, what: str
) -> dict[str, T]:
    """``parsed`` (path, correction) pairs fitted for ``predictor``, keyed by ``key``.

    Raises:
        BundleError: two files hold a correction of one key for ``predictor``.
    """
    out: dict[str, T] = {}
    paths: dict[str, str] = {}
    for path, corr in parsed:
        if not applicable({key(corr): corr}, predictor, path, what):
            continue
        k = key(corr)
        if k in out:
            raise BundleError(f"{paths[k]} and {path} both hold the {what} correction of {k} for {predictor}: keep one")
        out[k], paths[k] = corr, path
    return out


def stored_json(schema_version: int, fields: Mapping[str, Any]) -> str:
    """JSON text of a stored correction: ``schema_version`` then ``fields``, indented, with a
    final newline; NaN and infinity are refused (ValueError)."""
    return json.dumps({"schema_version": schema_version, **fields}, indent=2, allow_nan=False) + "\n"


def save_stored(text: str, directory: str | Path, key: str, predictor: str, what: str) -> Path:
    """Write the correction ``text`` of ``key`` (a GPU or cluster) fitted for ``predictor`` to
    ``<directory>/<key>--<predictor>.json`` (:func:`store_stem`, :func:`write_json_atomic`).

    Raises:
        SpecError: ``predictor`` is empty (the correction would never be applied); ``what``
            names the correction in the message (``"step correction"``).
    """
    if not predictor:
        raise SpecError(f"the {what} of {key} names no predictor; fit it with predictor=...")
    return write_json_atomic(text, directory, store_stem(key, predictor))


def load_stored(
    directory: str | Path, parse: Callable[..., T], key: Callable[[T], str], predictor: str, what: str
) -> dict[str, T]:
    """The corrections in ``directory`` (``parse(text, where=path)`` of each file) fitted for
    ``predictor``, keyed by ``key``; none when the folder does not exist. Those of other
    predictors are logged once (:func:`applicable`, ``what`` naming their kind: ``"op"``).

    Raises:
        BundleError: a file ``parse`` refuses, or two for one key and predictor.
    """
    parsed = read_json_files(directory, lambda text, where: (where, parse(text, where=where)))
    return corrections_for(parsed, key, predictor, str(directory), what)


def stored_fields(
    text: str,
    where: str,
    *,
    kind: str,
    versions: Sequence[int],
    allowed: Iterable[str],
    required: Sequence[str],
) -> dict[str, Any]:
    """The fields of a stored correction: the JSON object in ``text`` less its ``schema_version``.

    Args:
        where: the file, named in every error.
        kind: what the file should hold, for the error (``"GPU correction"``).
        versions: the readable schema versions.
        allowed, required: the fields the object may hold and those it must hold.

    Raises:
        BundleError: invalid JSON, not an object, a schema version outside ``versions``, a
            field outside ``allowed`` or a missing ``required`` one.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BundleError(f"{where}: invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BundleError(f"{where}: not a JSON object but {type(data).__name__}")
    if data.pop("schema_version", None) not in versions:
        raise BundleError(f"{where}: not a perfcast {kind} (schema_version one of {', '.join(map(str, versions))})")
    known = set(allowed)
    unknown = sorted(set(data) - known)
    if unknown:
        raise BundleError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    for name in required:
        if name not in data:
            raise BundleError(f"{where}: field {name!r} is missing")
    return data


@dataclass(frozen=True)
class StoreFormat:
    """The file format of one kind of stored correction."""

    kind: str
    """What a file holds, for messages (``"GPU correction"``)."""
    key: str
    """The field naming what the correction applies to (``"gpu"``, ``"cluster"``)."""
    version: int
    """The schema version written."""
    readable: tuple[int, ...]
    """The schema versions read."""
    required: tuple[str, ...]
    """The fields a file must hold."""


class StoredCorrection:
    """What the stored corrections share (:class:`~perfcast.models.calibration.GpuCorrection`,
    :class:`~perfcast.models.step_calibration.ClusterCorrection`): a frozen dataclass with
    its key field, ``model``, ``created_utc``, ``predictor`` and ``excluded``, written as
    JSON in its :data:`STORE` format."""

    STORE: ClassVar[StoreFormat]
    created_utc: str

    @property
    def label(self) -> str:
        """How output rows name this correction: ``<key>@<created_utc>`` (``<key>`` when undated)."""
        key, created = getattr(self, self.STORE.key), self.created_utc
        return f"{key}@{created}" if created else key

    def to_json(self) -> str:
        """JSON text of the correction (``schema_version`` ``STORE.version``)."""
        return stored_json(self.STORE.version, asdict(self))

    @classmethod
    def checked_fields(cls, text: str, where: str) -> tuple[dict[str, Any], FieldCheck]:
        """The fields of a stored file (:func:`stored_fields`) with the key (a non-empty string)
        and the provenance fields (:meth:`FieldCheck.provenance`) checked, and the checker
        for the rest.

        Raises:
            BundleError: as :func:`stored_fields`, or a bad key or provenance field.
        """
        data = stored_fields(
            text,
            where,
            kind=cls.STORE.kind,
            versions=cls.STORE.readable,
            allowed=cls.__dataclass_fields__,
            required=cls.STORE.required,
        )
        check = FieldCheck(where)
        check.text(data[cls.STORE.key], cls.STORE.key, nonempty=True)
        check.provenance(data)
        return data, check


class FieldCheck:
    """Checks of the fields of a stored correction; each failure is a BundleError naming
    the file (``where``), the field, the value and what is allowed."""

    def __init__(self, where: str) -> None:
        self.where = where

    def provenance(self, data: Mapping[str, Any]) -> None:
        """Check the fields every stored correction may carry: ``model``, ``created_utc`` and
        ``predictor`` (strings) and ``excluded`` (a list of strings)."""
        for name in ("model", "created_utc", "predictor"):
            self.text(data.get(name, ""), name)
        for i, reason in enumerate(self.sequence(data.get("excluded", []), "excluded")):
            self.text(reason, f"excluded[{i}]")

    def fail(self, name: str, value: Any, allowed: str) -> BundleError:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return BundleError(f"{self.where}: field {name!r} = {shown}; allowed: {allowed}")

    def text(self, value: Any, name: str, *, nonempty: bool = False) -> str:
        if not isinstance(value, str) or (nonempty and not value):
            raise self.fail(name, value, "a non-empty string" if nonempty else "a string")
        return value

    def number(self, value: Any, name: str, *, lo: float = -math.inf, hi: float = math.inf) -> float:
        finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not finite or not lo <= value <= hi:
            raise self.fail(name, value, f"a finite number in [{lo:.4g}, {hi:.4g}]")
        return float(value)

    def count(self, value: Any, name: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise self.fail(name, value, "a whole number >= 1")
        return value

    def mapping(self, value: Any, name: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(name, value, "an object")
        return value

    def sequence(self, value: Any, name: str, *, length: int | None = None) -> list[Any]:
        if not isinstance(value, list) or (length is not None and len(value) != length):
            raise self.fail(name, value, "a list" if length is None else f"a list of {length} items")
        return value

    def numbers(self, value: Any, name: str, *, nonempty: bool = False, length: int | None = None) -> list[float]:
        items = self.sequence(value, name, length=length)
        if nonempty and not items:
            raise self.fail(name, value, "a non-empty list of finite numbers")
        return [self.number(v, f"{name}[{i}]") for i, v in enumerate(items)]
