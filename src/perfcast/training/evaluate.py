"""Leave-one-GPU-out evaluation of op predictors beside the two baselines.

For every GPU in the data, a model is fitted on the other GPUs' rows and scored on all
rows of the held-out GPU, per evaluation class (``gemm_fp32``, ``gemm_fp16``, ``vector``,
``attention``, ``collective`` ...): MAPE, median APE, p90 APE, coverage of the interval and
its mean relative width, for the model and for both baselines
(:mod:`perfcast.models.baselines`). This is the split that matches real use: predicting
a GPU nobody measured.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd
from sklearn.model_selection import LeaveOneGroupOut

from perfcast.errors import OutOfDomainWarning
from perfcast.models.baselines import EfficiencyBaseline, RooflineBaseline
from perfcast.training.metrics import summarize

logger = logging.getLogger(__name__)

MODEL = "model"
CALIBRATION_LEVELS = (0.5, 0.8, 0.9, 0.95)
"""Nominal coverages whose held-out intervals are kept for the calibration curve."""
BASELINES = {"roofline": RooflineBaseline, "efficiency": EfficiencyBaseline}


class IntervalRegressor(Protocol):
    """What the evaluation needs of a model."""

    def fit(self, X: pd.DataFrame, y: np.ndarray) -> Any: ...
    def predict(self, X: pd.DataFrame) -> np.ndarray: ...
    def predict_interval(self, X: pd.DataFrame, *, coverage: float = 0.9) -> np.ndarray: ...


def evaluation_class(ops: pd.DataFrame, op_class: pd.Series) -> pd.Series:
    """Label of each row for reporting: GEMMs split by dtype (``gemm_fp16``), others by class."""
    gemm = op_class == "gemm"
    return op_class.where(~gemm, "gemm_" + ops["dtype"].astype(str))


@dataclass(frozen=True)
class LogoResult:
    """Per-row held-out predictions and the per-(GPU, class) metrics table.

    ``predictions`` has ``gpu, eval_class, measured_ms``, the model's ``model``,
    ``model_lo``, ``model_hi`` (at the evaluated coverage), ``lo@c``/``hi@c`` for each of
    ``CALIBRATION_LEVELS``, and one column per baseline.
    """

    predictions: pd.DataFrame
    table: pd.DataFrame

    def summary(self) -> pd.DataFrame:
        """Median over held-out GPUs of each metric, per evaluation class and predictor."""
        return self.table.groupby(["eval_class", "predictor"]).median(numeric_only=True).drop(columns="n")


def _metrics(block: pd.DataFrame, name: str) -> dict[str, float]:
    lo = block.get(f"{name}_lo")
    hi = block.get(f"{name}_hi")
    with_interval = name == MODEL and lo is not None
    return summarize(
        block[name].to_numpy(),
        block["measured_ms"].to_numpy(),
        lo.to_numpy() if with_interval else None,
        hi.to_numpy() if with_interval else None,
    )


def _predict_fold(model: IntervalRegressor, X_test: pd.DataFrame, fold: pd.DataFrame, coverage: float) -> None:
    """Add the model's prediction and its intervals (at ``coverage`` and each calibration level) to ``fold``."""
    fold[MODEL] = model.predict(X_test)
    interval = model.predict_interval(X_test, coverage=coverage)
    fold[f"{MODEL}_lo"], fold[f"{MODEL}_hi"] = interval[:, 0], interval[:, 1]
    for level in CALIBRATION_LEVELS:
        inner = model.predict_interval(X_test, coverage=level)
        fold[f"lo@{level}"], fold[f"hi@{level}"] = inner[:, 0], inner[:, 1]


def evaluate_logo(
    X: pd.DataFrame,
    y: np.ndarray,
    *,
    make_model: Callable[[], IntervalRegressor],
    eval_class: pd.Series,
    coverage: float = 0.9,
    progress: Callable[[str], None] | None = None,
) -> LogoResult:
    """Leave-one-GPU-out evaluation (see the module docstring).

    Args:
        X: op-table rows with a ``gpu`` column (catalog ids); the groups.
        y: measured times, ms.
        make_model: builds a fresh unfitted model for each fold.
        eval_class: reporting class of each row (e.g. from :func:`evaluation_class`).
        coverage: nominal coverage of the model's interval.
        progress: called with the held-out GPU before each fold.
    """
    y = np.asarray(y, dtype=float)
    groups = X["gpu"].astype(str).to_numpy()
    parts = []
    for train, test in LeaveOneGroupOut().split(X, y, groups):
        gpu = groups[test[0]]
        if progress is not None:
            progress(gpu)
        X_train, X_test = X.iloc[train], X.iloc[test]
        fold = pd.DataFrame(
            {"gpu": gpu, "eval_class": eval_class.iloc[test].to_numpy(), "measured_ms": y[test]},
            index=X_test.index,
        )
        model = make_model().fit(X_train, y[train])
        with warnings.catch_warnings():  # a held-out GPU is out of domain by construction
            warnings.simplefilter("ignore", OutOfDomainWarning)
            _predict_fold(model, X_test, fold, coverage)
        for name, cls in BASELINES.items():
            fold[name] = cls().fit(X_train, y[train]).predict(X_test)
        parts.append(fold)
    predictions = pd.concat(parts)
    rows = []
    for (gpu, klass), block in predictions.groupby(["gpu", "eval_class"]):
        for name in (MODEL, *BASELINES):
            rows.append({"gpu": gpu, "eval_class": klass, "predictor": name, **_metrics(block, name)})
    return LogoResult(predictions=predictions, table=pd.DataFrame(rows))


