"""Step-time GBDT: XGBoost on ``log(measured / composed)`` over run features.

The composed step (op predictions through the pipeline schedule) carries the scaling;
the booster learns what composition misses (launch-bound small GEMMs, collectives below
link rate, framework overhead) as a log ratio (DESIGN.md decision 1):

.. math::

    \\hat t = t_{composed} \\cdot m(x) \\cdot \\exp f(x), \\qquad
    f \\approx \\log(t_{measured} / (t_{composed} \\, m(x)))

``X`` is a run-feature frame (:func:`perfcast.features.run_features.featurize_runs`);
``t_composed = exp(X["log_composed_step_ms"])``. ``m(x)`` is the multiplier of the
physical factors (:mod:`perfcast.models.component_factors`: a time factor per component
of the composed step, ``physical_factors``, fitted first with sources weighed as in the
booster's fit); the booster learns what is left. A factor states how a training stack's
part of the step relates to its kernels, and it extrapolates as the component's share
does. Most apply to every row whole (attention's follows the stack's attention kernels,
whatever the GPU); the components in ``shrink_factors`` (by default ``compute`` where it is
among the factors: the stacks' efficiency on the op table's kernels, learned on the
training GPUs) shrink toward 1 with the row's extrapolation distance ``d`` (below) as the
booster's correction does: ``k ** (1 / (1 + d))``.

By default only ``attention`` gets a factor, pulled toward 1 by ``factor_prior = 0.05``. A
``compute`` factor is one number for every stack: fitted on the training stacks' mix, it
carries their gap to composed physics onto a stack none of whose runs is in training
(held-out splits: ``benchmarks/results/step_transfer_eval.md``). Without it the booster
carries the stacks' gaps through the switches they state, and shrinks them out of domain.
A weaker prior lets the attention factor absorb residuals that are not attention's.
By default (``stack_factors=None``) the attention factor is fitted per training stack; with
``stack_factors`` the listed components' factors are fitted per stack instead. Each
stack's departure from the global factor is shrunk toward it by ``stack_prior``
(:class:`~perfcast.models.component_factors.ComponentFactors`); the stack of a row is
the column :data:`~perfcast.models.component_factors.STACK_COLUMN` of ``X`` (training rows:
their ``framework_group``; a query: the framework it states), and a row without one, or
with a stack no training row had, gets the global factor.

Features: by default every run feature except those that grow with the cluster
(:data:`SCALE_FEATURES`: GPU and node counts, data-parallel degree, global batch,
microbatch count). A tree splits on a threshold and cannot extrapolate: on a cluster
larger than any training run a scale feature puts every such row in the leaf of the
largest training cluster, and a split on it learned among small clusters is a guess
at a larger one. How the step scales with the cluster is the composer's job (its
breakdown fractions are still features); the booster corrects what does not scale.

Out of domain: a row on hardware or a model unlike any training run (a GPU faster than
any seen, a model shape never trained on) gets a correction the trees learned elsewhere.
With ``shrink_out_of_domain`` the correction is shrunk toward the composed step by its
extrapolation distance ``d`` (:meth:`StepTimeRegressor.extrapolation_distance`: per used
descriptor of :data:`DOMAIN_FEATURES`, how far the row lies beyond the training range in
units of that range, at most 1 per descriptor, summed): ``f(x) / (1 + d)``
(``ood_correction="scaled"``) or dropped altogether, leaving the composed step
(``ood_correction="none"``); the interval widens by ``1 + d`` (below). Layout and
breakdown features are not checked: a larger data-parallel group shifts the breakdown
fractions a little past their training range on every scale-up, which is the
extrapolation the composer is there to carry.

Interval: split-conformal at the level of groups. ``fit(X, y, groups=...)`` holds each
group out in turn (at most ``n_calibration_folds`` folds of whole groups), fits a booster
on the other groups and records the held-out log residuals
``r = log(t_measured) - log(\\hat t)`` (with the shrinkage, the normalised score
``r / (1 + d)``, ``d`` measured against the fold's own training rows); the final booster
is then fit on all rows. The
``coverage`` interval is ``\\hat t \\cdot \\exp([q_{(1-c)/2}(r), q_{(1+c)/2}(r)])``, quantiles
of the pooled held-out residuals, each weighted by its row's ``sample_weight`` (so a
small source that the fit weighs like a large one also counts as much in the interval;
with equal weights these are the plain split-conformal quantiles), with the
finite-sample correction ``(n_eff+1)/n_eff`` at the effective sample size
``n_eff = 1/sum(w^2)`` of the normalised weights, so it widens monotonically with
``coverage``; a row at extrapolation distance ``d`` gets the quantiles times ``1 + d``.
Grouping by cluster size makes the residuals those of extrapolating to a
cluster size not seen in training, which is how the model is used; without ``groups``
every row is its own group (plain K-fold).

New hardware and software: a query on a GPU or a software release (an MLPerf round) not
in training faces a larger error than a new cluster size of known hardware: the
correction learned on older releases carries their overhead forward. ``fit(...,
domain_groups=...)`` (e.g. source, GPU type and round) also holds out each domain group
in turn (leave-one-group-out) and keeps those residuals (``domain_residuals_``, same
score, weights and finite-sample rule). ``ood_interval`` picks the quantiles per row:
``"domain"`` (default) takes, per bound, the wider of the cluster-size and the domain
quantiles for rows with ``d > 0``, with no stated software release (below) or with new
software, a combination of the switches of :data:`SOFTWARE_SIGNATURE` (what the stack
overlaps, its attention kernels) no training run had, and the cluster-size ones for the
rest; ``"wider"`` does so for every row, stated releases
included; ``"cluster"`` ignores the domain residuals.
With fewer than 2 domain groups there are no domain residuals and every row uses the
cluster-size ones.

Software releases: a measured run may carry the MLPerf round of its software
(:data:`~perfcast.features.run_features.RELEASE_COLUMN`, NaN for other sources), since the
same step runs faster on newer software. A query states no release: it is taken to run the
newest software the model was fitted on (``latest_release_`` fills its NaN), so a user
planning a run today gets the correction of the newest round rather than an average over
older ones (measured effect: ``benchmarks/results/step_eval.md``). Not knowing the query's
release is itself an uncertainty, so under ``ood_interval="domain"`` such a row's interval
also takes the residuals of held-out (source, GPU, release) groups.

Level per group (``interval_level="group_median"``, the default): the pooled quantiles cover a
``coverage`` share of all held-out residuals, but the errors differ by source: one
heavy-tailed source widens the pooled quantiles for all, so the other sources are covered
well above ``coverage`` (``benchmarks/results/step_interval_eval.md``). With
``fit(..., calibration_groups=...)`` (e.g. each row's source) the quantiles are read instead
at the level ``l`` at which the median over calibration groups of the share of their
held-out residuals inside the interval reaches ``coverage``
(:meth:`StepTimeRegressor.calibrated_level`: the smallest such ``l``, by bisection; the
domain residuals under the bounds of a row with no stated release, or the cluster-size
residuals without domain residuals). Only the training rows' held-out residuals enter, so
the level is as honest as the pooled one. A new source with heavier errors than any
training source is not covered better this way (no training residual shows its errors);
it is covered as before where the training sources are alike, their level then near
``coverage``. ``"group_median_in_domain"`` reads that level only for rows inside the
training range (``d = 0``); a row beyond it keeps the pooled level, its interval already an
extrapolation (times ``1 + d``) of errors the groups did not show.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Self

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from perfcast.data.tables import distinct_rows
from perfcast.errors import BundleError, SpecError
from perfcast.features.run_features import (
    COMPOSED_STEP_COLUMN,
    RELEASE_COLUMN,
    RUN_FEATURE_SPEC,
    RUN_FEATURE_SPEC_VERSION,
    SOFTWARE_FEATURES,
)
from perfcast.models.component_factors import COMPONENTS, ComponentFactors, component_shares, stack_labels
from perfcast.models.intervals import check_coverage, straddle_zero, weighted_conformal_bounds
from perfcast.models.physics_bounds import MFUCeiling

__all__ = [
    "DEFAULT_FEATURES",
    "DOMAIN_FEATURES",
    "INTERVAL_LEVELS",
    "OOD_CORRECTIONS",
    "OOD_INTERVALS",
    "SCALE_FEATURES",
    "SOFTWARE_SIGNATURE",
    "StepTimeRegressor",
]

BOOSTER_FILE = "step_gbdt.ubj"
SCALE_FEATURES: tuple[str, ...] = ("dp", "log2_global_batch", "log2_num_gpus", "num_domains", "log2_num_microbatches")
"""Run features that grow with the cluster; left out of the default feature set (see the module docstring)."""
DEFAULT_FEATURES: tuple[str, ...] = tuple(c for c in RUN_FEATURE_SPEC.columns if c not in SCALE_FEATURES)
"""The columns a :class:`StepTimeRegressor` uses when ``features`` is ``None``."""
DOMAIN_FEATURES: tuple[str, ...] = (
    "peak_tflops", "mem_bw_gbps", "sm_count", "l2_cache_mib", "intra_node_bw_gbps", "inter_node_bw_gbps",
    "log2_hidden", "num_layers", "log2_seq_len", "log10_params", "head_dim", "ffn_ratio", "is_moe", "gated_mlp",
)  # fmt: skip
"""Hardware and model descriptors whose distance beyond the training range shrinks the correction."""
OOD_CORRECTIONS: tuple[str, ...] = ("scaled", "none")
"""Correction of a row at extrapolation distance ``d > 0``: ``f / (1 + d)``, or none (the composed step)."""
OOD_INTERVALS: tuple[str, ...] = ("domain", "wider", "cluster")
"""Which held-out residuals a row's interval uses (see the module docstring)."""
INTERVAL_LEVELS: tuple[str, ...] = ("pooled", "group_median", "group_median_in_domain")
"""How the quantile level of the interval is read: ``coverage`` itself on the pooled residuals; the
level at which the median calibration group's held-out residuals are covered at ``coverage``; or that
level for rows inside the training range (``d = 0``) and ``coverage`` for rows beyond it."""


