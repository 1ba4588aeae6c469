"""Few-shot calibration: a per-GPU correction fitted on a handful of measured ops.

On a GPU nobody measured, most of the op model's error is a shift shared by that GPU's
ops (its launch overhead, its achieved bandwidth). A few measured ops of the user's own
GPU estimate that shift per op class:

* ``shift = median(log(measured / predicted)) * k / (k + SHRINK_OPS)`` for ``k`` ops, shrunk
  toward zero when ``k`` is small;
* with at least ``MIN_OPS_FOR_SPREAD`` ops of a class, the interval becomes the empirical
  spread of the corrected residuals on that GPU (a within-GPU interval: the GPU is no
  longer unseen), otherwise the model's own interval is shifted along.

A :class:`GpuCorrection` is a small JSON file; :class:`CalibratedPredictor` applies the
corrections of the GPUs it has to any op predictor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast.errors import BundleError, SpecError
from perfcast.features.ops import op_classes, op_kinds

SHRINK_OPS = 2.0
MIN_OPS_FOR_SPREAD = 20
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class GpuCorrection:
    """Log-shift (and optionally the residual spread) per op class for one GPU."""

    gpu: str
    shifts: dict[str, float]
    n_ops: dict[str, int]
    spread: dict[str, list[float]] = field(default_factory=dict)  # class -> sorted corrected log residuals
    model: str = ""
    created_utc: str = ""

    def to_json(self) -> str:
        """JSON text of the correction (``schema_version`` 1)."""
        return json.dumps({"schema_version": SCHEMA_VERSION, **asdict(self)}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, *, where: str = "calibration") -> GpuCorrection:
        """Read a correction written by :meth:`to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BundleError(f"{where}: invalid JSON: {exc}") from None
        if not isinstance(data, dict) or data.pop("schema_version", None) != SCHEMA_VERSION:
            raise BundleError(f"{where}: not a perfcast GPU correction (schema_version {SCHEMA_VERSION})")
        try:
            return cls(**data)
        except TypeError as exc:
            raise BundleError(f"{where}: {exc}") from None


def shrunk_shift(log_residuals: np.ndarray) -> float:
    """The correction of one class from ``k`` log residuals: their median, shrunk by ``k/(k+SHRINK_OPS)``."""
    k = len(log_residuals)
    return float(np.median(log_residuals) * k / (k + SHRINK_OPS)) if k else 0.0


def fit_correction(
    gpu: str, ops: pd.DataFrame, measured_ms: np.ndarray, predicted_ms: np.ndarray, *, model: str = ""
) -> GpuCorrection:
    """Fit the correction of ``gpu`` from measured ops and the model's predictions of them."""
    measured = np.asarray(measured_ms, dtype=float)
    predicted = np.asarray(predicted_ms, dtype=float)
    ok = np.isfinite(measured) & np.isfinite(predicted) & (measured > 0) & (predicted > 0)
    if not ok.any():
        raise SpecError(f"no usable measured ops to calibrate {gpu}: need positive measured and predicted times")
    classes = op_classes(op_kinds(ops))[ok]
    residual = np.log(measured[ok] / predicted[ok])
    shifts, n_ops, spread = {}, {}, {}
    for cls in np.unique(classes):
        r = residual[classes == cls]
        shifts[str(cls)] = shrunk_shift(r)
        n_ops[str(cls)] = len(r)
        if len(r) >= MIN_OPS_FOR_SPREAD:
            spread[str(cls)] = np.sort(r - shifts[str(cls)]).tolist()
    return GpuCorrection(gpu=gpu, shifts=shifts, n_ops=n_ops, spread=spread, model=model,
                         created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"))  # fmt: skip


class CalibratedPredictor:
    """An op predictor with per-GPU corrections applied to the rows of those GPUs."""

    def __init__(self, base: Any, corrections: Mapping[str, GpuCorrection]) -> None:
        self.base = base
        self.corrections = dict(corrections)
        self.name = f"{getattr(base, 'name', 'model')}+calibrated"

    def out_of_domain(self, ops: pd.DataFrame) -> np.ndarray:
        """The base predictor's out-of-domain flags (all False when it has none)."""
        flags = getattr(self.base, "out_of_domain", None)
        return flags(ops) if flags is not None else np.zeros(len(ops), dtype=bool)

    def predict_ops(self, ops: pd.DataFrame, *, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pred, lo, hi) in ms, corrected on the GPUs that have a correction."""
        pred, lo, hi = (np.array(a, dtype=float) for a in self.base.predict_ops(ops, coverage=coverage))
        if not self.corrections or not len(ops):
            return pred, lo, hi
        classes = op_classes(op_kinds(ops))
        gpus = ops["gpu"].astype(str).to_numpy()
        for gpu, corr in self.corrections.items():
            for cls, shift in corr.shifts.items():
                m = (gpus == gpu) & (classes == cls)
                if not m.any():
                    continue
                pred[m] *= np.exp(shift)
                if cls in corr.spread:
                    r = np.asarray(corr.spread[cls])
                    q_lo = min(float(np.quantile(r, (1 - coverage) / 2)), 0.0)
                    q_hi = max(float(np.quantile(r, (1 + coverage) / 2)), 0.0)
                    lo[m], hi[m] = pred[m] * np.exp(q_lo), pred[m] * np.exp(q_hi)
                else:
                    lo[m] *= np.exp(shift)
                    hi[m] *= np.exp(shift)
        return pred, lo, hi


def save_correction(correction: GpuCorrection, directory: str | Path) -> Path:
    """Write ``<directory>/<gpu>.json`` (replacing an older correction of that GPU)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{correction.gpu}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(correction.to_json(), encoding="utf-8")
    tmp.replace(path)
    return path


def load_corrections(directory: str | Path) -> dict[str, GpuCorrection]:
    """Every correction stored in ``directory`` (none when it does not exist), keyed by GPU id."""
    directory = Path(directory)
    if not directory.is_dir():
        return {}
    out = {}
    for path in sorted(directory.glob("*.json")):
        corr = GpuCorrection.from_json(path.read_text(encoding="utf-8"), where=str(path))
        out[corr.gpu] = corr
    return out
