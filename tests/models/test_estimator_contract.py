"""The scikit-learn estimator contract, checked over every estimator in perfcast.models.

Every class deriving :class:`sklearn.base.BaseEstimator` in a ``perfcast.models`` module
must have a case in :data:`CASES` (a test fails otherwise), built from a tiny synthetic
input. Each case is checked for: ``clone`` and ``get_params``/``set_params``; an
``__init__`` that stores its keyword arguments unchanged and nothing else; ``predict``
before ``fit`` raising sklearn's ``NotFittedError`` (every estimator goes through
``check_is_fitted``); ``fit`` returning ``self``; finite positive times in ms, one per row;
``lo <= pred <= hi`` with intervals that widen with the coverage; a coverage outside
(0, 1) refused with ``SpecError``; and a ``_save_to``/``_load_from`` round trip (the
bundle's hook) that predicts identically.

``sklearn.utils.estimator_checks.check_estimator`` (and ``parametrize_with_checks``) does
not apply: its checks fit on numeric arrays it generates, while these estimators read
op-table or run-feature DataFrames by column name, or lists of step graphs. The
data-free checks of that module (parameters, ``__init__``, ``set_params``) do apply and run
here on every estimator.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sklearn.base import BaseEstimator, clone
from sklearn.exceptions import NotFittedError
from sklearn.utils import estimator_checks as sk_checks

import perfcast.models
from perfcast.errors import SpecError

OPTIONAL_PACKAGES = ("torch", "torch_geometric")
"""Packages some model modules need (the GNN's): their estimators are checked only where those import."""
COVERAGES = (0.5, 0.8, 0.95)
BAD_COVERAGES = (0.0, 1.0, 1.5, -0.1, float("nan"))


@dataclass(frozen=True)
class Case:
    """How to check one estimator: fast hyperparameters and a builder of ``(X, y, fit kwargs)``."""

    params: dict[str, Any]
    data: Callable[[], tuple[Any, np.ndarray, dict[str, Any]]]
    has_uncertainty: bool = True


def _op_data() -> tuple[pd.DataFrame, np.ndarray, dict[str, Any]]:
    from fixtures.make_fixtures import synthetic_op_records

    ops = synthetic_op_records(n_per_gpu=80, seed=3)
    return ops.drop(columns="measured_ms"), ops["measured_ms"].to_numpy(), {}


def _step_data() -> tuple[pd.DataFrame, np.ndarray, dict[str, Any]]:
    from perfcast.features.run_features import RUN_FEATURE_SPEC

    rng = np.random.default_rng(0)
    n = 120
    X = pd.DataFrame(rng.normal(size=(n, len(RUN_FEATURE_SPEC.columns))), columns=list(RUN_FEATURE_SPEC.columns))
    X["tp"] = rng.choice([1.0, 2.0, 4.0, 8.0], size=n)
    X["log_composed_step_ms"] = rng.uniform(2.0, 8.0, size=n)
    y = np.exp(X["log_composed_step_ms"] + 0.4 * np.log2(X["tp"]) + rng.normal(0.0, 0.05, size=n)).to_numpy()
    return X, y, {"groups": rng.integers(0, 4, size=n)}


def _collective_data() -> tuple[pd.DataFrame, np.ndarray, dict[str, Any]]:
    from perfcast.features.collective_features import featurize_collectives

    rng = np.random.default_rng(0)
    sizes = np.logspace(12, 28, 8, base=2).round().astype(int)
    layouts = [("allreduce", 2, 2), ("allreduce", 8, 8), ("allgather", 4, 4), ("sendrecv", 2, 1), ("allreduce", 4, 1)]
    X = pd.DataFrame(
        [
            {"op": op, "bytes": b, "n_ranks": n, "ranks_per_node": rpn, "dtype": "bf16", "gpu": gpu}
            for gpu in ("h100-sxm5-80gb", "a100-sxm4-80gb", "l4")
            for op, n, rpn in layouts
            for b in sizes
        ]
    )
    physics = featurize_collectives(X)["alpha_beta_ms"].to_numpy(dtype=float)
    return X, physics * 1.3 * np.exp(rng.normal(0.0, 0.05, len(X))), {}


def _gnn_data() -> tuple[list, np.ndarray, dict[str, Any]]:
    from perfcast.features.run_config import parse_run_row
    from perfcast.models.gnn import build_step_graph

    rows = [
        {"num_layers": layers, "hidden_size": hidden, "num_heads": 8, "vocab_size": 8192, "seq_len": 256, "tp": tp,
         "dp": dp, "micro_batch": mb, "global_batch": 8 * dp, "gpu": "a100-sxm4-80gb", "num_gpus": tp * dp}
        for layers in (2, 4)
        for hidden in (256, 512)
        for tp, dp in ((1, 2), (2, 1), (2, 2), (1, 4))
        for mb in (1, 2)
    ]  # fmt: skip
    configs = [parse_run_row(r) for r in rows]
    samples = [build_step_graph(c) for c in configs]
    tp = np.array([c.parallel.tp for c in configs])
    rng = np.random.default_rng(0)
    y = np.array([s.composed_ms for s in samples]) * (1.5 + 0.5 * np.log2(tp)) * np.exp(rng.normal(0, 0.05, len(tp)))
    return samples, y, {}


CASES: dict[str, Case] = {
    "perfcast.models.op_model.OpTimeRegressor": Case(
        {"n_estimators": 20, "learning_rate": 0.3, "n_jobs": 1, "max_rows_per_gpu": 200}, _op_data
    ),
    "perfcast.models.step_model.StepTimeRegressor": Case(
        {"n_estimators": 20, "max_depth": 3, "n_calibration_folds": 3, "n_jobs": 1}, _step_data
    ),
    "perfcast.models.collective_model.CollectiveTimeRegressor": Case(
        {"n_estimators": 20, "max_rows_per_group": 100, "n_folds": 3, "n_jobs": 1}, _collective_data
    ),
    "perfcast.models.gnn.StepGNNRegressor": Case(
        {"hidden": 8, "num_layers": 1, "n_members": 2, "epochs": 2, "batch_size": 8, "num_threads": 1}, _gnn_data
    ),
    "perfcast.models.baselines.RooflineBaseline": Case({}, _op_data, has_uncertainty=False),
    "perfcast.models.baselines.EfficiencyBaseline": Case({}, _op_data, has_uncertainty=False),
}
"""Every estimator class, by dotted name, and how to check it."""


def _import(module: str) -> Any:
    """The module, or None when an optional package it needs is missing."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] in OPTIONAL_PACKAGES:
            return None
        raise


def _discover() -> set[str]:
    """Dotted names of the BaseEstimator classes defined in perfcast.models (importable modules)."""
    found = set()
    for info in pkgutil.iter_modules(perfcast.models.__path__, "perfcast.models."):
        module = _import(info.name)
        for _, kls in inspect.getmembers(module, inspect.isclass) if module else ():
            if issubclass(kls, BaseEstimator) and kls.__module__ == info.name:
                found.add(f"{info.name}.{kls.__qualname__}")
    return found


def _load(name: str) -> type:
    module_name, _, qualname = name.rpartition(".")
    module = _import(module_name)
    if module is None:
        pytest.skip(f"{module_name} needs {' and '.join(OPTIONAL_PACKAGES)}, not installed")
    return getattr(module, qualname)


@cache
def _build(data: Callable[[], tuple[Any, np.ndarray, dict[str, Any]]]) -> tuple[Any, np.ndarray, dict[str, Any]]:
    return data()


def _data(name: str) -> tuple[Any, np.ndarray, dict[str, Any]]:
    return _build(CASES[name].data)


@cache
def _fit(name: str) -> tuple[BaseEstimator, BaseEstimator]:
    """(the estimator, what its fit returned), fitted once per session."""
    X, y, kwargs = _data(name)
    est = _load(name)(**CASES[name].params)
    return est, est.fit(X, y, **kwargs)


def _query(name: str) -> Any:
    X = _data(name)[0]
    return X.iloc[::7] if isinstance(X, pd.DataFrame) else X[::3]


NAMES = sorted(CASES)
IDS = [n.rpartition(".")[2] for n in NAMES]


def test_every_estimator_has_a_case():
    assert _discover() <= set(CASES), f"estimators without a contract case: {sorted(_discover() - set(CASES))}"
    missing = {n for n in CASES if _import(n.rpartition(".")[0])} - _discover()
    assert not missing, f"cases naming no estimator: {sorted(missing)}"


@pytest.mark.parametrize("name", NAMES, ids=IDS)
def test_sklearn_data_free_checks(name):
    kls = _load(name)
    short = kls.__name__
    sk_checks.check_parameters_default_constructible(short, kls())
    est = kls(**CASES[name].params)
    sk_checks.check_no_attributes_set_in_init(short, est)
    sk_checks.check_get_params_invariance(short, est)
    sk_checks.check_set_params(short, est)
    sk_checks.check_estimator_cloneable(short, est)


@pytest.mark.parametrize("name", NAMES, ids=IDS)
def test_clone_and_params_round_trip(name):
    kls = _load(name)
    est = kls(**CASES[name].params)
    params = est.get_params()
    assert params == {**kls().get_params(), **CASES[name].params}
    twin = clone(est)
    assert twin is not est and twin.get_params() == params
    assert est.set_params(**params) is est and est.get_params() == params
    fitted, _ = _fit(name)
    unfitted = clone(fitted)
    assert unfitted.get_params() == fitted.get_params()
    assert not [a for a in vars(unfitted) if a.endswith("_") and not a.startswith("__")]


@pytest.mark.parametrize("name", NAMES, ids=IDS)
def test_init_stores_each_argument_unchanged(name):
    kls = _load(name)
    for param in kls().get_params():
        sentinel = object()  # no __init__ that validates or converts could accept this
        assert getattr(kls(**{param: sentinel}), param) is sentinel, param


@pytest.mark.parametrize("name", NAMES, ids=IDS)
def test_predict_before_fit_raises_not_fitted(name):
    est = _load(name)(**CASES[name].params)
    X = _query(name)
    with pytest.raises(NotFittedError):
        est.predict(X)
    with pytest.raises(NotFittedError):
        est.predict_interval(X)


@pytest.mark.parametrize("name", NAMES, ids=IDS)
def test_fit_returns_self(name):
    est, returned = _fit(name)
    assert returned is est


@pytest.mark.parametrize("name", NAMES, ids=IDS)
def test_predict_gives_one_finite_positive_time_per_row(name):
    est, _ = _fit(name)
    X = _query(name)
    pred = est.predict(X)
    assert pred.shape == (len(X),)
    assert np.isfinite(pred).all() and (pred > 0).all()


@pytest.mark.parametrize("name", NAMES, ids=IDS)
def test_interval_holds_the_prediction_and_widens_with_coverage(name):
    est, _ = _fit(name)
    X = _query(name)
    pred = est.predict(X)
    widths = []
    for coverage in COVERAGES:
        interval = est.predict_interval(X, coverage=coverage)
        assert interval.shape == (len(X), 2)
        assert np.isfinite(interval).all()
        assert (interval[:, 0] <= pred).all() and (pred <= interval[:, 1]).all(), coverage
        widths.append(interval[:, 1] - interval[:, 0])
    for narrow, wide in zip(widths, widths[1:], strict=False):
        assert (wide >= narrow).all()
    if CASES[name].has_uncertainty:
        assert widths[-1].sum() > widths[0].sum()


@pytest.mark.parametrize("name", NAMES, ids=IDS)
@pytest.mark.parametrize("coverage", BAD_COVERAGES)
def test_a_coverage_outside_zero_one_is_refused(name, coverage):
    est, _ = _fit(name)
    with pytest.raises(SpecError, match="coverage"):
        est.predict_interval(_query(name), coverage=coverage)


@pytest.mark.parametrize("name", NAMES, ids=IDS)
def test_save_load_round_trip_predicts_identically(name, tmp_path):
    kls = _load(name)
    if not hasattr(kls, "_save_to"):
        pytest.skip(f"{kls.__name__} is an evaluation baseline: it is never saved in a bundle")
    est, _ = _fit(name)
    loaded = kls._load_from(tmp_path, est._save_to(tmp_path))
    assert type(loaded) is kls and loaded.get_params() == est.get_params()
    X = _query(name)
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
    np.testing.assert_array_equal(loaded.predict_interval(X, coverage=0.8), est.predict_interval(X, coverage=0.8))
