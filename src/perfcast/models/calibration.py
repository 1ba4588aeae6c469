"""Few-shot calibration: a per-GPU correction fitted on a handful of measured ops.

On a GPU nobody measured, much of the op model's error is a shift shared by that GPU's
ops (its launch overhead, its achieved bandwidth), and the rest depends on the shape (a
GEMM family that runs a worse kernel there). A few measured ops of the user's own GPU
estimate both, per correction group (:func:`correction_groups`: the op class, and for GEMMs
also the dtype family, since a calibration run measures one dtype and another dtype's GEMMs
run other kernels at another peak; GEMMs of a family no measured op had keep the model's
prediction and interval):

* ``shift = median(log(measured / predicted)) * k / (k + SHRINK_OPS)`` for ``k`` ops, shrunk
  toward zero when ``k`` is small;
* with at least :data:`MIN_OPS_FOR_SLOPES` ops, a trend on top: slopes of the log residual
  in the op's log FLOPs and log arithmetic intensity (:data:`SLOPE_TERMS`, centred on the
  measured ops, held flat outside their range, Gaussian prior of variance
  :data:`SLOPE_PRIOR_VAR`), since an unseen GPU's error grows with the op's size (its
  sustained clock and bandwidth differ from the datasheet);
* a Gaussian-process residual on top: the log residuals minus shift and trend, smoothed over
  the log dimensions of the op (:data:`RESIDUAL_DIMS`) and its log intensity with a
  squared-exponential kernel of length :data:`LENGTH_SCALE` that only links ops of the same
  kind. Far from every measured op it falls back to shift and trend; near one, it follows
  that op's residual. For a row ``x`` with trend inputs ``u``:
  ``log factor = shift + (u - u_0) . beta + sum_j PRIOR_VAR * k(x, x_j) * alpha_j`` with
  ``beta = (U' A^-1 U + I / SLOPE_PRIOR_VAR)^-1 U' A^-1 (r - shift)``,
  ``alpha = A^-1 (r - shift - U beta)`` and ``A = PRIOR_VAR K + NOISE_VAR I``;
* with at least :data:`MIN_OPS_FOR_TREES` ops of a class (a ``perfcast calibrate`` minute
  measures several hundred), boosted trees on top (:data:`TREE_PARAMS`), fitted on what
  shift, trend and GP leave, over the GP's inputs plus log FLOPs and the op kind. Much of
  an unseen GPU's error is its own kernel choices for families of shapes, which a smooth
  GP does not follow (measured effect: ``benchmarks/results/docstring_notes.md``);
* with at least ``MIN_OPS_FOR_SPREAD`` ops of a class, the interval becomes the empirical
  spread of the leave-one-out residuals of that correction on that GPU (with trees,
  5-fold cross-fitted residuals of the whole correction: a within-GPU interval, since the
  GPU is no longer unseen), read at split-conformal ranks
  (:func:`~perfcast.models.intervals.conformal_bounds`),
  otherwise the model's own interval is scaled along.

Before fitting, the measurements are screened
(:func:`~perfcast.models.correction_store.screen_measurements`): a row whose measured time is
not a positive finite number, or lies more than :data:`MAX_OP_RATIO` times off the prediction
either way, is refused, and a row whose log ratio lies more than ``log 3`` (or three robust
deviations, when the class is wider) from its class's median is left out as an outlier; each
is named in ``excluded``.

A correction is keyed by the predictor it was fitted for (:func:`predictor_identity`: the
predictor's name plus a hash of its bundle manifest) and applies to that predictor only. A
file written before this key existed (schema versions 1 to 4) is read but never applied: it
is logged once, with a request to re-run ``perfcast calibrate``, since nothing says which
predictor's errors it corrects. Loading checks every field (:meth:`GpuCorrection.from_json`)
and refuses a file with a non-finite or nonsensical value, naming the file and the field.

A :class:`GpuCorrection` is a JSON file (a few KB; some 600 KB with a GP and trees over
700 ops); :class:`CalibratedPredictor` applies the corrections of the GPUs it has to the op
predictor they were fitted for, and says which correction each row got
(:meth:`CalibratedPredictor.applied_calibrations`, :data:`CALIBRATION_COLUMN`).

The per-class fitting and evaluation (shift, trend + GP, trees) are in
:mod:`perfcast.models.correction_fit`, whose names this module re-exports.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast.data.schema import DType
from perfcast.errors import BundleError, SpecError
from perfcast.features.ops import op_classes, op_kinds
from perfcast.models.correction_fit import GP_CHUNK_ROWS as GP_CHUNK_ROWS
from perfcast.models.correction_fit import GP_INPUTS as GP_INPUTS
from perfcast.models.correction_fit import LENGTH_SCALE as LENGTH_SCALE
from perfcast.models.correction_fit import MAX_TREES as MAX_TREES
from perfcast.models.correction_fit import MIN_OPS_FOR_SLOPES as MIN_OPS_FOR_SLOPES
from perfcast.models.correction_fit import MIN_OPS_FOR_TREES as MIN_OPS_FOR_TREES
from perfcast.models.correction_fit import NOISE_VAR as NOISE_VAR
from perfcast.models.correction_fit import PRIOR_VAR as PRIOR_VAR
from perfcast.models.correction_fit import RESIDUAL_DIMS as RESIDUAL_DIMS
from perfcast.models.correction_fit import SHRINK_OPS as SHRINK_OPS
from perfcast.models.correction_fit import SLOPE_PRIOR_VAR as SLOPE_PRIOR_VAR
from perfcast.models.correction_fit import (
    SLOPE_TERMS,
    class_log_factor,
    cross_fitted_residuals,
    fit_class,
    load_booster,
)
from perfcast.models.correction_fit import SPREAD_FOLDS as SPREAD_FOLDS
from perfcast.models.correction_fit import TREE_PARAMS as TREE_PARAMS
from perfcast.models.correction_fit import gp_inputs as gp_inputs
from perfcast.models.correction_fit import log_dims as log_dims
from perfcast.models.correction_fit import shrunk_shift as shrunk_shift
from perfcast.models.correction_fit import tree_inputs as tree_inputs
from perfcast.models.correction_store import (
    CALIBRATION_COLUMN,
    FieldCheck,
    StoredCorrection,
    StoreFormat,
    applicable,
    load_stored,
    predictor_identity,
    save_stored,
    screen_measurements,
    summarize_reasons,
)
from perfcast.models.intervals import conformal_bounds, log_interval, straddle_zero
from perfcast.models.op_bounds import dtype_family
from perfcast.models.predictor_protocol import OpPrediction, OpPredictor

__all__ = [
    "CALIBRATION_COLUMN",
    "CalibratedPredictor",
    "GpuCorrection",
    "fit_correction",
    "load_corrections",
    "predictor_identity",
    "save_correction",
    "screen_measurements",
]

logger = logging.getLogger(__name__)

MIN_OPS_FOR_SPREAD = 20
GROUP_SEP = "@"
"""Separates an op class from the GEMM dtype family in a correction group (``gemm@16-bit``)."""
DTYPE_GROUPED_CLASSES = ("gemm",)
"""Op classes whose corrections are kept per dtype family."""


def correction_groups(ops: pd.DataFrame, kinds: np.ndarray) -> np.ndarray:
    """Per op row, the group a correction is fitted and applied per: the op class (``vector``),
    or for :data:`DTYPE_GROUPED_CLASSES` the class and the dtype family of the row's ``dtype``
    (``gemm@16-bit``; the class alone where the dtype is missing or unknown)."""
    groups = op_classes(kinds).astype(object)
    split = np.isin(groups, DTYPE_GROUPED_CLASSES)
    if split.any() and "dtype" in ops:
        codes, names = pd.factorize(ops["dtype"].astype(str))
        elem = np.array([_element_bytes(name) for name in names], dtype=float)[codes]
        stated = split & np.isfinite(elem)
        families = dtype_family(np.where(stated, elem, 0.0))
        groups[stated] = groups[stated] + GROUP_SEP + families[stated]
    return groups


def _element_bytes(dtype: str) -> float:
    """Bytes per element of a dtype spelling (:meth:`DType.parse`), NaN where it names none."""
    try:
        return DType.parse(dtype).bytes_per_element
    except SpecError:
        return float("nan")


def group_class(group: str) -> str:
    """The op class of a correction group (``gemm@16-bit`` -> ``gemm``)."""
    return group.split(GROUP_SEP, 1)[0]


SCHEMA_VERSION = 5
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4, 5)  # 1: shift only; 2: GP, no trend; 3: no trees; 4: no predictor key
MAX_OP_RATIO = 1000.0
"""Largest measured/predicted ratio of an op (either way) a fit accepts: a roofline estimate
of a tiny op is a lower bound that launch overhead exceeds by two orders of magnitude."""


@dataclass(frozen=True)
class GpuCorrection(StoredCorrection):
    """Log-shift (and optionally the residual spread) per op class for one GPU.

    ``predictor`` is the :func:`predictor_identity` of the op predictor it was fitted for
    ("" in files written before the key existed: such a correction is never applied);
    ``model`` that predictor's display name; ``excluded`` the measured rows left out of the
    fit, each with its reason.
    """

    STORE = StoreFormat("GPU correction", "gpu", SCHEMA_VERSION, READABLE_SCHEMA_VERSIONS, ("gpu", "shifts", "n_ops"))

    gpu: str
    shifts: dict[str, float]
    n_ops: dict[str, int]
    spread: dict[str, list[float]] = field(default_factory=dict)  # class -> sorted corrected log residuals
    model: str = ""
    created_utc: str = ""
    residual: dict[str, dict[str, Any]] = field(default_factory=dict)  # class -> GP points (see module doc)
    trees: dict[str, dict[str, Any]] = field(default_factory=dict)  # class -> {"kinds", "booster": XGBoost JSON}
    predictor: str = ""
    excluded: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, text: str, *, where: str = "calibration") -> GpuCorrection:
        """Read and check a correction written by :meth:`to_json` (any readable schema version).

        Raises:
            BundleError: invalid JSON, another schema, or a field of the wrong type or with a
                non-finite or nonsensical value (named with ``where``, the file).
        """
        data, check = cls.checked_fields(text, where)
        bound = math.log(MAX_OP_RATIO)
        for cls_name, shift in check.mapping(data["shifts"], "shifts").items():
            check.number(shift, f"shifts.{cls_name}", lo=-bound, hi=bound)
        n_ops = check.mapping(data["n_ops"], "n_ops")
        for cls_name, n in n_ops.items():
            check.count(n, f"n_ops.{cls_name}")
        for cls_name in data["shifts"]:
            if cls_name not in n_ops:
                raise BundleError(f"{where}: field 'n_ops' has no count for class {cls_name!r} of 'shifts'")
        for cls_name, values in check.mapping(data.get("spread", {}), "spread").items():
            values = check.numbers(values, f"spread.{cls_name}", nonempty=True)
            if any(b < a for a, b in zip(values, values[1:], strict=False)):
                raise BundleError(f"{where}: field 'spread.{cls_name}' is not sorted ascending (negative widths)")
        for cls_name, gp in check.mapping(data.get("residual", {}), "residual").items():
            _check_gp(check, check.mapping(gp, f"residual.{cls_name}"), f"residual.{cls_name}")
        for cls_name, trees in check.mapping(data.get("trees", {}), "trees").items():
            _check_trees(check, check.mapping(trees, f"trees.{cls_name}"), f"trees.{cls_name}")
        return cls(**data)

    def log_factors(self, ops: pd.DataFrame) -> np.ndarray:
        """Log of the correction factor of each row of ``ops`` (0 for classes it has no shift for).

        Rows are taken to be of this correction's GPU; the caller selects them.
        """
        out = np.zeros(len(ops))
        if not len(ops):
            return out
        kinds = op_kinds(ops)
        groups = self.groups_of(ops, kinds)
        for group, shift in self.shifts.items():
            m = groups == group
            if not m.any():
                continue
            cls = group_class(group)
            out[m] = class_log_factor(shift, self.residual.get(group), self.trees.get(group), ops.loc[m], cls, kinds[m])
        return out

    def groups_of(self, ops: pd.DataFrame, kinds: np.ndarray) -> np.ndarray:
        """Each row's correction group; a correction stored per class alone (written before
        dtype groups) applies to every dtype of its class, as it was fitted."""
        groups = correction_groups(ops, kinds)
        whole = [g for g in self.shifts if GROUP_SEP not in g and g in DTYPE_GROUPED_CLASSES]
        if whole:
            classes = np.array([group_class(g) for g in groups], dtype=object)
            groups = np.where(np.isin(classes, whole), classes, groups)
        return groups

    def correct(
        self, ops: pd.DataFrame, pred: np.ndarray, lo: np.ndarray, hi: np.ndarray, *, coverage: float = 0.9
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Corrected ``(pred, lo, hi)`` (ms) of rows of this correction's GPU, given the model's.

        The median is scaled by :meth:`log_factors`; the interval becomes the class's
        measured spread where there is one, else the model's interval scaled along.
        """
        pred, lo, hi = (np.array(a, dtype=float) for a in (pred, lo, hi))
        if not len(ops):
            return pred, lo, hi
        factor = np.exp(self.log_factors(ops))
        groups = self.groups_of(ops, op_kinds(ops))
        for group in self.shifts:
            m = groups == group
            if not m.any():
                continue
            pred[m] *= factor[m]
            if group in self.spread:
                q_lo, q_hi = straddle_zero(*conformal_bounds(np.asarray(self.spread[group]), coverage))
                lo[m], hi[m] = log_interval(pred[m], q_lo, q_hi).T
            else:
                lo[m] *= factor[m]
                hi[m] *= factor[m]
        return pred, lo, hi


