"""Few-shot step calibration: a per-cluster correction fitted on a few measured steps.

On a cluster nobody measured, most of a step predictor's error is shared by the configs
run there (its software stack, its achieved collective bandwidth, its clocks). A few
measured steps of the user's own cluster estimate that shared part as a log shift, and,
where the predictor's breakdown of each run is given, how each component of the step
(:data:`CALIBRATED_COMPONENTS`: attention, the rest of the compute, exposed communication;
:mod:`perfcast.models.component_factors`) departs from that shift:

* without breakdown: ``shift = median(log(measured / predicted)) * k / (k + SHRINK_RUNS)``
  over the ``k`` runs kept, shrunk toward zero so that one odd run does not move every
  prediction all the way;
* with breakdown and at least :data:`MIN_FACTOR_RUNS` runs kept (component shares ``a_c``
  of each run's predicted step, summing to 1): a
  row's time is multiplied by ``sum_c f_c a_c``, each component's factor
  ``f_c = exp(shift + d_c)`` the shared shift times its own departure. Shift and departures
  are fitted by least squares on the log ratios, with penalties ``SHRINK_RUNS * shift^2``
  (the same shrinkage, as a mean) and ``FACTOR_PRIOR_RUNS * sum_c d_c^2``: runs that differ
  in their shares tell the components apart, runs alike move every factor together, like
  the shift alone; with fewer runs every factor is the shift's. Each factor is clipped to
  :data:`~perfcast.models.component_factors.FACTOR_RANGE`. The factors are the cluster's
  physical parameters relative to the predictor (``attention x1.4``: its attention kernels
  take 1.4 times the predicted time);
* before that, each run is screened (:func:`~perfcast.models.calibration.screen_measurements`):
  a measured step that is not a positive finite time or lies more than :data:`MAX_STEP_RATIO`
  times off the prediction either way is refused, and from three runs on, a run whose log
  ratio lies more than ``log 3`` (or three robust deviations) from the median is left out
  as an outlier; each is named, with its value, in ``excluded``;
* the predictor's interval is moved along with the median, its width kept (a handful of
  steps says little about the spread of the remaining error).

A cluster is the GPU type and the fabric between nodes (:func:`cluster_key`): a correction
fitted on 16-GPU runs applies to 256-GPU runs of the same cluster. A correction is keyed by
the step predictor it was fitted for (:func:`~perfcast.models.calibration.predictor_identity`)
and applies to that predictor only; a file of schema version 1 (written before the key
existed) is read but never applied, and logged once. Loading checks every field and
refuses a non-finite or nonsensical value, naming the file and the field.

A :class:`ClusterCorrection` is a small JSON file; :class:`CalibratedStepPredictor` applies
the stored corrections to the step predictor they were fitted for and names the correction
of each row in :data:`CALIBRATION_COLUMN`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.errors import BundleError, SpecError
from perfcast.features.run_config import RunConfig
from perfcast.models.component_factors import FACTOR_RANGE, ComponentFactors, breakdown_shares
from perfcast.models.correction_store import (
    CALIBRATION_COLUMN,
    StoredCorrection,
    StoreFormat,
    applicable,
    load_stored,
    predictor_identity,
    save_stored,
    screen_measurements,
    summarize_reasons,
)
from perfcast.models.physics_bounds import MAX_MEASURED_MFU, MFUCeiling, apply_floor, floor_at
from perfcast.models.predictor_protocol import StepTimePredictor

__all__ = [
    "CALIBRATED_COMPONENTS",
    "CALIBRATION_COLUMN",
    "CalibratedStepPredictor",
    "ClusterCorrection",
    "cluster_key",
    "config_cluster_key",
    "fit_step_correction",
    "load_step_corrections",
    "save_step_correction",
]

SHRINK_RUNS = 4.0
"""Pseudo-runs of "no correction" the shift is shrunk with, so few runs move it part way
(chosen on ``benchmarks/step_calibration_eval.py``'s leave-one-source-out)."""
FACTOR_PRIOR_RUNS = 0.3
"""Penalty on each component's log departure from the shift, in units of one run's squared
log error (chosen with :data:`SHRINK_RUNS`)."""
MIN_FACTOR_RUNS = 3
"""Fewest runs kept from which component factors depart from the shared shift: one or two
runs cannot tell the components apart."""
CALIBRATED_COMPONENTS = ("attention", "compute", "communication")
"""The components a calibration with breakdown fits a factor for (together the whole step)."""
SCHEMA_VERSION = 3
READABLE_SCHEMA_VERSIONS = (1, 2, 3)  # 1: no predictor key, mean-based fit; 2: no component factors
MAX_STEP_RATIO = 20.0
"""Largest measured/predicted step-time ratio (either way) a fit accepts."""
MEASURED_FIELD = "measured_step_ms"


def cluster_key(gpu: str, inter_node_fabric: str | None = None) -> str:
    """The key a correction applies to: ``<gpu>[/<inter-node fabric>]``.

    The node size is not part of it: runs on fewer GPUs than a node report smaller nodes.
    """
    return f"{gpu}/{inter_node_fabric}" if inter_node_fabric else gpu


@dataclass(frozen=True)
class ClusterCorrection(StoredCorrection):
    """The log shift of one cluster's step times, from ``n_runs`` measured steps.

    ``predictor`` is the :func:`~perfcast.models.calibration.predictor_identity` of the step
    predictor it was fitted for ("" in schema-1 files: never applied); ``model`` its display
    name; ``log_residuals`` the log ratios of the runs kept; ``excluded`` the runs left out,
    each with its reason; ``factors`` the component factors ``f_c`` (component -> time
    multiplier of its part, the shift included; empty when fitted without breakdown);
    ``best_mfu`` the highest MFU among the runs kept (None where not given): the cluster has
    shown it, so its corrected rows may reach it where the base predictor's MFU ceiling is lower.
    """

    cluster: str
    shift: float
    n_runs: int
    log_residuals: list[float]
    model: str = ""
    created_utc: str = ""
    predictor: str = ""
    excluded: list[str] = field(default_factory=list)
    factors: dict[str, float] = field(default_factory=dict)
    best_mfu: float | None = None

    STORE = StoreFormat(
        "step correction", "cluster", SCHEMA_VERSION, READABLE_SCHEMA_VERSIONS,
        required=("cluster", "shift", "n_runs", "log_residuals"),
    )

    @property
    def factor(self) -> float:
        """The shared multiplier ``exp(shift)``: the whole correction when ``factors`` is empty."""
        return float(np.exp(self.shift))

    def row_factors(self, frame: pd.DataFrame) -> np.ndarray:
        """Per row of predictions with breakdown columns (``<part>_ms``): the step's multiplier."""
        if not self.factors:
            return np.full(len(frame), self.factor)
        return np.exp(ComponentFactors(self.factors).log_scale_of(breakdown_shares(frame, self.factors)))

    def part_factors(self) -> dict[str, float]:
        """Breakdown part (``compute``, ``comm_tp`` …) -> its multiplier, for the parts a factor scales."""
        return ComponentFactors(self.factors).part_factors()

    @classmethod
    def from_json(cls, text: str, *, where: str = "step calibration") -> ClusterCorrection:
        """Read and check a correction written by :meth:`to_json` (or schema version 1).

        Raises:
            BundleError: invalid JSON, another schema, or a field of the wrong type or with a
                non-finite or nonsensical value (named with ``where``, the file).
        """
        data, check = cls.checked_fields(text, where)
        bound = math.log(MAX_STEP_RATIO)
        check.number(data["shift"], "shift", lo=-bound, hi=bound)
        n_runs = check.count(data["n_runs"], "n_runs")
        check.numbers(data["log_residuals"], "log_residuals", length=n_runs)
        try:
            factors = ComponentFactors.from_dict(data.get("factors", {})).to_dict()
        except (TypeError, ValueError) as exc:
            raise BundleError(f"{where}: field 'factors': {exc}") from None
        best = data.get("best_mfu")
        best = None if best is None else check.number(best, "best_mfu", lo=0.0, hi=MAX_MEASURED_MFU)
        return cls(**{**data, "shift": float(data["shift"]), "factors": factors, "best_mfu": best})


def fit_step_correction(
    cluster: str,
    measured_ms: np.ndarray,
    predicted_ms: np.ndarray,
    *,
    model: str = "",
    predictor: str = "",
    labels: Sequence[str] | None = None,
    breakdown: pd.DataFrame | None = None,
    mfu: np.ndarray | None = None,
) -> ClusterCorrection:
    """Fit the correction of ``cluster`` from measured steps and the predictor's times of them, ms.

    Args:
        model: display name of the step predictor.
        predictor: its :func:`~perfcast.models.calibration.predictor_identity`.
        labels: how reasons name each run (default ``row <position>``).
        breakdown: the predictor's rows of the runs, aligned, with breakdown columns
            (``<part>_ms``): fit component factors too (see the module docstring).
        mfu: each run's measured MFU, aligned: the best kept one is stored (``best_mfu``).

    Raises:
        SpecError: mismatched lengths, or no run survives the screening (the reasons,
            naming each run and its value, are in the message).
    """
    measured = np.asarray(measured_ms, dtype=float)
    predicted = np.asarray(predicted_ms, dtype=float)
    if measured.shape != predicted.shape:
        raise SpecError(f"measured_ms has {measured.shape} values but predicted_ms has {predicted.shape}")
    ok, excluded = screen_measurements(measured, predicted, labels, max_ratio=MAX_STEP_RATIO, field_name=MEASURED_FIELD)
    if not ok.any():
        reasons = summarize_reasons(excluded) if excluded else "no run given"
        raise SpecError(f"no usable run to calibrate cluster {cluster}: {reasons}")
    residual = np.log(measured[ok] / predicted[ok])
    k = len(residual)
    shift, factors = float(np.median(residual) * k / (k + SHRINK_RUNS)), {}
    if breakdown is not None:
        if len(breakdown) != len(measured):
            raise SpecError(f"breakdown has {len(breakdown)} rows for {len(measured)} runs")
        if k >= MIN_FACTOR_RUNS:
            shares = breakdown_shares(breakdown.iloc[np.flatnonzero(ok)], CALIBRATED_COMPONENTS)
            shift, factors = _fit_shift_and_factors(residual, shares)
        else:
            factors = dict.fromkeys(CALIBRATED_COMPONENTS, float(np.clip(np.exp(shift), *FACTOR_RANGE)))
    return ClusterCorrection(
        cluster=cluster,
        shift=shift,
        n_runs=k,
        log_residuals=residual.tolist(),
        model=model,
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        predictor=predictor,
        excluded=excluded,
        factors=factors,
        best_mfu=_best(mfu, ok),
    )


def _best(mfu: np.ndarray | None, ok: np.ndarray) -> float | None:
    """The highest finite ``mfu`` among the ``ok`` runs; None where there is none."""
    kept = np.asarray(mfu, dtype=float)[ok] if mfu is not None else np.array([])
    kept = kept[np.isfinite(kept)]
    return float(kept.max()) if len(kept) else None


def _fit_shift_and_factors(residual: np.ndarray, shares: np.ndarray) -> tuple[float, dict[str, float]]:
    """The shift and component factors of the module docstring from log ratios and ``(k, C)`` shares."""
    from scipy.optimize import least_squares

    n = len(CALIBRATED_COMPONENTS)
    lo, hi = np.log(FACTOR_RANGE)
    bound = math.log(MAX_STEP_RATIO)

    def misfit(theta: np.ndarray) -> np.ndarray:
        shift, d = theta[0], theta[1:]
        model = shift + np.log(np.maximum(1.0 + shares @ (np.exp(d) - 1.0), 1e-12))
        return np.concatenate([model - residual, [math.sqrt(SHRINK_RUNS) * shift], math.sqrt(FACTOR_PRIOR_RUNS) * d])

    fit = least_squares(misfit, np.zeros(n + 1), bounds=([-bound, *[lo] * n], [bound, *[hi] * n]))
    shift = float(fit.x[0])
    factors = np.clip(np.exp(shift + fit.x[1:]), *FACTOR_RANGE)
    return shift, dict(zip(CALIBRATED_COMPONENTS, factors.tolist(), strict=True))


def save_step_correction(correction: ClusterCorrection, directory: str | Path) -> Path:
    """Write ``<directory>/<cluster>--<predictor>.json`` atomically (replacing an older one of
    that cluster and predictor; those of other predictors stay).

    Raises:
        SpecError: the correction names no predictor (it would never be applied).
    """
    return save_stored(correction.to_json(), directory, correction.cluster, correction.predictor, "step correction")


def load_step_corrections(directory: str | Path, predictor: str) -> dict[str, ClusterCorrection]:
    """The step corrections in ``directory`` fitted for ``predictor`` (a predictor identity),
    keyed by cluster; none when the folder does not exist. Every file is checked; those of
    other predictors are logged once.

    Raises:
        BundleError: a file that is not a valid step correction, or two for one cluster and predictor.
    """
    return load_stored(directory, ClusterCorrection.from_json, lambda corr: corr.cluster, predictor, "step")


def config_cluster_key(config: RunConfig) -> str:
    """The :func:`cluster_key` of a checked config's cluster."""
    cluster = config.cluster
    return cluster_key(cluster.gpu.id, cluster.inter_node_fabric)


class CalibratedStepPredictor:
    """A step predictor with per-cluster corrections applied to the configs of those clusters.

    Only corrections fitted for ``base`` (its predictor identity) are kept; the others are
    logged once and ignored.
    """

    def __init__(
        self,
        base: StepTimePredictor,
        corrections: Mapping[str, ClusterCorrection],
        *,
        where: str = "the given corrections",
    ) -> None:
        self.base = base
        self.identity = predictor_identity(base)
        self.corrections = applicable(corrections, self.identity, where, "step")
        self.name = f"{base.name}+calibrated" if self.corrections else str(base.name)

    @property
    def flags_out_of_domain(self) -> bool:
        """Whether the base predictor's rows carry an ``out_of_domain`` column."""
        return self.base.flags_out_of_domain

    @property
    def mfu_ceiling(self) -> MFUCeiling:
        """The base predictor's MFU ceiling (100% of the dense peak where it states none)."""
        return getattr(self.base, "mfu_ceiling", None) or MFUCeiling()

    def ceilings(self, configs: Sequence[RunConfig]) -> np.ndarray:
        """MFU ceiling (fraction) of each config: the base's, or its cluster correction's ``best_mfu``
        where that is higher (the cluster measured it)."""
        base = self.mfu_ceiling.ceiling(configs)
        best = [getattr(self.corrections.get(config_cluster_key(c)), "best_mfu", None) for c in configs]
        return np.fmax(base, np.array([np.nan if b is None else b for b in best], dtype=float))

    def predict_configs(self, configs: Sequence[RunConfig], *, coverage: float = 0.9) -> pd.DataFrame:
        """The base predictor's rows with corrected clusters' times scaled, plus
        :data:`CALIBRATION_COLUMN`: the label of the correction applied to the row, "" where
        none was. The step, its interval and each breakdown part are multiplied by the
        row's factor (:meth:`ClusterCorrection.row_factors`); with component factors, each
        part by its own (so the parts still add up to the step); ``composed_step_ms`` stays. A
        step the correction makes faster than its :meth:`ceilings` allow (the base's MFU ceiling, or
        the best MFU the cluster's own runs measured) is raised to it, with its interval and parts."""
        frame = self.base.predict_configs(configs, coverage=coverage)
        if not len(frame):
            return frame.assign(**{CALIBRATION_COLUMN: pd.Series(dtype=object)})
        keys = [config_cluster_key(c) for c in configs]
        applied = [self.corrections.get(k) for k in keys]
        timed = [c for c in frame.columns if c.endswith("_ms") and c != "composed_step_ms"]
        scale = pd.DataFrame(1.0, index=frame.index, columns=timed)
        for correction in {id(c): c for c in applied if c is not None}.values():
            rows = np.array([c is correction for c in applied])
            scale.loc[rows, :] = correction.row_factors(frame.loc[rows])[:, None]
            for part, f in correction.part_factors().items():
                if f"{part}_ms" in scale:
                    scale.loc[rows, f"{part}_ms"] = f
        frame[timed] = frame[timed] * scale
        # a correction that speeds a step up stops at the base's MFU ceiling, as the base does
        before = frame["step_ms"].to_numpy(dtype=float)
        corrected = np.array([c is not None for c in applied])  # the base answers for its own rows
        floor = np.where(corrected, floor_at(configs, self.ceilings(configs)), 0.0)
        frame["step_ms"], frame["step_lo_ms"], frame["step_hi_ms"], _ = apply_floor(
            before, frame["step_lo_ms"], frame["step_hi_ms"], floor
        )
        parts = [c for c in timed if c not in ("step_ms", "step_lo_ms", "step_hi_ms")]
        frame[parts] = frame[parts].mul(frame["step_ms"].to_numpy() / before, axis=0)  # still adding up to the step
        frame[CALIBRATION_COLUMN] = np.array([c.label if c is not None else "" for c in applied], dtype=object)
        return frame
