"""Saved predictors: a directory with a manifest and native model files, no pickles.

Layout::

    manifest.json      versions, FeatureSpec version, catalog and dataset hashes, metrics,
                       each model's class, files, hyperparameters and fitted scalars
    op_<class>.ubj     one booster per op class of the OpTimeRegressor (gemm, vector, ...)
    collective.ubj     the CollectiveTimeRegressor's booster (when one is saved)
    step_*             the step model (GBDT booster or GNN state dicts), when one is saved

A bundle with an op model predicts ops; with a step model too it predicts steps
(:meth:`OpPredictorBundle.step_predictor`): the step model corrects the steps composed
from the same bundle's op (and collective) models, the ones it was trained against.

A model takes part through one of two hooks:

* ``model._save_to(directory) -> dict`` (writes its files, returns JSON-able metadata) and
  the classmethod ``Model._load_from(directory, meta) -> model``;
* ``model.to_dict() -> dict`` / ``Model.from_dict(dict)`` plus a ``booster_`` attribute,
  which the bundle writes as ``collective.ubj`` (``op.ubj`` for an op model) and restores.

:func:`load_bundle` refuses a bundle written under another FeatureSpec version, a missing
file or a malformed manifest (:class:`~perfcast.errors.BundleError`); a changed hardware
catalog only logs a warning (predictions then use the current catalog figures).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast._version import perfcast_version
from perfcast.errors import BundleError, SpecError
from perfcast.features.op_features import FEATURE_SPEC_VERSION
from perfcast.features.ops import OpClass, op_classes, op_kinds
from perfcast.models.analytic import AnalyticOpPredictor

__all__ = ["MANIFEST_FILE", "OpPredictorBundle", "catalog_hash", "load_bundle", "save_bundle"]

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
BUNDLE_FORMAT = "perfcast-op-bundle"
BUNDLE_SCHEMA_VERSION = 1
_MODEL_SLOTS = ("op", "collective", "step")
_ALLOWED_MODULE_PREFIX = "perfcast.models."
_CATALOG_DIRS = (("catalog", "accelerators"), ("catalog", "fabrics"))


def catalog_hash() -> str:
    """SHA-256 over the hardware catalog (accelerators and fabrics), files in sorted order."""
    digest = hashlib.sha256()
    root = resources.files("perfcast.features")
    for parts in _CATALOG_DIRS:
        folder = root.joinpath(*parts)
        for res in sorted(folder.iterdir(), key=lambda r: r.name):
            if res.name.endswith(".json"):
                digest.update("/".join((*parts, res.name)).encode())
                digest.update(b"\0")
                digest.update(res.read_bytes())
                digest.update(b"\0")
    return digest.hexdigest()


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


@dataclass(frozen=True)
class OpPredictorBundle:
    """A loaded bundle: the op, collective and step models (any may be None) and the manifest."""

    path: Path
    manifest: dict[str, Any]
    op_model: Any = None
    collective_model: Any = None
    step_model: Any = None
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """How predictions name this predictor: ``bundle:<folder>``."""
        return f"bundle:{Path(self.path).name}" if self.path is not None else "bundle"

    def step_predictor(self) -> Any:
        """The bundle's step predictor: its op models composed, corrected by its step model if any."""
        from perfcast.models.step_predictor import StepPredictor

        name = self.name if self.step_model is not None else f"composed:{self.name}"
        return StepPredictor(self, self.collective_model, self.step_model, name=name)

    def out_of_domain(self, ops: pd.DataFrame) -> np.ndarray:
        """Boolean per row: a learned model predicts it outside its training range."""
        flags = np.zeros(len(ops), dtype=bool)
        if self.op_model is not None and len(ops):
            learned = np.isin(op_classes(op_kinds(ops)), sorted(set(self.op_model.boosters_)))
            if learned.any():
                flags[learned] = self.op_model.out_of_domain(ops.loc[learned])
        return flags

    def predict_ops(self, ops: pd.DataFrame, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Median time and ``coverage`` interval of every op-table row, ms: ``(pred, lo, hi)``.

        See :meth:`predict_ops_flagged`, which also returns :meth:`out_of_domain`.
        """
        return self.predict_ops_flagged(ops, coverage)[:3]

    def predict_ops_flagged(
        self, ops: pd.DataFrame, coverage: float = 0.9
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`predict_ops` and :meth:`out_of_domain` from one featurisation of the op
        model's rows: ``(pred, lo, hi, ood)``, ms and bool.

        Compute rows go to the op model, collective rows to the collective model. Rows of
        an op class the bundle learned nothing about (no attention data, no collective
        model) get the analytic estimate (roofline, alpha-beta) and no interval (NaN),
        logged (info) with their count; their empty interval shows it per row.

        Raises:
            SpecError: ``ops`` is not a DataFrame, or holds unknown ops.
        """
        if not isinstance(ops, pd.DataFrame):
            raise SpecError(f"ops must be a DataFrame, got {type(ops).__name__}")
        n = len(ops)
        pred, lo, hi = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        ood = np.zeros(n, dtype=bool)
        if n == 0:
            return pred, lo, hi, ood
        classes = op_classes(op_kinds(ops))
        learned = set(self.op_model.boosters_) if self.op_model is not None else set()
        by_op_model = np.isin(classes, sorted(learned - {OpClass.COLLECTIVE.value}))
        if by_op_model.any():
            rows = ops if by_op_model.all() else ops.loc[by_op_model]
            pred[by_op_model], interval, flags = self._op_model_flagged(rows, coverage)
            lo[by_op_model], hi[by_op_model] = interval[:, 0], interval[:, 1]
            ood[by_op_model] = flags
        comm = (classes == OpClass.COLLECTIVE.value) & (self.collective_model is not None)
        if comm.any():
            pred[comm], interval = self.collective_model.predict_with_interval(ops.loc[comm], coverage=coverage)
            lo[comm], hi[comm] = interval[:, 0], interval[:, 1]
        fallback = np.isnan(pred)
        if fallback.any():
            counts = pd.Series(classes[fallback]).value_counts().to_dict()
            logger.info("no learned model for %s rows: analytic estimate, no interval", counts)
            pred[fallback], _, _ = AnalyticOpPredictor().predict_ops(ops.loc[fallback], coverage=coverage)
        return pred, lo, hi, ood

    def _op_model_flagged(self, ops: pd.DataFrame, coverage: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The op model's ``(pred, (n, 2) interval, ood)``, from one featurisation when it offers one."""
        if hasattr(self.op_model, "predict_flagged"):
            return self.op_model.predict_flagged(ops, coverage=coverage)
        pred, interval = self.op_model.predict_with_interval(ops, coverage=coverage)
        return pred, interval, np.asarray(self.op_model.out_of_domain(ops), dtype=bool)


# ----------------------------------------------------------------------------- save


def save_bundle(
    path: str | Path,
    *,
    op_model: Any = None,
    collective_model: Any = None,
    step_model: Any = None,
    metrics: Mapping[str, Any] | None = None,
    datasets: Mapping[str, str] | None = None,
) -> Path:
    """Write fitted models to the directory ``path`` (replaced atomically if it exists).

    Args:
        path: the bundle directory.
        op_model: a fitted ``OpTimeRegressor`` (or any model with the hooks above).
        collective_model: a fitted ``CollectiveTimeRegressor``.
        step_model: a fitted step model (``StepTimeRegressor`` or ``StepGNNRegressor``)
            trained on steps composed with ``op_model`` and ``collective_model``.
        metrics: JSON-able evaluation metrics to record.
        datasets: dataset name -> content hash (``perfcast.data.dataset.content_hash``).

    Returns:
        ``path`` as a Path.

    Raises:
        BundleError: no model given, a model without save hooks, or metadata that is not
            JSON-able.
    """
    path = Path(path)
    models = {"op": op_model, "collective": collective_model, "step": step_model}
    if op_model is None and collective_model is None:
        raise BundleError("save_bundle needs op_model and/or collective_model; got neither")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        manifest: dict[str, Any] = {
            "format": BUNDLE_FORMAT,
            "schema_version": BUNDLE_SCHEMA_VERSION,
            "perfcast_version": perfcast_version(),
            "xgboost_version": _xgboost_version(),
            "feature_spec_version": FEATURE_SPEC_VERSION,
            "catalog_sha256": catalog_hash(),
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "datasets": dict(datasets or {}),
            "metrics": dict(metrics or {}),
            "models": {},
        }
        for slot, model in models.items():
            if model is not None:
                manifest["models"][slot] = _save_model(slot, model, tmp)
        try:
            text = json.dumps(manifest, indent=1, default=_json_default, allow_nan=True)
        except TypeError as exc:
            raise BundleError(f"bundle metadata is not JSON serialisable: {exc}") from None
        (tmp / MANIFEST_FILE).write_text(text, encoding="utf-8")
        _replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _xgboost_version() -> str | None:
    try:
        return metadata.version("xgboost")
    except metadata.PackageNotFoundError:
        try:
            return metadata.version("xgboost-cpu")
        except metadata.PackageNotFoundError:
            return None


def _save_model(slot: str, model: Any, directory: Path) -> dict[str, Any]:
    before = set(p.name for p in directory.iterdir())
    kls = type(model)
    entry: dict[str, Any] = {"class": f"{kls.__module__}.{kls.__qualname__}"}
    if hasattr(model, "_save_to"):
        entry["hook"] = "save_to"
        entry["meta"] = model._save_to(directory)
    elif hasattr(model, "to_dict") and hasattr(model, "booster_"):
        entry["hook"] = "to_dict"
        booster_file = f"{slot}.ubj"
        model.booster_.save_model(str(directory / booster_file))
        entry["booster_file"] = booster_file
        entry["meta"] = model.to_dict()
    else:
        raise BundleError(
            f"{slot} model {entry['class']} has neither _save_to(dir)/_load_from(dir, meta) "
            "nor to_dict()/from_dict() with booster_"
        )
    entry["files"] = sorted(set(p.name for p in directory.iterdir()) - before)
    return entry


def _replace_dir(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst``; an existing ``dst`` is swapped out, then removed."""
    if dst.exists():
        if dst.is_dir() and any(dst.iterdir()) and not (dst / MANIFEST_FILE).is_file():
            raise BundleError(f"{dst} exists and is not a bundle; refusing to replace it")
        old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
        dst.rename(old)
        src.rename(dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        src.rename(dst)


# ----------------------------------------------------------------------------- load


def load_bundle(path: str | Path) -> OpPredictorBundle:
    """Load a bundle written by :func:`save_bundle`.

    Raises:
        BundleError: missing directory, manifest or model file (named), malformed
            manifest, or a FeatureSpec version other than this perfcast's.
    """
    path = Path(path)
    manifest_path = path / MANIFEST_FILE
    if not path.is_dir():
        raise BundleError(f"bundle directory {path} does not exist")
    if not manifest_path.is_file():
        raise BundleError(f"bundle file {manifest_path} is missing")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BundleError(f"cannot read {manifest_path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{manifest_path} is not a perfcast op bundle manifest")
    version = manifest.get("feature_spec_version")
    if version != FEATURE_SPEC_VERSION:
        raise BundleError(
            f"bundle {path} was built with FeatureSpec version {version!r}; this perfcast uses "
            f"version {FEATURE_SPEC_VERSION}: retrain the bundle"
        )
    if manifest.get("catalog_sha256") != catalog_hash():
        logger.warning(
            "bundle %s was trained against another hardware catalog (sha256 %s); predictions use the current "
            "catalog figures",
            path,
            str(manifest.get("catalog_sha256"))[:12],
        )
    models_meta = manifest.get("models")
    if not isinstance(models_meta, dict) or not models_meta:
        raise BundleError(f"{manifest_path} lists no models")
    loaded: dict[str, Any] = {}
    for slot, entry in models_meta.items():
        if slot not in _MODEL_SLOTS:
            raise BundleError(f"{manifest_path}: unknown model slot {slot!r}; allowed: {', '.join(_MODEL_SLOTS)}")
        loaded[slot] = _load_model(path, slot, entry)
    return OpPredictorBundle(
        path=path,
        manifest=manifest,
        op_model=loaded.get("op"),
        collective_model=loaded.get("collective"),
        step_model=loaded.get("step"),
        metrics=dict(manifest.get("metrics") or {}),
    )


def _load_model(path: Path, slot: str, entry: Any) -> Any:
    if not isinstance(entry, dict) or "class" not in entry or "meta" not in entry:
        raise BundleError(f"{path / MANIFEST_FILE}: {slot} model entry is malformed")
    for name in entry.get("files", []):
        if not (path / name).is_file():
            raise BundleError(f"bundle file {path / name} is missing ({slot} model)")
    kls = _import_class(entry["class"])
    hook = entry.get("hook")
    if hook == "save_to" and hasattr(kls, "_load_from"):
        return kls._load_from(path, entry["meta"])
    if hook == "to_dict" and hasattr(kls, "from_dict"):
        import xgboost as xgb

        model = kls.from_dict(entry["meta"])
        booster = xgb.Booster()
        booster.load_model(str(path / entry["booster_file"]))
        model.booster_ = booster
        return model
    raise BundleError(f"{slot} model {entry['class']} cannot be loaded with hook {hook!r}")


def _import_class(dotted: str) -> type:
    """A model class named in a manifest; only classes under ``perfcast.models`` are allowed."""
    module_name, _, name = str(dotted).rpartition(".")
    if not module_name.startswith(_ALLOWED_MODULE_PREFIX):
        raise BundleError(f"model class {dotted!r} is not a perfcast.models class")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise BundleError(f"model class {dotted!r} cannot be imported: {exc}") from None