def fit_correction(
    gpu: str,
    ops: pd.DataFrame,
    measured_ms: np.ndarray,
    predicted_ms: np.ndarray,
    *,
    model: str = "",
    predictor: str = "",
    labels: Sequence[str] | None = None,
) -> GpuCorrection:
    """Fit the correction of ``gpu`` from measured ops and the model's predictions of them, ms.

    Args:
        model: display name of the op predictor.
        predictor: its :func:`predictor_identity`, the key the correction applies under.
        labels: how reasons name each row (default ``row <position>``).

    Raises:
        SpecError: no row survives :func:`screen_measurements` (the reasons are named).
    """
    measured = np.asarray(measured_ms, dtype=float)
    predicted = np.asarray(predicted_ms, dtype=float)
    if measured.shape != predicted.shape or len(measured) != len(ops):
        raise SpecError(
            f"measured_ms has {measured.shape} values, predicted_ms {predicted.shape} and ops {len(ops)} rows"
        )
    classes_all = correction_groups(ops, op_kinds(ops)) if len(ops) else np.array([], dtype=object)
    ok, excluded = screen_measurements(
        measured, predicted, labels, max_ratio=MAX_OP_RATIO, field_name="measured_ms", groups=classes_all
    )
    if not ok.any():
        raise SpecError(f"no usable measured ops to calibrate {gpu}: {summarize_reasons(excluded)}")
    if excluded:
        logger.info("calibration of %s leaves out %d measured ops: %s", gpu, len(excluded), summarize_reasons(excluded))
    used = ops.loc[ok]
    kinds = op_kinds(used)
    groups = classes_all[ok]
    residual = np.log(measured[ok] / predicted[ok])
    shifts, n_ops, spread, gps, trees = {}, {}, {}, {}, {}
    for group in (str(g) for g in np.unique(groups)):
        m = groups == group
        cls = group_class(group)
        cls_ops, cls_kinds, r = used.loc[m], kinds[m], residual[m]
        shifts[group], gp, cls_trees, loo = fit_class(cls_ops, cls, cls_kinds, r)
        n_ops[group] = len(r)
        if gp:
            gps[group] = gp
        if cls_trees:
            trees[group] = cls_trees
            loo = cross_fitted_residuals(cls_ops, cls, cls_kinds, r)
        if len(r) >= MIN_OPS_FOR_SPREAD:
            spread[group] = np.sort(loo).tolist()
    created = datetime.now(UTC).isoformat(timespec="seconds")
    return GpuCorrection(
        gpu=gpu,
        shifts=shifts,
        n_ops=n_ops,
        spread=spread,
        model=model,
        created_utc=created,
        residual=gps,
        trees=trees,
        predictor=predictor,
        excluded=excluded,
    )