def markdown_table(result: LogoResult) -> str:
    """The per-GPU table as Markdown: model beside both baselines, with the interval."""
    wide = result.table.pivot_table(index=["eval_class", "gpu"], columns="predictor", values=["mape", "p90_ape"])
    model = result.table[result.table["predictor"] == MODEL].set_index(["eval_class", "gpu"])
    lines = [
        "| class | held-out GPU | n | model MAPE | roofline MAPE | efficiency MAPE | model p90 | roofline p90 "
        "| coverage | rel. width |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in wide.index:
        m = model.loc[key]
        lines.append(
            f"| {key[0]} | {key[1]} | {int(m['n'])} | {wide.loc[key, ('mape', MODEL)]:.1f} "
            f"| {wide.loc[key, ('mape', 'roofline')]:.1f} | {wide.loc[key, ('mape', 'efficiency')]:.1f} "
            f"| {wide.loc[key, ('p90_ape', MODEL)]:.1f} | {wide.loc[key, ('p90_ape', 'roofline')]:.1f} "
            f"| {100 * m['coverage']:.1f} | {m['rel_width']:.2f} |"
        )
    summary = result.summary()
    lines += ["", "| class | predictor | median MAPE | median p90 APE | median coverage |", "|---|---|---:|---:|---:|"]
    for (klass, name), row in summary.iterrows():
        cov = row.get("coverage", np.nan)
        cov_text = "" if np.isnan(cov) else f"{100 * cov:.1f}"
        lines.append(f"| {klass} | {name} | {row['mape']:.1f} | {row['p90_ape']:.1f} | {cov_text} |")
    return "\n".join(lines)


def spread_pick(x: np.ndarray, k: int, rng: np.random.Generator, *, pool: int = 3000) -> np.ndarray:
    """``k`` row indices of ``x`` (n, d) spread over its space, as a calibration sweep measures them.

    Greedy farthest-point selection from a random first row, over a random pool of at most
    ``pool`` rows (rows with a NaN coordinate are compared on their finite ones).
    """
    cand = rng.choice(len(x), size=min(len(x), pool), replace=False)
    z = np.nan_to_num(x[cand])
    chosen = [int(rng.integers(len(cand)))]
    dist = ((z - z[chosen[0]]) ** 2).sum(axis=1)
    for _ in range(k - 1):
        j = int(np.argmax(dist))
        chosen.append(j)
        dist = np.minimum(dist, ((z - z[j]) ** 2).sum(axis=1))
    return cand[chosen]


def few_shot_curve(
    predictions: pd.DataFrame,
    ops: pd.DataFrame,
    *,
    ks: tuple[int, ...] = (0, 5, 20, 100),
    seeds: int = 5,
    design: str = "spread",
    coverage: float = 0.9,
) -> pd.DataFrame:
    """MAPE on each held-out GPU after a few-shot correction fitted on ``k`` of its ops.

    For every held-out GPU and class, ``k`` of its rows give the GPU's correction
    (:func:`~perfcast.models.calibration.fit_correction` on the log residuals of the model's
    held-out predictions: a shrunk shift plus the shape-dependent residual model), and the
    MAPE is measured on the GPU's other rows. ``design="spread"`` picks the ``k`` ops spread
    over the log dimensions and op kinds (:func:`spread_pick`, as ``perfcast calibrate``
    sweeps shapes),
    ``"random"`` draws them uniformly. Returns one row per (gpu, eval_class, k) with the
    median over ``seeds`` seeded draws of the MAPE (percent) and of the coverage (fraction)
    of the corrected ``coverage`` interval (:meth:`GpuCorrection.correct`: the GPU's measured
    spread from 20 ops on, before that the model's interval scaled along).

    Args:
        predictions: :attr:`LogoResult.predictions`.
        ops: the op-table rows evaluated, indexed like ``predictions``.
    """
    from perfcast.features.ops import op_classes, op_kinds
    from perfcast.models.calibration import fit_correction
    from perfcast.models.correction_fit import log_dims

    if design not in ("spread", "random"):
        raise ValueError(f"design={design!r}; allowed: spread, random")
    rows = []
    for (gpu, klass), block in predictions.groupby(["gpu", "eval_class"]):
        measured, pred = block["measured_ms"].to_numpy(), block[MODEL].to_numpy()
        lo, hi = block[f"{MODEL}_lo"].to_numpy(), block[f"{MODEL}_hi"].to_numpy()
        block_ops = ops.loc[block.index]
        kinds = op_kinds(block_ops)
        # a sweep covers every op kind: kinds sit far apart in the space the picks spread over
        x = np.column_stack([log_dims(block_ops, str(op_classes(kinds[:1])[0])), 10.0 * pd.factorize(kinds)[0]])
        for k in ks:
            if k >= len(block):
                continue
            scores = []
            for seed in range(seeds if k else 1):
                rng = np.random.default_rng(seed)
                pick = spread_pick(x, k, rng) if design == "spread" else rng.choice(len(block), size=k, replace=False)
                rest = np.setdiff1d(np.arange(len(block)), pick)
                out = pred[rest], lo[rest], hi[rest]
                if k:
                    corr = fit_correction(str(gpu), block_ops.iloc[pick], measured[pick], pred[pick])
                    out = corr.correct(block_ops.iloc[rest], *out, coverage=coverage)
                scores.append(summarize(out[0], measured[rest], out[1], out[2]))
            medians = {key: float(np.median([s[key] for s in scores])) for key in ("mape", "coverage")}
            rows.append({"gpu": gpu, "eval_class": klass, "k": k, **medians})
    return pd.DataFrame(rows)