SOFTWARE_SIGNATURE = (*SOFTWARE_FEATURES, "flash_attention")
"""Run features that together say how a run's stack executes it (what it overlaps, its
attention kernels): a combination no training run had is new software for the interval."""


def _software(X: pd.DataFrame) -> np.ndarray:
    """``(n, k)``: each row's :data:`SOFTWARE_SIGNATURE` columns present in ``X``, NaN as -1."""
    cols = [c for c in SOFTWARE_SIGNATURE if c in X.columns]
    return np.nan_to_num(X.loc[:, cols].to_numpy(dtype=float), nan=-1.0).round(6)


def _ranges(data: np.ndarray) -> np.ndarray:
    """``(2, n_features)``: NaN-aware minimum and maximum of each column (NaN for all-NaN columns)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.vstack([np.nanmin(data, axis=0), np.nanmax(data, axis=0)])


class StepTimeRegressor(RegressorMixin, BaseEstimator):
    """Gradient-boosted correction of the composed step time (see the module docstring).

    Args:
        n_estimators, max_depth, learning_rate, subsample, colsample_bytree,
            min_child_weight, reg_lambda: XGBoost hyperparameters.
        n_calibration_folds: most folds of whole groups for the conformal residuals.
        features: columns of ``X`` to use; ``None`` uses :data:`DEFAULT_FEATURES`
            (the run features without :data:`SCALE_FEATURES`).
        shrink_out_of_domain: shrink the correction of rows outside the training range
            and widen their interval (see the module docstring).
        ood_correction: one of :data:`OOD_CORRECTIONS`, how rows with ``d > 0`` are shrunk.
        ood_interval: one of :data:`OOD_INTERVALS`, where the domain-held-out residuals apply.
        interval_level: one of :data:`INTERVAL_LEVELS` (default ``"group_median"``; the group levels
            need ``calibration_groups`` in ``fit``, without them the level is ``coverage``, as
            ``"pooled"``).
        physical_factors: the components of the composed step (keys of
            :data:`~perfcast.models.component_factors.COMPONENTS`) that get a fitted time
            factor before the booster; empty for none; default ``("attention",)``.
        factor_prior: strength of the pull of each factor toward 1 (see
            :class:`~perfcast.models.component_factors.ComponentFactors`); default 0.05.
        stack_factors: components of ``physical_factors`` whose factor departs per training
            stack (hierarchical fit); empty for one global factor each; None (default):
            attention where it is among ``physical_factors``, its remaining gap following the
            stack's attention kernels.
        stack_prior: strength of the pull of each stack's log departure toward the global
            factor (same units as ``factor_prior``), > 0; default 0.01, weaker than
            ``factor_prior``'s 0.05, so a stack departs from the global factor more freely
            than the global factor departs from 1.
        shrink_factors: components of ``physical_factors`` whose factor shrinks toward 1 with a
            row's extrapolation distance (under ``shrink_out_of_domain``); None (default):
            ``compute`` where it is among ``physical_factors`` (none under the default
            ``physical_factors``); empty: every factor whole.
        correction_scale: factor on every row's learned log correction (the booster's, not
            the physical factors), in [0, 1] (1 = as learned, 0 = the composed step times
            its factors); the held-out residuals are those of the scaled
            predictor, so the interval stays calibrated (how it was chosen:
            ``benchmarks/results/step_transfer_eval.md``).
        random_state: seed of the booster's row and column sampling and the fold split.
        n_jobs: XGBoost threads (step tables are small: one thread avoids OpenMP spin costs on busy machines).

    Attributes:
        booster_: the XGBoost booster fitted on all rows.
        factors_: the :class:`~perfcast.models.component_factors.ComponentFactors` fitted on all rows.
        feature_names_: the columns used, in order.
        residuals_: sorted held-out log residuals (conformal scores).
        residual_weights_: weight of each residual (its row's sample weight), summing to 1.
        domain_residuals_, domain_residual_weights_: the same for held-out domain groups
            (empty without ``domain_groups``).
        residual_groups_, domain_residual_groups_: the calibration group (``calibration_groups``)
            of each residual, in the same order (empty without ``calibration_groups``).
        domain_features_: the used features of :data:`DOMAIN_FEATURES`, in order.
        feature_ranges_: ``(2, len(domain_features_))`` training minimum and maximum of each.
        latest_release_: the newest software release of the training rows (NaN if none
            stated one or the release is not a used feature), given to queries that state none.
        mfu_ceiling_: the :class:`~perfcast.models.physics_bounds.MFUCeiling` given to ``fit``
            (or None); the step predictor raises steps to its floor.
    """

    inputs = "run_features"
    """What ``predict`` takes: a run-feature frame (:func:`~perfcast.features.run_features.featurize_runs`)."""

    def __init__(
        self,
        *,
        n_estimators: int = 300,
        max_depth: int = 4,
        learning_rate: float = 0.05,
        subsample: float = 0.8,
        colsample_bytree: float = 0.8,
        min_child_weight: float = 3.0,
        reg_lambda: float = 1.0,
        n_calibration_folds: int = 5,
        features: tuple[str, ...] | None = None,
        shrink_out_of_domain: bool = True,
        ood_correction: str = "scaled",
        ood_interval: str = "domain",
        interval_level: str = "group_median",
        physical_factors: tuple[str, ...] = ("attention",),
        factor_prior: float = 0.05,
        stack_factors: tuple[str, ...] | None = None,
        stack_prior: float = 0.01,
        shrink_factors: tuple[str, ...] | None = None,
        correction_scale: float = 1.0,
        random_state: int = 0,
        n_jobs: int = 1,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.reg_lambda = reg_lambda
        self.n_calibration_folds = n_calibration_folds
        self.features = features
        self.shrink_out_of_domain = shrink_out_of_domain
        self.ood_correction = ood_correction
        self.ood_interval = ood_interval
        self.interval_level = interval_level
        self.physical_factors = physical_factors
        self.factor_prior = factor_prior
        self.stack_factors = stack_factors
        self.stack_prior = stack_prior
        self.shrink_factors = shrink_factors
        self.correction_scale = correction_scale
        self.random_state = random_state
        self.n_jobs = n_jobs

    # ------------------------------------------------------------------------ fit

    def fit(
        self,
        X: pd.DataFrame,
        y: Any,
        *,
        groups: Any = None,
        domain_groups: Any = None,
        sample_weight: Any = None,
        mfu_ceiling: Any = None,
        calibration_groups: Any = None,
    ) -> Self:
        """Fit the booster on all rows and the conformal residuals on held-out groups.

        Args:
            X: run features (must hold ``log_composed_step_ms`` and the used columns).
            y: measured step times, ms, all > 0.
            groups: group label per row for the held-out calibration folds (e.g. the
                cluster size); ``None`` makes each row its own group.
            domain_groups: optional hardware/software label per row (e.g. source, GPU
                type and release); each is held out in turn for the domain residuals.
            sample_weight: optional non-negative weight per row.
            mfu_ceiling: optional :class:`~perfcast.models.physics_bounds.MFUCeiling` fitted on
                the same runs; kept as ``mfu_ceiling_`` (saved with the model) for the step
                predictor's physics floor. ``None`` leaves the floor at MFU 1.
            calibration_groups: optional label per row (e.g. the source) whose median coverage sets
                the quantile level under ``interval_level="group_median"``; kept with the residuals.

        Raises:
            SpecError: bad shapes, missing columns, non-positive times, fewer than 2 groups.
        """
        if self.n_calibration_folds < 2:
            raise SpecError(f"n_calibration_folds={self.n_calibration_folds} must be >= 2")
        if self.ood_correction not in OOD_CORRECTIONS:
            raise SpecError(f"ood_correction={self.ood_correction!r} unknown; allowed: {', '.join(OOD_CORRECTIONS)}")
        if not 0.0 <= self.correction_scale <= 1.0:
            raise SpecError(f"correction_scale={self.correction_scale!r} must be in [0, 1]")
        if self.ood_interval not in OOD_INTERVALS:
            raise SpecError(f"ood_interval={self.ood_interval!r} unknown; allowed: {', '.join(OOD_INTERVALS)}")
        self._check_interval_level()
        unknown = [c for c in self.physical_factors if c not in COMPONENTS]
        if unknown:
            raise SpecError(f"physical_factors {unknown} unknown; allowed: {', '.join(COMPONENTS)}")
        for name, listed in (("stack_factors", self.stack_factors), ("shrink_factors", self.shrink_factors)):
            stray = [c for c in listed or () if c not in self.physical_factors]
            if stray:
                raise SpecError(f"{name} {stray} are not among physical_factors {list(self.physical_factors)}")
        names = self._feature_names(X)
        target = self._log_ratio(X, y)
        weights = np.ones(len(target)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        if weights.shape != target.shape or (weights < 0).any():
            raise SpecError(f"sample_weight must be {len(target)} non-negative numbers")
        labels = np.arange(len(target)) if groups is None else np.asarray(groups)
        if labels.shape != target.shape:
            raise SpecError(f"groups has {labels.shape[0]} entries for {len(target)} rows")
        unique = np.unique(labels)
        if len(unique) < 2:
            raise SpecError(f"need at least 2 groups for the held-out calibration, got {len(unique)}")
        domains = None if domain_groups is None else np.asarray(domain_groups)
        if domains is not None and domains.shape != target.shape:
            raise SpecError(f"domain_groups has {domains.shape[0]} entries for {len(target)} rows")
        calibration = None if calibration_groups is None else np.asarray(calibration_groups).astype(str)
        if calibration is not None and calibration.shape != target.shape:
            raise SpecError(f"calibration_groups has {calibration.shape[0]} entries for {len(target)} rows")

        def keep(order: np.ndarray) -> np.ndarray:  # the calibration group of each sorted residual
            return np.empty(0, str) if calibration is None else calibration[order]

        data = X.loc[:, names].to_numpy(dtype=float)
        shares = component_shares(X, self.physical_factors)
        stacks = stack_labels(X)
        check = np.isin(names, DOMAIN_FEATURES)
        rng = np.random.default_rng(self.random_state)
        fold_of_group = rng.permutation(len(unique)) % min(self.n_calibration_folds, len(unique))
        folds = fold_of_group[np.searchsorted(unique, labels)]
        self.residuals_, self.residual_weights_, order = self._held_out_scores(
            data, shares, stacks, target, weights, folds, check
        )
        self.residual_groups_ = keep(order)
        self.domain_residuals_, self.domain_residual_weights_ = np.empty(0), np.empty(0)
        self.domain_residual_groups_ = np.empty(0, str)
        if domains is not None and len(np.unique(domains)) >= 2:
            domain_folds = np.searchsorted(np.unique(domains), domains)
            self.domain_residuals_, self.domain_residual_weights_, order = self._held_out_scores(
                data, shares, stacks, target, weights, domain_folds, check
            )
            self.domain_residual_groups_ = keep(order)
        self.feature_names_ = names
        releases = X[RELEASE_COLUMN].to_numpy(dtype=float) if RELEASE_COLUMN in names else np.empty(0)
        self.latest_release_ = float(np.nanmax(releases)) if np.isfinite(releases).any() else float("nan")
        self.software_signatures_ = sorted(set(map(tuple, _software(X).tolist())))
        self.domain_features_ = tuple(names[i] for i in np.flatnonzero(check))
        self.feature_ranges_ = _ranges(data[:, check])
        self.factors_ = self._fit_factors(shares, stacks, target, weights)
        self.booster_ = self._train(data, target - self.factors_.log_scale_of(shares, stacks), weights)
        self.n_features_in_ = len(names)
        self.mfu_ceiling_ = mfu_ceiling
        return self

    def _fit_factors(
        self, shares: np.ndarray, stacks: np.ndarray, target: np.ndarray, weights: np.ndarray
    ) -> ComponentFactors:
        return ComponentFactors.fit(
            shares, target, names=self.physical_factors, weights=weights, prior=self.factor_prior,
            stacks=stacks, stack_components=self._stack_components(), stack_prior=self.stack_prior,
        )  # fmt: skip

    def _check_interval_level(self) -> None:
        if self.interval_level not in INTERVAL_LEVELS:
            raise SpecError(f"interval_level={self.interval_level!r} unknown; allowed: {', '.join(INTERVAL_LEVELS)}")

    def _listed_components(self, listed: tuple[str, ...] | None, default: str) -> tuple[str, ...]:
        """``listed``, or for None the ``default`` component where it is among ``physical_factors``."""
        if listed is None:
            return tuple(c for c in (default,) if c in self.physical_factors)
        return tuple(listed)

    def _stack_components(self) -> tuple[str, ...]:
        """The components fitted per training stack (``stack_factors``, None read as documented)."""
        return self._listed_components(self.stack_factors, "attention")

    def _shrunk_components(self) -> tuple[str, ...]:
        """The components whose factor shrinks with the extrapolation distance (``shrink_factors``,
        None read as documented)."""
        return self._listed_components(self.shrink_factors, "compute")

    def _held_out_scores(
        self,
        data: np.ndarray,
        shares: np.ndarray,
        stacks: np.ndarray,
        target: np.ndarray,
        weights: np.ndarray,
        folds: np.ndarray,
        check: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sorted conformal scores of each fold held out in turn (factors and booster fitted
        without it), their weights (summing to 1) and the row index of each."""
        residuals = np.empty(len(target))
        for k in np.unique(folds):
            held = folds == k
            factors = self._fit_factors(shares[~held], stacks[~held], target[~held], weights[~held])
            train_base = factors.log_scale_of(shares[~held], stacks[~held])
            booster = self._train(data[~held], target[~held] - train_base, weights[~held])
            distance = self._distance(data[held][:, check], _ranges(data[~held][:, check]))
            correction = self._shrink(self._raw(booster, data[held]), distance)
            held_base = factors.log_scale_of(shares[held], stacks[held], distance, self._shrunk_components())
            residuals[held] = (target[held] - held_base - correction) / (1.0 + distance)
        order = np.argsort(residuals, kind="stable")
        total = weights.sum()
        w = weights[order] / total if total > 0 else np.full(len(order), 1.0 / len(order))
        return residuals[order], w, order

    def _shrink(self, raw: np.ndarray, distance: np.ndarray) -> np.ndarray:
        """The log correction of rows at extrapolation ``distance`` (see :data:`OOD_CORRECTIONS`)."""
        if self.ood_correction == "none":
            return self.correction_scale * np.where(distance > 0, 0.0, raw)
        return self.correction_scale * raw / (1.0 + distance)

    def _feature_names(self, X: Any) -> tuple[str, ...]:
        if not isinstance(X, pd.DataFrame):
            raise SpecError(f"X must be a DataFrame of run features, got {type(X).__name__}")
        names = tuple(self.features) if self.features is not None else DEFAULT_FEATURES
        missing = [c for c in (*names, COMPOSED_STEP_COLUMN) if c not in X.columns]
        if missing:
            raise SpecError(f"X lacks run-feature columns {missing}")
        return names

    @staticmethod
    def _log_ratio(X: pd.DataFrame, y: Any) -> np.ndarray:
        true = np.asarray(y, dtype=float).ravel()
        if true.shape != (len(X),):
            raise SpecError(f"y has {true.size} values for {len(X)} rows")
        if not (np.isfinite(true) & (true > 0)).all():
            raise SpecError("measured step times y must be finite and > 0 ms")
        return np.log(true) - X[COMPOSED_STEP_COLUMN].to_numpy(dtype=float)

    def _train(self, data: np.ndarray, target: np.ndarray, weights: np.ndarray) -> Any:
        import xgboost as xgb

        params = {
            "objective": "reg:squarederror",
            "max_depth": self.max_depth,
            "eta": self.learning_rate,
            "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree,
            "min_child_weight": self.min_child_weight,
            "lambda": self.reg_lambda,
            "seed": self.random_state,
            "nthread": self.n_jobs,
        }
        dtrain = xgb.DMatrix(data, label=target, weight=weights)
        return xgb.train(params, dtrain, num_boost_round=self.n_estimators)

    @staticmethod
    def _raw(booster: Any, data: np.ndarray) -> np.ndarray:
        return booster.inplace_predict(data)

    # ------------------------------------------------------------------------ predict

    def _data(self, X: pd.DataFrame) -> np.ndarray:
        check_is_fitted(self, "booster_")
        self._feature_names(X)
        missing = [c for c in self.feature_names_ if c not in X.columns]
        if missing:
            raise SpecError(f"X lacks run-feature columns {missing}")
        data = X.loc[:, list(self.feature_names_)].to_numpy(dtype=float, copy=True)
        if RELEASE_COLUMN in self.feature_names_:  # a query runs the newest software seen
            col = self.feature_names_.index(RELEASE_COLUMN)
            data[:, col] = np.where(np.isnan(data[:, col]), self.latest_release_, data[:, col])
        return data

    def _distance(self, data: np.ndarray, ranges: np.ndarray) -> np.ndarray:
        """Extrapolation distance of each row of ``data`` from ``ranges`` (0 without shrinkage)."""
        if not self.shrink_out_of_domain:
            return np.zeros(len(data))
        lo, hi = ranges
        span = np.where(hi > lo, hi - lo, np.maximum(np.abs(hi), 1.0))
        with np.errstate(invalid="ignore"):
            excess = np.maximum(np.maximum(data - hi, lo - data), 0.0) / span
        return np.minimum(np.nan_to_num(excess, nan=0.0), 1.0).sum(axis=1)

    def extrapolation_distance(self, X: pd.DataFrame) -> np.ndarray:
        """Per row: summed distance beyond the training range of the used :data:`DOMAIN_FEATURES`, each in
        units of its range and at most 1 (0 inside the range, NaN ignored; 0 without ``shrink_out_of_domain``)."""
        return self._distance(X.loc[:, list(self.domain_features_)].to_numpy(dtype=float), self.feature_ranges_)

    def _log_pred(self, X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """``log`` of the median step time, ms, and the extrapolation distance ``d`` per row."""
        data = self._data(X)
        distance = self.extrapolation_distance(X)
        correction = self._shrink(self._raw(self.booster_, data), distance)
        base = self.factors_.log_scale(X, distance, self._shrunk_components())
        return X[COMPOSED_STEP_COLUMN].to_numpy(dtype=float) + base + correction, distance

    def scale_breakdown(self, breakdown: pd.DataFrame, X: pd.DataFrame) -> pd.DataFrame:
        """A copy of ``breakdown`` (``<part>_ms`` columns, one row per row of run features ``X``) with
        each part times its component's factor for the row, as :meth:`predict` applies it (the
        row's stack, the shrunk components at its extrapolation distance)."""
        check_is_fitted(self, "factors_")
        stacks, distance = stack_labels(X), self.extrapolation_distance(X)
        return self.factors_.scale_parts(breakdown, stacks, distance, self._shrunk_components())

    def _new_software(self, X: pd.DataFrame) -> np.ndarray:
        """Rows whose software switches (:data:`SOFTWARE_SIGNATURE`) match no training run's (none
        for a model saved before it kept them)."""
        known = getattr(self, "software_signatures_", None)
        if not known:
            return np.zeros(len(X), dtype=bool)
        rows = _software(X)
        inverse, first = distinct_rows(list(rows.T))
        seen = {tuple(sig) for sig in known}
        return np.array([tuple(rows[i].tolist()) not in seen for i in first], dtype=bool)[inverse]

    def _unstated_release(self, X: pd.DataFrame) -> np.ndarray:
        """Rows that state no software release although the model learned from releases."""
        if RELEASE_COLUMN not in self.feature_names_ or np.isnan(self.latest_release_):
            return np.zeros(len(X), dtype=bool)
        return X[RELEASE_COLUMN].isna().to_numpy()

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Median step time, ms."""
        return np.exp(self._log_pred(X)[0])

    def _uses_domain(self) -> bool:
        return bool(len(self.domain_residuals_)) and self.ood_interval != "cluster"

    def _quantiles(self, level: float) -> tuple[tuple[float, float], tuple[float, float] | None]:
        """Cluster-size and (if used) domain log quantiles at quantile ``level``, straddling 0."""
        cluster = straddle_zero(*weighted_conformal_bounds(self.residuals_, self.residual_weights_, level))
        if not self._uses_domain():
            return cluster, None
        return cluster, straddle_zero(
            *weighted_conformal_bounds(self.domain_residuals_, self.domain_residual_weights_, level)
        )

    def calibrated_level(self, coverage: float = 0.9) -> float:
        """The quantile level the ``coverage`` interval is read at (see the module docstring).

        ``coverage`` under ``interval_level="pooled"`` or without calibration groups; else the
        smallest level (bisection, to 1e-4) at which the median over calibration groups of the
        share of their held-out residuals (domain ones if used) inside the widest bounds a row
        can get reaches ``coverage``.
        """
        check_coverage(coverage)
        self._check_interval_level()  # also when set after fit
        domain = self._uses_domain()
        groups = getattr(self, "domain_residual_groups_" if domain else "residual_groups_", np.empty(0))
        if self.interval_level == "pooled" or len(groups) == 0:
            return coverage
        scores = self.domain_residuals_ if domain else self.residuals_
        labels = np.unique(groups, return_inverse=True)[1]

        def median_coverage(level: float) -> float:
            (c_lo, c_hi), dom = self._quantiles(level)
            lo, hi = (c_lo, c_hi) if dom is None else (min(c_lo, dom[0]), max(c_hi, dom[1]))
            inside = (scores >= lo) & (scores <= hi)
            return float(np.median(np.bincount(labels, weights=inside) / np.bincount(labels)))

        lo, hi = 0.0, 1.0 - 1e-9  # at the top every residual lies inside: coverage 1 for every group
        while hi - lo > 1e-4:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if median_coverage(mid) < coverage else (lo, mid)
        return hi

    def _log_bounds(self, X: pd.DataFrame, distance: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the log quantiles (before the ``1 + d`` scale) at quantile ``level``."""
        (c_lo, c_hi), domain = self._quantiles(level)
        lo_q, hi_q = np.full(len(distance), c_lo), np.full(len(distance), c_hi)
        if domain is not None:
            d_lo, d_hi = domain
            if self.ood_interval == "wider":
                rows = np.ones(len(distance), dtype=bool)
            else:
                rows = (distance > 0) | self._unstated_release(X) | self._new_software(X)
            lo_q[rows], hi_q[rows] = np.minimum(lo_q[rows], d_lo), np.maximum(hi_q[rows], d_hi)
        return lo_q, hi_q

    def predict_interval(self, X: pd.DataFrame, *, coverage: float = 0.9) -> np.ndarray:
        """``(n, 2)`` lower and upper bounds of the ``coverage`` interval, ms."""
        check_coverage(coverage)
        log_pred, distance = self._log_pred(X)
        level = self.calibrated_level(coverage)
        lo_q, hi_q = self._log_bounds(X, distance, level)
        beyond = distance > 0
        if self.interval_level == "group_median_in_domain" and level != coverage and beyond.any():
            p_lo, p_hi = self._log_bounds(X, distance, coverage)  # rows beyond the training range: pooled level
            lo_q[beyond], hi_q[beyond] = p_lo[beyond], p_hi[beyond]
        scale = 1.0 + distance
        return np.column_stack([np.exp(log_pred + lo_q * scale), np.exp(log_pred + hi_q * scale)])

    # ------------------------------------------------------------------------ persistence

    def _save_to(self, directory: str | Path) -> dict[str, Any]:
        """Write ``step_gbdt.ubj`` into ``directory``; return the JSON-able rest."""
        check_is_fitted(self, "booster_")
        self.booster_.save_model(str(Path(directory) / BOOSTER_FILE))
        params = self.get_params()
        params["features"] = list(params["features"]) if params["features"] is not None else None
        params["physical_factors"] = list(params["physical_factors"])
        params["stack_factors"] = None if params["stack_factors"] is None else list(params["stack_factors"])
        params["shrink_factors"] = None if params["shrink_factors"] is None else list(params["shrink_factors"])
        return {
            "params": params,
            "run_feature_spec_version": RUN_FEATURE_SPEC_VERSION,
            "feature_names": list(self.feature_names_),
            "residuals": self.residuals_.tolist(),
            "residual_weights": self.residual_weights_.tolist(),
            "domain_residuals": self.domain_residuals_.tolist(),
            "domain_residual_weights": self.domain_residual_weights_.tolist(),
            "residual_groups": [str(g) for g in getattr(self, "residual_groups_", [])],
            "domain_residual_groups": [str(g) for g in getattr(self, "domain_residual_groups_", [])],
            "domain_features": list(self.domain_features_),
            "feature_ranges": [[None if np.isnan(v) else float(v) for v in row] for row in self.feature_ranges_],
            "latest_release": None if np.isnan(self.latest_release_) else self.latest_release_,
            "software_signatures": [list(sig) for sig in getattr(self, "software_signatures_", [])],
            "mfu_ceiling": None if getattr(self, "mfu_ceiling_", None) is None else self.mfu_ceiling_.to_dict(),
            "factors": self.factors_.to_dict(),
            "booster_file": BOOSTER_FILE,
        }

    @classmethod
    def _load_from(cls, directory: str | Path, meta: dict[str, Any]) -> StepTimeRegressor:
        """Rebuild a fitted model from :meth:`_save_to`'s file and dict."""
        import xgboost as xgb

        path = Path(directory)
        try:
            if int(meta["run_feature_spec_version"]) != RUN_FEATURE_SPEC_VERSION:
                raise BundleError(
                    f"step model was saved with run FeatureSpec version {meta['run_feature_spec_version']}; "
                    f"this perfcast has version {RUN_FEATURE_SPEC_VERSION}"
                )
            params = dict(meta["params"])
            if params.get("features") is not None:
                params["features"] = tuple(params["features"])
            params["physical_factors"] = tuple(params["physical_factors"])
            stack = params.get("stack_factors", ())  # bundles written before stacks: one global factor
            params["stack_factors"] = None if stack is None else tuple(stack)
            shrink = params.get("shrink_factors", ())  # bundles written before: every factor whole
            params["shrink_factors"] = None if shrink is None else tuple(shrink)
            model = cls(**params)
            model.feature_names_ = tuple(meta["feature_names"])
            model.residuals_ = np.asarray(meta["residuals"], dtype=float)
            # bundles saved before weighted residuals and ranges: equal weights, no range (never shrunk)
            weights = meta.get("residual_weights")
            model.residual_weights_ = (
                np.full(len(model.residuals_), 1.0 / len(model.residuals_))
                if weights is None
                else np.asarray(weights, dtype=float)
            )
            # bundles saved before domain residuals: none (every row uses the cluster-size residuals)
            model.domain_residuals_ = np.asarray(meta.get("domain_residuals", []), dtype=float)
            model.domain_residual_weights_ = np.asarray(meta.get("domain_residual_weights", []), dtype=float)
            if model.domain_residuals_.shape != model.domain_residual_weights_.shape:
                raise ValueError("domain_residuals and domain_residual_weights differ in length")
            # bundles saved before calibration groups: none (the level is the coverage)
            model.residual_groups_ = np.asarray(meta.get("residual_groups", []), dtype=str)
            model.domain_residual_groups_ = np.asarray(meta.get("domain_residual_groups", []), dtype=str)
            if len(model.residual_groups_) not in (0, len(model.residuals_)) or len(
                model.domain_residual_groups_
            ) not in (0, len(model.domain_residuals_)):
                raise ValueError("residual groups and residuals differ in length")
            model.domain_features_ = tuple(meta.get("domain_features", ()))
            n = len(model.domain_features_)
            model.feature_ranges_ = np.array(meta.get("feature_ranges", [[], []]), dtype=float).reshape(2, n)
            latest = meta.get("latest_release")
            model.latest_release_ = float("nan") if latest is None else float(latest)
            # bundles saved before software signatures: none (no row counts as new software)
            model.software_signatures_ = [tuple(map(float, sig)) for sig in meta.get("software_signatures", [])]
            # bundles saved before the physics floor: none (the predictor bounds MFU by 1)
            ceiling = meta.get("mfu_ceiling")
            model.mfu_ceiling_ = None if ceiling is None else MFUCeiling.from_dict(ceiling)
            model.factors_ = ComponentFactors.from_dict(meta["factors"])
            file = path / meta["booster_file"]
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"step model metadata in {path} is malformed: {exc!r}") from None
        if not file.is_file():
            raise BundleError(f"bundle file {file} is missing")
        booster = xgb.Booster()
        booster.load_model(str(file))
        booster.set_param({"nthread": model.n_jobs})
        model.booster_ = booster
        model.n_features_in_ = len(model.feature_names_)
        return model