class CalibratedPredictor:
    """An op predictor with per-GPU corrections applied to the rows of those GPUs.

    Wraps an :class:`~perfcast.models.predictor_protocol.OpPredictor` and is one: the base's
    interval and flags, its times corrected. Only corrections fitted for ``base``
    (:func:`predictor_identity`) are kept; the others are logged once and ignored.
    """

    def __init__(
        self, base: OpPredictor, corrections: Mapping[str, GpuCorrection], *, where: str = "the given corrections"
    ) -> None:
        self.base = base
        self.identity = predictor_identity(base)
        self.corrections = applicable(corrections, self.identity, where, "op")
        self.name = f"{base.name}+calibrated" if self.corrections else str(base.name)

    @property
    def has_interval(self) -> bool:
        """Whether the base predictor gives an interval."""
        return self.base.has_interval

    @property
    def flags_out_of_domain(self) -> bool:
        """Whether the base predictor flags rows out of domain."""
        return self.base.flags_out_of_domain

    def predict_ops(self, ops: pd.DataFrame, *, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pred, lo, hi) in ms, the times of :meth:`predict_ops_flagged`."""
        return self.predict_ops_flagged(ops, coverage=coverage)[:3]

    def predict_ops_flagged(self, ops: pd.DataFrame, *, coverage: float = 0.9) -> OpPrediction:
        """The base predictor's prediction, times corrected on the GPUs that have a correction."""
        base = self.base.predict_ops_flagged(ops, coverage=coverage)
        pred, lo, hi = (np.array(a, dtype=float) for a in base[:3])
        if self.corrections and len(ops):
            gpus = ops["gpu"].astype(str).to_numpy()
            for gpu, corr in self.corrections.items():
                on = np.flatnonzero(gpus == gpu)
                if len(on):
                    pred[on], lo[on], hi[on] = corr.correct(ops.iloc[on], pred[on], lo[on], hi[on], coverage=coverage)
        return OpPrediction(pred, lo, hi, np.asarray(base.out_of_domain, dtype=bool))

    def applied_calibrations(self, ops: pd.DataFrame) -> np.ndarray:
        """Per row of ``ops`` (as passed to :meth:`predict_ops`), the :attr:`GpuCorrection.label`
        of the correction that changed it, "" where none did (dtype object)."""
        out = np.full(len(ops), "", dtype=object)
        if not self.corrections or not len(ops):
            return out
        gpus = ops["gpu"].astype(str).to_numpy()
        kinds = op_kinds(ops)
        for gpu, corr in self.corrections.items():
            out[(gpus == gpu) & np.isin(corr.groups_of(ops, kinds), list(corr.shifts))] = corr.label
        return out


