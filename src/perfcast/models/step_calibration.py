"""Few-shot step calibration: a per-cluster correction fitted on one to five measured steps.

On a cluster nobody measured, most of a step predictor's error is shared by the configs
run there (its software stack, its achieved collective bandwidth, its clocks). A few
measured steps of the user's own cluster estimate that shared part as a log shift:

* ``shift = mean(log(measured / predicted)) * k / (k + SHRINK_RUNS)`` for ``k`` runs,
  shrunk toward zero so that one odd run does not move every prediction all the way;
* the predictor's interval is moved along with the median, its width kept (a handful of
  steps says little about the spread of the remaining error).

A cluster is the GPU type and the fabric between nodes (:func:`cluster_key`): a correction
fitted on 16-GPU runs applies to 256-GPU runs of the same cluster. A
:class:`ClusterCorrection` is a small JSON file; :class:`CalibratedStepPredictor` applies
the stored corrections to any step predictor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast.errors import BundleError, SpecError
from perfcast.features.run_config import RunConfig
from perfcast.models.calibration import read_json_files, write_json_atomic

SHRINK_RUNS = 0.5
SCHEMA_VERSION = 1
_SAFE = str.maketrans({c: "_" for c in '/\\:* ?"<>|'})


def cluster_key(gpu: str, inter_node_fabric: str | None = None) -> str:
    """The key a correction applies to: ``<gpu>[/<inter-node fabric>]``.

    The node size is not part of it: runs on fewer GPUs than a node report smaller nodes.
    """
    return f"{gpu}/{inter_node_fabric}" if inter_node_fabric else gpu


@dataclass(frozen=True)
class ClusterCorrection:
    """The log shift of one cluster's step times, from ``n_runs`` measured steps."""

    cluster: str
    shift: float
    n_runs: int
    log_residuals: list[float]
    model: str = ""
    created_utc: str = ""

    @property
    def factor(self) -> float:
        """Multiplier applied to predicted step times (and their interval)."""
        return float(np.exp(self.shift))

    def to_json(self) -> str:
        """JSON text of the correction (``schema_version`` 1)."""
        return json.dumps({"schema_version": SCHEMA_VERSION, **asdict(self)}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, *, where: str = "step calibration") -> ClusterCorrection:
        """Read a correction written by :meth:`to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BundleError(f"{where}: invalid JSON: {exc}") from None
        if not isinstance(data, dict) or data.pop("schema_version", None) != SCHEMA_VERSION:
            raise BundleError(f"{where}: not a perfcast step correction (schema_version {SCHEMA_VERSION})")
        try:
            return cls(**data)
        except TypeError as exc:
            raise BundleError(f"{where}: {exc}") from None


def fit_step_correction(
    cluster: str, measured_ms: np.ndarray, predicted_ms: np.ndarray, *, model: str = ""
) -> ClusterCorrection:
    """Fit the correction of ``cluster`` from measured steps and the predictor's times of them, ms.

    Raises:
        SpecError: no run has a positive measured and predicted step time.
    """
    measured = np.asarray(measured_ms, dtype=float)
    predicted = np.asarray(predicted_ms, dtype=float)
    if measured.shape != predicted.shape:
        raise SpecError(f"measured_ms has {measured.shape} values but predicted_ms has {predicted.shape}")
    ok = np.isfinite(measured) & np.isfinite(predicted) & (measured > 0) & (predicted > 0)
    if not ok.any():
        raise SpecError(f"no usable run to calibrate cluster {cluster}: need measured_step_ms > 0 and a predicted step")
    residual = np.log(measured[ok] / predicted[ok])
    k = len(residual)
    return ClusterCorrection(
        cluster=cluster,
        shift=float(residual.mean() * k / (k + SHRINK_RUNS)),
        n_runs=k,
        log_residuals=residual.tolist(),
        model=model,
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def save_step_correction(correction: ClusterCorrection, directory: str | Path) -> Path:
    """Write ``<directory>/<cluster>.json`` atomically (replacing an older one of that cluster)."""
    return write_json_atomic(correction.to_json(), directory, correction.cluster.translate(_SAFE))


def load_step_corrections(directory: str | Path) -> dict[str, ClusterCorrection]:
    """Every step correction stored in ``directory`` (none when it does not exist), keyed by cluster."""
    parsed = read_json_files(directory, lambda text, where: ClusterCorrection.from_json(text, where=where))
    return {corr.cluster: corr for corr in parsed}


def config_cluster_key(config: RunConfig) -> str:
    """The :func:`cluster_key` of a checked config's cluster."""
    cluster = config.cluster
    return cluster_key(cluster.gpu.id, cluster.inter_node_fabric)


class CalibratedStepPredictor:
    """A step predictor with per-cluster corrections applied to the configs of those clusters."""

    def __init__(self, base: Any, corrections: Mapping[str, ClusterCorrection]) -> None:
        self.base = base
        self.corrections = dict(corrections)
        self.name = f"{getattr(base, 'name', 'model')}+calibrated"

    @property
    def flags_out_of_domain(self) -> bool:
        """Whether the base predictor's rows carry an ``out_of_domain`` column."""
        return bool(getattr(self.base, "flags_out_of_domain", False))

    def predict_configs(self, configs: Sequence[RunConfig], *, coverage: float = 0.9) -> pd.DataFrame:
        """The base predictor's rows, step times and breakdown scaled on corrected clusters."""
        frame = self.base.predict_configs(configs, coverage=coverage)
        if not self.corrections or not len(frame):
            return frame
        keys = np.array([config_cluster_key(c) for c in configs], dtype=object)
        factor = np.array([self.corrections[k].factor if k in self.corrections else 1.0 for k in keys])
        timed = [c for c in frame.columns if c.endswith("_ms") and c != "composed_step_ms"]
        frame[timed] = frame[timed].mul(factor, axis=0)
        return frame
