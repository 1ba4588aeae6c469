"""Saved predictors: a directory with a manifest and native model files, no pickles.

Layout::

    manifest.json      versions, FeatureSpec version, catalog and dataset hashes, metrics,
                       each model's class, files, hyperparameters and fitted scalars
    op_<class>.ubj     one booster per op class of the OpTimeRegressor (gemm, vector, ...)
    collective.ubj     the CollectiveTimeRegressor's booster (when one is saved)
    step_*             the step model (GBDT booster or GNN state dicts), when one is saved

A bundle with an op model predicts ops; with a step model too it predicts steps
(:meth:`PredictorBundle.step_predictor`): the step model corrects the steps composed
from the same bundle's op (and collective) models, the ones it was trained against.

A model takes part through one of two hooks:

* ``model._save_to(directory) -> dict`` (writes its files, returns JSON-able metadata) and
  the classmethod ``Model._load_from(directory, meta) -> model``;
* ``model.to_dict() -> dict`` / ``Model.from_dict(dict)`` plus a ``booster_`` attribute,
  which the bundle writes as ``collective.ubj`` (``op.ubj`` for an op model) and restores.

The manifest records the SHA-256 of every file of the bundle (``file_sha256``, written by
:func:`save_bundle`). :func:`load_bundle` verifies them before any model file is parsed,
so a damaged, truncated or replaced booster is refused by name instead of reaching
XGBoost's parser. It refuses, with a :class:`~perfcast.errors.BundleError` naming the
file or manifest field, a bundle without checksums (written before they existed), a
missing or changed file, a model entry naming a file the checksums do not cover, a
manifest of the wrong shape, and a FeatureSpec version other than this perfcast's; a
changed hardware catalog only logs a warning (predictions then use the current catalog
figures).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast._version import perfcast_version
from perfcast.data.tables import sweep_stale_temps, temp_path, terminate_as_exit
from perfcast.errors import BundleError, PerfcastError, SpecError
from perfcast.features.op_features import FEATURE_SPEC_VERSION
from perfcast.features.ops import OpClass, op_classes, op_kinds
from perfcast.models.analytic import AnalyticOpPredictor
from perfcast.models.predictor_protocol import OpPrediction

__all__ = ["MANIFEST_FILE", "PredictorBundle", "catalog_hash", "load_bundle", "save_bundle"]

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
BUNDLE_FORMAT = "perfcast-op-bundle"
BUNDLE_SCHEMA_VERSION = 2
"""Schema 2 added ``file_sha256``; schema 1 bundles (no checksums) are refused."""
FILE_HASHES = "file_sha256"
"""Manifest key: file name -> SHA-256 hex digest of every file of the bundle but the manifest."""
_MODEL_SLOTS = ("op", "collective", "step")
_HOOKS = ("save_to", "to_dict")
_SLOT_METHODS = {
    "op": ("predict_flagged", "out_of_domain"),
    "collective": ("predict_with_interval",),
    "step": ("predict", "predict_interval"),
}
"""What the bundle calls on the model of each slot; a loaded model lacking one is refused."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
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
class PredictorBundle:
    """A loaded bundle: the op, collective and step models (any may be None) and the manifest.

    An :class:`~perfcast.models.predictor_protocol.OpPredictor`: intervals on the rows of a
    learned class, out-of-domain flags on the op model's rows.
    """

    has_interval = True
    flags_out_of_domain = True

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
        """Median time and ``coverage`` interval of every op-table row, ms: ``(pred, lo, hi)``,
        the times of :meth:`predict_ops_flagged`."""
        return self.predict_ops_flagged(ops, coverage=coverage)[:3]

    def predict_ops_flagged(self, ops: pd.DataFrame, *, coverage: float = 0.9) -> OpPrediction:
        """Median time and ``coverage`` interval (ms) and :meth:`out_of_domain` flag of every
        op-table row, from one featurisation of the op model's rows.

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
            return OpPrediction(pred, lo, hi, ood)
        classes = op_classes(op_kinds(ops))
        learned = set(self.op_model.boosters_) if self.op_model is not None else set()
        by_op_model = np.isin(classes, sorted(learned - {OpClass.COLLECTIVE.value}))
        if by_op_model.any():
            rows = ops if by_op_model.all() else ops.loc[by_op_model]
            pred[by_op_model], interval, flags = self.op_model.predict_flagged(rows, coverage=coverage)
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
        return OpPrediction(pred, lo, hi, ood)


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
    sweep_stale_temps(path.parent)
    tmp = temp_path(path)
    tmp.mkdir()
    try:
        manifest: dict[str, Any] = {
            "format": BUNDLE_FORMAT,
            "schema_version": BUNDLE_SCHEMA_VERSION,
            "perfcast_version": perfcast_version(),
            "xgboost_version": _xgboost_version(),
            "feature_spec_version": FEATURE_SPEC_VERSION,
            "catalog_sha256": catalog_hash(),
            "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "datasets": dict(datasets or {}),
            "metrics": dict(metrics or {}),
            "models": {},
        }
        with terminate_as_exit():
            for slot, model in models.items():
                if model is not None:
                    manifest["models"][slot] = _save_model(slot, model, tmp)
            manifest[FILE_HASHES] = file_hashes(tmp)
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


def file_hashes(directory: str | Path) -> dict[str, str]:
    """SHA-256 of every file of a bundle directory but the manifest, by file name (sorted).

    Raises:
        BundleError: the directory holds a sub-folder (a bundle is flat).
    """
    directory = Path(directory)
    out: dict[str, str] = {}
    for file in sorted(directory.iterdir(), key=lambda p: p.name):
        if file.name == MANIFEST_FILE:
            continue
        if not file.is_file():
            raise BundleError(f"bundle {directory} holds {file.name}, which is not a file; a bundle is flat")
        out[file.name] = _sha256(file)
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    """Move ``src`` to ``dst``; an existing ``dst`` (an empty folder or a bundle) is swapped out, then removed."""
    if dst.exists() or dst.is_symlink():
        if dst.is_symlink() or not dst.is_dir():
            raise BundleError(f"{dst} exists and is not a folder; refusing to replace it")
        if any(dst.iterdir()) and not (dst / MANIFEST_FILE).is_file():
            raise BundleError(f"{dst} exists and is not a bundle; refusing to replace it")
        old = temp_path(dst, kind="old")
        dst.rename(old)
        src.rename(dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        src.rename(dst)


# ----------------------------------------------------------------------------- load


def load_bundle(path: str | Path) -> PredictorBundle:
    """Load a bundle written by :func:`save_bundle`, its files verified before any is parsed.

    Raises:
        BundleError: missing directory or manifest, a malformed manifest (the field named),
            a bundle without file checksums (written by an older perfcast: retrain it), a
            missing, empty or changed file (named), a FeatureSpec version other than this
            perfcast's, or a model that cannot be rebuilt from its files.
    """
    path = Path(path)
    manifest_path = path / MANIFEST_FILE
    if not path.is_dir():
        raise BundleError(f"bundle directory {path} does not exist")
    if not manifest_path.is_file():
        raise BundleError(f"bundle file {manifest_path} is missing")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BundleError(f"cannot read {manifest_path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{manifest_path} is not a perfcast op bundle manifest")
    hashes = _verify_files(path, manifest)
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
    metrics = manifest.get("metrics")
    if metrics is not None and not isinstance(metrics, dict):
        raise BundleError(f"{manifest_path}: metrics must be an object, got {type(metrics).__name__}")
    models_meta = manifest.get("models")
    if not isinstance(models_meta, dict) or not models_meta:
        raise BundleError(f"{manifest_path} lists no models (models must be an object of slot -> model entry)")
    loaded: dict[str, Any] = {}
    for slot, entry in models_meta.items():
        if slot not in _MODEL_SLOTS:
            raise BundleError(f"{manifest_path}: unknown model slot {slot!r}; allowed: {', '.join(_MODEL_SLOTS)}")
        _check_entry(manifest_path, slot, entry, hashes)
        loaded[slot] = _load_model(path, slot, entry)
    if "op" not in loaded and "collective" not in loaded:
        raise BundleError(f"{manifest_path}: models has no op or collective model (found: {', '.join(loaded)})")
    bundle = PredictorBundle(
        path=path,
        manifest=manifest,
        op_model=loaded.get("op"),
        collective_model=loaded.get("collective"),
        step_model=loaded.get("step"),
        metrics=dict(metrics or {}),
    )
    _probe(bundle)
    return bundle


_PROBE_GPU = "h100-sxm5-80gb"
_PROBE_OPS = (
    {"op": "matmul", "batch": 1, "m": 1024, "n": 1024, "k": 1024},
    {"op": "layernorm", "rows": 4096, "cols": 1024},
    {"op": "attention", "batch": 1, "heads": 16, "kv_heads": 16, "seq_q": 1024, "seq_kv": 1024, "head_dim": 64,
     "causal": True},
    {"op": "allreduce", "bytes": 1 << 24, "n_ranks": 8, "ranks_per_node": 8},
)  # fmt: skip
_PROBE_RUN = {"model": "gpt3-125m", "gpu": _PROBE_GPU, "dp": 2, "micro_batch": 2, "global_batch": 8}
_PROBE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError, ZeroDivisionError)


def _probe(bundle: PredictorBundle) -> None:
    """Predict one op of each class (and one step when there is a step model) with the loaded models.

    A manifest whose fields are individually well-formed can still disagree with itself
    (an op class with a booster but no launch time, an interval for a class it lacks);
    this surfaces that at load, as a BundleError, rather than as a crash on the first query.
    """
    ops = pd.DataFrame([{**row, "dtype": "bf16", "gpu": _PROBE_GPU} for row in _PROBE_OPS])
    what = "an op of each class"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pred, lo, hi, _ = bundle.predict_ops_flagged(ops)
            if bundle.step_model is not None:
                from perfcast.features.run_config import parse_run_row

                what = "a training step"
                steps = bundle.step_predictor().predict_configs([parse_run_row(_PROBE_RUN)])
                pred = np.append(pred, steps["step_ms"].to_numpy(dtype=float))
    except (PerfcastError, *_PROBE_ERRORS) as exc:
        raise BundleError(
            f"bundle {bundle.path}: its models fail to predict {what} (a manifest field missing or malformed?): "
            f"{exc!r:.300}"
        ) from None
    if not (np.isfinite(pred) & (pred > 0)).all():
        raise BundleError(
            f"bundle {bundle.path}: its models predict non-positive or non-finite times ({pred.tolist()} ms for "
            f"{what}); a manifest field is malformed"
        )


def _verify_files(path: Path, manifest: dict[str, Any]) -> dict[str, str]:
    """Check every file the manifest's checksums list: present, non-empty, same SHA-256. Returns them."""
    manifest_path = path / MANIFEST_FILE
    schema = manifest.get("schema_version")
    hashes = manifest.get(FILE_HASHES)
    if hashes is None and schema in (None, 1):
        raise BundleError(
            f"bundle {path} has no file checksums (bundle schema {schema}, written by an older perfcast), so its "
            f"files cannot be verified before loading: retrain it (perfcast train ops|steps) to save it anew"
        )
    if schema != BUNDLE_SCHEMA_VERSION:
        raise BundleError(
            f"{manifest_path}: schema_version={schema!r}; this perfcast reads bundle schema {BUNDLE_SCHEMA_VERSION}"
        )
    if not isinstance(hashes, dict) or not hashes:
        raise BundleError(
            f"{manifest_path}: {FILE_HASHES} must be a non-empty object of file name -> sha256, got {hashes!r:.80}"
        )
    for name, digest in hashes.items():
        _check_file_name(manifest_path, f"{FILE_HASHES} key", name)
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise BundleError(
                f"{manifest_path}: {FILE_HASHES}[{name!r}]={digest!r:.80} is not a sha256 hex digest (64 of 0-9a-f)"
            )
        file = path / name
        if not file.is_file():
            raise BundleError(f"bundle file {file} is missing")
        if file.stat().st_size == 0:
            raise BundleError(f"bundle file {file} is empty")
        try:
            actual = _sha256(file)
        except OSError as exc:
            raise BundleError(f"bundle file {file} cannot be read: {exc}") from None
        if actual != digest:
            raise BundleError(
                f"bundle file {file} is damaged or was changed after saving: its sha256 {actual[:16]}... differs "
                f"from the manifest's {digest[:16]}...; restore the file or retrain the bundle"
            )
    return hashes