def save_correction(correction: GpuCorrection, directory: str | Path) -> Path:
    """Write ``<directory>/<gpu>--<predictor>.json`` (replacing an older correction of that GPU
    and predictor; those of other predictors stay).

    Raises:
        SpecError: the correction names no predictor (it would never be applied).
    """
    return save_stored(correction.to_json(), directory, correction.gpu, correction.predictor, "correction")


def load_corrections(directory: str | Path, predictor: str) -> dict[str, GpuCorrection]:
    """The corrections in ``directory`` fitted for ``predictor`` (a :func:`predictor_identity`),
    keyed by GPU id; none when the folder does not exist. Every file is checked; the
    corrections of other predictors are logged once (:func:`applicable`).

    Raises:
        BundleError: a file that is not a valid correction (see :meth:`GpuCorrection.from_json`),
            or two for one GPU and predictor.
    """
    return load_stored(directory, GpuCorrection.from_json, lambda corr: corr.gpu, predictor, "op")


def _check_gp(check: FieldCheck, gp: dict[str, Any], name: str) -> None:
    """Check the JSON form of a trend + GP (:func:`~perfcast.models.correction_fit.fit_gp`) of the
    class named in ``name``."""
    for key in ("x", "alpha", "kinds", "length_scale", "prior_var"):
        if key not in gp:
            raise BundleError(f"{check.where}: field {name}.{key} is missing")
    alpha = check.numbers(gp["alpha"], f"{name}.alpha")
    for i, kind in enumerate(check.sequence(gp["kinds"], f"{name}.kinds", length=len(alpha))):
        check.text(kind, f"{name}.kinds[{i}]")
    inputs = check.sequence(gp.get("inputs", ["dims"]), f"{name}.inputs")
    allowed = ("dims", *SLOPE_TERMS)
    for i, item in enumerate(inputs):
        if item not in allowed:
            raise check.fail(f"{name}.inputs[{i}]", item, ", ".join(allowed))
    cls = group_class(name.rpartition(".")[2])
    width = sum(len(RESIDUAL_DIMS.get(cls, ())) if item == "dims" else 1 for item in inputs)
    for i, point in enumerate(check.sequence(gp["x"], f"{name}.x", length=len(alpha))):
        check.numbers(point, f"{name}.x[{i}]", length=width)
    check.number(gp["length_scale"], f"{name}.length_scale", lo=1e-6)
    check.number(gp["prior_var"], f"{name}.prior_var", lo=0.0)
    if "trend_terms" in gp:
        terms = check.sequence(gp["trend_terms"], f"{name}.trend_terms")
        for i, term in enumerate(terms):
            if term not in SLOPE_TERMS:
                raise check.fail(f"{name}.trend_terms[{i}]", term, ", ".join(SLOPE_TERMS))
        parts = {k: check.numbers(gp.get(k), f"{name}.{k}", length=len(terms))
                 for k in ("trend_centre", "trend_slopes", "trend_lo", "trend_hi")}  # fmt: skip
        if any(lo > hi for lo, hi in zip(parts["trend_lo"], parts["trend_hi"], strict=True)):
            raise check.fail(f"{name}.trend_lo", parts["trend_lo"], f"each at most {name}.trend_hi")


def _check_trees(check: FieldCheck, trees: dict[str, Any], name: str) -> None:
    """Check the JSON form of a residual booster (:func:`~perfcast.models.correction_fit.fit_trees`)
    and that XGBoost reads it."""
    import xgboost as xgb

    for i, kind in enumerate(check.sequence(trees.get("kinds"), f"{name}.kinds")):
        check.text(kind, f"{name}.kinds[{i}]")
    text = check.text(trees.get("booster"), f"{name}.booster", nonempty=True)
    try:
        load_booster(text)
    except (xgb.core.XGBoostError, ValueError) as exc:
        raise BundleError(f"{check.where}: field {name}.booster is not an XGBoost model: {exc}") from None