def _check_file_name(manifest_path: Path, where: str, name: Any) -> None:
    """A file of the bundle is named by a plain file name: no folders, no ``..``, not the manifest."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..", MANIFEST_FILE)
        or "/" in name
        or "\\" in name
        or os.sep in name
        or "\0" in name
    ):
        raise BundleError(f"{manifest_path}: {where} {name!r:.80} is not a plain file name of the bundle")


def _file_refs(meta: Any) -> Iterator[tuple[str, Any]]:
    """(key, name) of every file a model's metadata names: values of ``files``, ``*_file`` and ``*_files``."""
    if not isinstance(meta, dict):
        return
    for key, value in meta.items():
        if not isinstance(key, str) or not (key == "files" or key.endswith(("_file", "_files"))):
            continue
        if isinstance(value, dict):
            yield from ((f"{key}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            yield from ((f"{key}[{i}]", v) for i, v in enumerate(value))
        else:
            yield key, value


def _check_entry(manifest_path: Path, slot: str, entry: Any, hashes: dict[str, str]) -> None:
    """A model entry's shape, and every file it names covered by the verified checksums."""
    where = f"{manifest_path}: models.{slot}"
    if not isinstance(entry, dict):
        raise BundleError(f"{where} must be an object, got {type(entry).__name__}")
    for key in ("class", "hook"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise BundleError(f"{where}.{key} must be a non-empty string, got {entry.get(key)!r:.80}")
    if entry["hook"] not in _HOOKS:
        raise BundleError(f"{where}.hook={entry['hook']!r:.80}; allowed: {', '.join(_HOOKS)}")
    if not isinstance(entry.get("meta"), dict):
        raise BundleError(f"{where}.meta must be an object, got {type(entry.get('meta')).__name__}")
    files = entry.get("files")
    if not isinstance(files, list) or not files:
        raise BundleError(f"{where}.files must be a non-empty list of the model's file names, got {files!r:.80}")
    refs = [(f"files[{i}]", name) for i, name in enumerate(files)] + [
        (f"meta.{key}", name) for key, name in _file_refs(entry["meta"])
    ]
    if entry["hook"] == "to_dict":
        refs.append(("booster_file", entry.get("booster_file")))
    for key, name in refs:
        _check_file_name(manifest_path, f"models.{slot}.{key}", name)
        if name not in hashes:
            raise BundleError(f"{where}.{key} names {name!r}, which {FILE_HASHES} does not cover")


def _load_model(path: Path, slot: str, entry: dict[str, Any]) -> Any:
    """Rebuild one model from its (already verified) files; any failure is a BundleError naming the slot."""
    kls = _import_class(entry["class"])
    hook = entry["hook"]
    files = ", ".join(entry["files"])
    try:
        if hook == "save_to" and hasattr(kls, "_load_from"):
            model = kls._load_from(path, entry["meta"])
        elif hook == "to_dict" and hasattr(kls, "from_dict"):
            import xgboost as xgb

            model = kls.from_dict(entry["meta"])
            booster = xgb.Booster()
            booster.load_model(str(path / entry["booster_file"]))
            model.booster_ = booster
        else:
            raise BundleError(f"{slot} model {entry['class']} cannot be loaded with hook {hook!r}")
    except BundleError:
        raise
    except (
        KeyError, TypeError, ValueError, AttributeError, IndexError, OSError, RuntimeError, EOFError,
        pickle.UnpicklingError, RecursionError,
    ) as exc:  # fmt: skip
        # XGBoostError is a ValueError; torch raises RuntimeError or UnpicklingError for a bad state_dict
        raise BundleError(f"bundle {path}: {slot} model ({files}) cannot be loaded: {exc!r:.300}") from None
    missing = [m for m in _SLOT_METHODS[slot] if not callable(getattr(model, m, None))]
    if missing:
        raise BundleError(
            f"{path / MANIFEST_FILE}: models.{slot}.class={entry['class']!r} is not a {slot} model (it lacks "
            f"{', '.join(missing)})"
        )
    return model


def _import_class(dotted: str) -> type:
    """A model class named in a manifest; only classes under ``perfcast.models`` are allowed."""
    module_name, _, name = str(dotted).rpartition(".")
    if not module_name.startswith(_ALLOWED_MODULE_PREFIX):
        raise BundleError(f"model class {dotted!r} is not a perfcast.models class")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise BundleError(f"model class {dotted!r} cannot be imported: {exc}") from None
