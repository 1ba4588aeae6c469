"""Tests of the step-time GBDT: estimator contract, learning, intervals and persistence."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.exceptions import NotFittedError

from perfcast.errors import BundleError, SpecError
from perfcast.features.run_features import RELEASE_COLUMN, RUN_FEATURE_SPEC
from perfcast.models.step_model import DEFAULT_FEATURES, SCALE_FEATURES, SOFTWARE_SIGNATURE, StepTimeRegressor
from perfcast.training.metrics import mape

SMALL = {"n_estimators": 60, "max_depth": 3, "n_jobs": 1}


def _data(n=300, seed=0):
    """Random run features; measured = composed * exp(0.4 * tp-ish feature + noise)."""
    rng = np.random.default_rng(seed)
    X = pd.DataFrame(rng.normal(size=(n, len(RUN_FEATURE_SPEC.columns))), columns=list(RUN_FEATURE_SPEC.columns))
    X["tp"] = rng.choice([1.0, 2.0, 4.0, 8.0], size=n)
    X["log_composed_step_ms"] = rng.uniform(2.0, 8.0, size=n)
    y = np.exp(X["log_composed_step_ms"] + 0.4 * np.log2(X["tp"]) + rng.normal(0.0, 0.03, size=n))
    groups = rng.integers(0, 4, size=n)
    return X, y.to_numpy(), groups


@pytest.fixture(scope="module")
def fitted():
    X, y, groups = _data()
    return StepTimeRegressor(**SMALL).fit(X, y, groups=groups), X, y


def test_fit_returns_self_and_learns_the_ratio(fitted):
    model, X, y = fitted
    X2, y2, g2 = _data(seed=1)
    fresh = StepTimeRegressor(**SMALL)
    assert fresh.fit(X2, y2, groups=g2) is fresh
    composed = np.exp(X["log_composed_step_ms"])
    assert mape(model.predict(X), y) < 0.2 * mape(composed, y)


def test_predict_before_fit_raises():
    X, _, _ = _data(n=10)
    with pytest.raises(NotFittedError):
        StepTimeRegressor().predict(X)
    with pytest.raises(NotFittedError):
        StepTimeRegressor().predict_interval(X)


def test_shapes_and_interval_order(fitted):
    model, X, _ = fitted
    pred = model.predict(X)
    interval = model.predict_interval(X, coverage=0.9)
    assert pred.shape == (len(X),) and interval.shape == (len(X), 2)
    assert (interval[:, 0] <= pred).all() and (pred <= interval[:, 1]).all()


def test_interval_widens_with_coverage_and_covers_held_out_rows(fitted):
    model, _, _ = fitted
    X, y, _ = _data(n=400, seed=2)
    widths = [np.diff(model.predict_interval(X, coverage=c), axis=1).ravel() for c in (0.5, 0.8, 0.9, 0.99)]
    for narrow, wide in zip(widths, widths[1:], strict=False):
        assert (narrow <= wide + 1e-12).all()
    lo, hi = model.predict_interval(X, coverage=0.9).T
    assert 0.8 <= np.mean((lo <= y) & (y <= hi)) <= 1.0


def test_save_load_round_trip(fitted, tmp_path):
    model, X, _ = fitted
    meta = model._save_to(tmp_path)
    loaded = StepTimeRegressor._load_from(tmp_path, meta)
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    np.testing.assert_array_equal(loaded.predict_interval(X, coverage=0.8), model.predict_interval(X, coverage=0.8))
    assert loaded.get_params() == model.get_params()
    with pytest.raises(BundleError, match="version"):
        StepTimeRegressor._load_from(tmp_path, {**meta, "run_feature_spec_version": -1})
    (tmp_path / meta["booster_file"]).unlink()
    with pytest.raises(BundleError, match="missing"):
        StepTimeRegressor._load_from(tmp_path, meta)


def test_feature_subset_is_used_by_name(fitted):
    _, X, y = fitted
    names = ("tp", "log2_hidden")
    model = StepTimeRegressor(features=names, **SMALL).fit(X, y)
    assert model.feature_names_ == names
    shuffled = X[list(reversed(X.columns))]
    np.testing.assert_array_equal(model.predict(shuffled), model.predict(X))


def test_bad_inputs_are_refused():
    X, y, groups = _data(n=40)
    with pytest.raises(SpecError, match="DataFrame"):
        StepTimeRegressor(**SMALL).fit(X.to_numpy(), y)
    with pytest.raises(SpecError, match="lacks"):
        StepTimeRegressor(**SMALL).fit(X.drop(columns="tp"), y)
    with pytest.raises(SpecError, match="> 0"):
        StepTimeRegressor(**SMALL).fit(X, -y)
    with pytest.raises(SpecError, match="2 groups"):
        StepTimeRegressor(**SMALL).fit(X, y, groups=np.zeros(len(y)))
    with pytest.raises(SpecError, match="coverage"):
        StepTimeRegressor(**SMALL).fit(X, y, groups=groups).predict_interval(X, coverage=1.0)


def test_default_features_leave_out_the_cluster_scale(fitted):
    model, _, _ = fitted
    assert model.feature_names_ == DEFAULT_FEATURES
    assert not set(SCALE_FEATURES) & set(DEFAULT_FEATURES)
    assert set(SCALE_FEATURES) | set(DEFAULT_FEATURES) == set(RUN_FEATURE_SPEC.columns)


def test_interval_weighs_residuals_like_the_fit():
    """A small noisy source weighted like a large clean one widens the interval; unweighted it hardly counts."""
    X, y, groups = _data(n=400, seed=3)
    noisy = np.arange(len(y)) < 40
    y = y * np.exp(np.where(noisy, np.random.default_rng(4).normal(0.0, 0.3, len(y)), 0.0))
    weights = np.where(noisy, len(y) / (2 * noisy.sum()), len(y) / (2 * (~noisy).sum()))
    plain = StepTimeRegressor(**SMALL).fit(X, y, groups=groups)
    balanced = StepTimeRegressor(**SMALL).fit(X, y, groups=groups, sample_weight=weights)
    assert balanced.residual_weights_.sum() == pytest.approx(1.0)
    width = {name: np.diff(m.predict_interval(X[:5]), axis=1).mean() for name, m in (("p", plain), ("b", balanced))}
    assert width["b"] > 1.5 * width["p"]


@pytest.fixture(scope="module")
def two_domains():
    """Rows on two 'hardware' domains (peak_tflops sign) whose measured/composed ratio differs by exp(0.3)."""
    X, y, groups = _data(n=300, seed=5)
    domain = (X["peak_tflops"] > 0).to_numpy()
    y = y * np.exp(0.3 * domain)
    inside = X.iloc[:20].copy()
    outside = inside.assign(peak_tflops=X["peak_tflops"].max() + 10.0)  # one range beyond: d >= 1
    return X, y, groups, domain, inside, outside


def test_domain_residuals_widen_the_interval_of_rows_off_the_training_range(two_domains):
    X, y, groups, domain, inside, outside = two_domains
    model = StepTimeRegressor(**SMALL).fit(X, y, groups=groups, domain_groups=domain)
    assert len(model.domain_residuals_) == len(y) and model.domain_residual_weights_.sum() == pytest.approx(1.0)
    assert (model.extrapolation_distance(inside) == 0).all() and (model.extrapolation_distance(outside) >= 1).all()
    width = {}
    for rule in ("cluster", "domain", "wider"):
        model.set_params(ood_interval=rule)
        width[rule] = {name: np.diff(model.predict_interval(rows), axis=1).ravel() for name, rows in
                       (("in", inside), ("out", outside))}  # fmt: skip
    np.testing.assert_array_equal(width["domain"]["in"], width["cluster"]["in"])
    assert (width["domain"]["out"] > width["cluster"]["out"]).all()
    assert (width["wider"]["in"] > width["cluster"]["in"]).all()
    np.testing.assert_array_equal(width["wider"]["out"], width["domain"]["out"])


def test_fewer_than_two_domains_leave_every_row_on_the_cluster_residuals(two_domains):
    X, y, groups, _, _, outside = two_domains
    model = StepTimeRegressor(**SMALL).fit(X, y, groups=groups, domain_groups=np.zeros(len(y)))
    assert len(model.domain_residuals_) == 0
    cluster = model.predict_interval(outside)
    np.testing.assert_array_equal(model.set_params(ood_interval="wider").predict_interval(outside), cluster)


def test_no_correction_off_the_training_range_returns_the_composed_step(two_domains):
    X, y, groups, domain, inside, outside = two_domains
    scaled = StepTimeRegressor(**SMALL).fit(X, y, groups=groups, domain_groups=domain)
    none = StepTimeRegressor(ood_correction="none", **SMALL).fit(X, y, groups=groups, domain_groups=domain)
    factors = none.factors_.log_scale(outside, none.extrapolation_distance(outside), none._shrunk_components())
    physics = np.exp(outside["log_composed_step_ms"] + factors)  # the factored composed step
    np.testing.assert_allclose(none.predict(outside), physics)
    assert not np.allclose(scaled.predict(outside), physics)
    np.testing.assert_array_equal(none.predict(inside), scaled.predict(inside))


def test_bundles_saved_without_domain_residuals_still_load(two_domains, tmp_path):
    X, y, groups, domain, _, outside = two_domains
    model = StepTimeRegressor(**SMALL).fit(X, y, groups=groups, domain_groups=domain)
    meta = model._save_to(tmp_path)
    loaded = StepTimeRegressor._load_from(tmp_path, meta)
    np.testing.assert_array_equal(loaded.predict_interval(outside), model.predict_interval(outside))
    old = {k: v for k, v in meta.items() if not k.startswith("domain_residual")}
    old["params"] = {k: v for k, v in meta["params"].items() if not k.startswith("ood_")}
    legacy = StepTimeRegressor._load_from(tmp_path, old)
    assert len(legacy.domain_residuals_) == 0
    expected = model.set_params(ood_interval="cluster").predict_interval(outside)
    np.testing.assert_array_equal(legacy.predict_interval(outside), expected)
    with pytest.raises(BundleError, match="malformed"):
        StepTimeRegressor._load_from(tmp_path, {**meta, "domain_residual_weights": [1.0]})


def test_bad_out_of_domain_settings_are_refused():
    X, y, groups = _data(n=40)
    with pytest.raises(SpecError, match="ood_correction"):
        StepTimeRegressor(ood_correction="half", **SMALL).fit(X, y)
    with pytest.raises(SpecError, match="ood_interval"):
        StepTimeRegressor(ood_interval="all", **SMALL).fit(X, y)
    with pytest.raises(SpecError, match="domain_groups"):
        StepTimeRegressor(**SMALL).fit(X, y, groups=groups, domain_groups=np.zeros(3))


def test_a_query_without_a_release_gets_the_newest_release_seen(tmp_path):
    """Older software ran slower (ratio 1.3 on release 3.0, 1.0 on 4.1): an unstated release is the newest."""
    rng = np.random.default_rng(5)
    X, _, groups = _data(n=400, seed=5)
    X[RELEASE_COLUMN] = rng.choice([3.0, 3.1, 4.1], size=len(X))
    slow = np.where(X[RELEASE_COLUMN] < 4.0, np.log(1.3), 0.0)
    y = np.exp(X["log_composed_step_ms"] + slow + rng.normal(0.0, 0.02, size=len(X))).to_numpy()
    model = StepTimeRegressor(**SMALL).fit(X, y, groups=groups)
    assert model.latest_release_ == 4.1
    query = X.assign(**{RELEASE_COLUMN: np.nan})
    ratio = model.predict(query) / np.exp(query["log_composed_step_ms"])
    assert np.median(ratio) == pytest.approx(1.0, abs=0.05)  # not the 1.2 an average over releases gives
    stated = model.predict(X.assign(**{RELEASE_COLUMN: 3.0})) / np.exp(X["log_composed_step_ms"])
    assert np.median(stated) == pytest.approx(1.3, abs=0.05)
    meta = model._save_to(tmp_path)
    np.testing.assert_allclose(StepTimeRegressor._load_from(tmp_path, meta).predict(query), model.predict(query))


def test_a_query_without_a_release_takes_the_held_out_release_residuals_in_its_interval():
    rng = np.random.default_rng(6)
    X, _, groups = _data(n=400, seed=6)
    X[RELEASE_COLUMN] = rng.choice([3.0, 3.1, 4.1], size=len(X))
    slow = np.where(X[RELEASE_COLUMN] < 4.0, np.log(1.3), 0.0)
    y = np.exp(X["log_composed_step_ms"] + slow + rng.normal(0.0, 0.02, size=len(X))).to_numpy()
    model = StepTimeRegressor(**SMALL).fit(X, y, groups=groups, domain_groups=X[RELEASE_COLUMN].to_numpy())
    stated, unstated = X.iloc[:10], X.iloc[:10].assign(**{RELEASE_COLUMN: np.nan})
    width = {k: np.diff(np.log(model.predict_interval(v)), axis=1).mean() for k, v in (("s", stated), ("u", unstated))}
    assert width["u"] > 2 * width["s"]  # a held-out release is off by up to log(1.3); a known one by noise


def test_mfu_ceiling_saved_and_correction_scale(tmp_path):
    from perfcast.models.physics_bounds import MFUCeiling

    X, y, _ = _data()
    ceiling = MFUCeiling()
    ceiling.best_ = {("hopper", "tensor"): 0.45}
    model = StepTimeRegressor(n_estimators=20, correction_scale=0.5).fit(X, y, mfu_ceiling=ceiling)
    loaded = StepTimeRegressor._load_from(tmp_path, model._save_to(tmp_path))
    assert loaded.mfu_ceiling_.best_ == ceiling.best_ and loaded.correction_scale == 0.5
    full = StepTimeRegressor(n_estimators=20).fit(X, y)
    composed = np.exp(X["log_composed_step_ms"].to_numpy())
    factored = composed * np.exp(model.factors_.log_scale(X))  # the scale shrinks the booster's part only
    np.testing.assert_allclose(factored, composed * np.exp(full.factors_.log_scale(X)))
    half, whole = np.log(model.predict(X) / factored), np.log(full.predict(X) / factored)
    np.testing.assert_allclose(half, 0.5 * whole, rtol=1e-5, atol=1e-9)
    legacy = StepTimeRegressor._load_from(tmp_path, {**full._save_to(tmp_path), "mfu_ceiling": None})
    assert legacy.mfu_ceiling_ is None
    with pytest.raises(SpecError):
        StepTimeRegressor(correction_scale=1.5).fit(X, y)


def test_per_stack_attention_factor_is_fitted_saved_and_read_from_the_stack_column(tmp_path):
    from perfcast.models.component_factors import STACK_COLUMN

    X, _, _ = _data()
    rng = np.random.default_rng(3)
    X["frac_attention"] = rng.uniform(0.1, 0.6, len(X))
    stacks = np.array(["megatron-core", "torchtitan"] * (len(X) // 2), dtype=object)
    k = np.where(stacks == "torchtitan", 1.8, 1.0)
    y = np.exp(X["log_composed_step_ms"] + np.log1p(X["frac_attention"] * (k - 1)))
    model = StepTimeRegressor(
        n_estimators=20, physical_factors=("attention",), stack_factors=("attention",), stack_prior=1e-4
    )
    model.fit(X.assign(**{STACK_COLUMN: stacks}), y.to_numpy())
    by_stack = model.factors_.by_stack
    assert by_stack["torchtitan"]["attention"] > 1.6 and by_stack["megatron-core"]["attention"] < 1.1
    loaded = StepTimeRegressor._load_from(tmp_path, model._save_to(tmp_path))
    assert loaded.stack_factors == ("attention",) and loaded.factors_ == model.factors_
    query = X.head(2).assign(**{STACK_COLUMN: ["torchtitan", None]})
    scale = loaded.factors_.log_scale(query)
    k_query = np.array([by_stack["torchtitan"]["attention"], model.factors_.factors["attention"]])
    np.testing.assert_allclose(scale, np.log1p(query["frac_attention"].to_numpy() * (k_query - 1)))
    np.testing.assert_allclose(model.predict(query), loaded.predict(query))
    with pytest.raises(SpecError, match="stack_factors"):
        StepTimeRegressor(stack_factors=("communication",)).fit(X, y.to_numpy())


def test_the_compute_factor_shrinks_toward_one_beyond_the_training_range(tmp_path):
    X, _, groups = _data()
    rng = np.random.default_rng(5)
    X["frac_compute"], X["frac_attention"] = rng.uniform(0.5, 0.9, len(X)), 0.1
    X["frac_bubble"] = X["frac_optimizer"] = 0.0
    y = np.exp(X["log_composed_step_ms"] + np.log1p(X["frac_compute"] * 0.3))  # compute 1.3x slower than composed
    model = StepTimeRegressor(n_estimators=20, physical_factors=("attention", "compute")).fit(
        X, y.to_numpy(), groups=groups
    )
    k = model.factors_.factors["compute"]
    assert k > 1.2 and model._shrunk_components() == ("compute",)
    inside = X.head(3)
    beyond = inside.assign(peak_tflops=X["peak_tflops"].max() + (X["peak_tflops"].max() - X["peak_tflops"].min()))
    d = model.extrapolation_distance(beyond)
    assert (d == pytest.approx(1.0)) and (model.extrapolation_distance(inside) == 0).all()
    shares = inside[["frac_compute", "frac_attention"]].to_numpy()
    whole = np.log1p(shares[:, 0] * (k - 1) + shares[:, 1] * (model.factors_.factors["attention"] - 1))
    halved = np.log1p(shares[:, 0] * (k**0.5 - 1) + shares[:, 1] * (model.factors_.factors["attention"] - 1))
    np.testing.assert_allclose(model.factors_.log_scale(inside, np.zeros(3), ("compute",)), whole)
    np.testing.assert_allclose(model.factors_.log_scale(beyond, d, ("compute",)), halved)
    parts = pd.DataFrame({"compute_ms": [10.0] * 3, "attention_ms": [1.0] * 3})
    assert model.scale_breakdown(parts, beyond)["compute_ms"].tolist() == pytest.approx([10.0 * k**0.5] * 3)
    assert model.scale_breakdown(parts, inside)["compute_ms"].tolist() == pytest.approx([10.0 * k] * 3)
    loaded = StepTimeRegressor._load_from(tmp_path, model._save_to(tmp_path))
    np.testing.assert_allclose(loaded.predict(beyond), model.predict(beyond))
    meta = model._save_to(tmp_path)
    del meta["params"]["shrink_factors"]  # a bundle written before the switch keeps every factor whole
    assert StepTimeRegressor._load_from(tmp_path, meta)._shrunk_components() == ()
    with pytest.raises(SpecError, match="shrink_factors"):
        StepTimeRegressor(physical_factors=("attention",), shrink_factors=("compute",)).fit(X, y.to_numpy())


def test_no_physical_factors_means_no_stack_factors_either():
    X, y, groups = _data(120)
    model = StepTimeRegressor(n_estimators=10, physical_factors=()).fit(X, y, groups=groups)
    assert model.factors_.factors == {} and model.factors_.by_stack == {}


@pytest.fixture(scope="module")
def heavy_tail():
    """Four calibration groups ('sources'): three with small errors, one with errors 10x larger."""
    X, y, groups = _data(n=400, seed=7)
    source = np.arange(len(y)) % 4
    noise = np.random.default_rng(8).normal(0.0, np.where(source == 3, 0.5, 0.05))
    y = y * np.exp(noise)
    weights = np.full(len(y), 1.0)
    return X, y, groups, source, weights


def test_group_median_level_covers_the_median_group_at_the_coverage(heavy_tail, tmp_path):
    X, y, groups, source, weights = heavy_tail
    domains = source * 10 + groups
    model = StepTimeRegressor(**SMALL).fit(
        X, y, groups=groups, domain_groups=domains, sample_weight=weights, calibration_groups=source
    )
    assert model.domain_residual_groups_.shape == model.domain_residuals_.shape
    assert model.set_params(interval_level="pooled").calibrated_level(0.9) == 0.9
    model.set_params(interval_level="group_median")  # the default
    level = model.calibrated_level(0.9)
    assert 0.5 < level < 0.9  # the heavy group widens the pooled quantiles: the median group needs less
    (c_lo, c_hi), (d_lo, d_hi) = model._quantiles(level)
    lo, hi = min(c_lo, d_lo), max(c_hi, d_hi)
    r, g = model.domain_residuals_, model.domain_residual_groups_
    assert np.median([np.mean((r[g == k] >= lo) & (r[g == k] <= hi)) for k in np.unique(g)]) >= 0.9
    narrow = np.diff(model.predict_interval(X[:20]), axis=1)
    wide = np.diff(model.set_params(interval_level="pooled").predict_interval(X[:20]), axis=1)
    assert (narrow < wide).all()
    model.set_params(interval_level="group_median")
    loaded = StepTimeRegressor._load_from(tmp_path, model._save_to(tmp_path))
    np.testing.assert_array_equal(loaded.predict_interval(X[:20]), model.predict_interval(X[:20]))
    with pytest.raises(SpecError, match="interval_level='group-median' unknown"):
        loaded.set_params(interval_level="group-median").predict_interval(X[:20])


def test_group_median_in_domain_keeps_the_pooled_level_beyond_the_training_range(heavy_tail):
    X, y, groups, source, weights = heavy_tail
    model = StepTimeRegressor(interval_level="group_median_in_domain", **SMALL).fit(
        X, y, groups=groups, domain_groups=source * 10 + groups, calibration_groups=source
    )
    inside = X.iloc[:10].copy()
    outside = inside.assign(peak_tflops=X["peak_tflops"].max() + 10.0)
    in_domain = model.predict_interval(inside)
    np.testing.assert_array_equal(in_domain, model.set_params(interval_level="group_median").predict_interval(inside))
    pooled = model.set_params(interval_level="pooled").predict_interval(outside)
    np.testing.assert_array_equal(model.set_params(interval_level="group_median_in_domain").predict_interval(outside),
                                  pooled)  # fmt: skip


def test_without_calibration_groups_the_level_is_the_coverage(heavy_tail, tmp_path):
    X, y, groups, source, _ = heavy_tail
    model = StepTimeRegressor(interval_level="group_median", **SMALL).fit(X, y, groups=groups)
    assert model.calibrated_level(0.8) == 0.8 and len(model.residual_groups_) == 0
    grouped = StepTimeRegressor(**SMALL).fit(X, y, groups=groups, calibration_groups=source)
    meta = grouped._save_to(tmp_path)
    old = {k: v for k, v in meta.items() if not k.endswith("residual_groups")}  # a bundle saved before groups
    legacy = StepTimeRegressor._load_from(
        tmp_path, {**old, "params": {**meta["params"], "interval_level": "group_median"}}
    )
    assert legacy.calibrated_level(0.9) == 0.9
    with pytest.raises(BundleError, match="malformed"):
        StepTimeRegressor._load_from(tmp_path, {**meta, "residual_groups": ["a"]})
    with pytest.raises(SpecError, match="interval_level"):
        StepTimeRegressor(interval_level="median", **SMALL).fit(X, y)
    with pytest.raises(SpecError, match="calibration_groups"):
        StepTimeRegressor(**SMALL).fit(X, y, calibration_groups=np.zeros(3))


def test_new_software_takes_the_domain_residuals_in_its_interval(two_domains, tmp_path):
    X, y, groups, domain, _, _ = two_domains
    X = X.assign(**{c: 0.0 for c in SOFTWARE_SIGNATURE})  # every training run: one stack, nothing overlapped
    known = X.iloc[:20]
    new = known.assign(tp_comm_overlap=1.0)  # a switch no training run had

    def log_width(model, rows):
        return np.diff(np.log(model.predict_interval(rows)), axis=1).ravel()

    model = StepTimeRegressor(**SMALL).fit(X, y, groups=groups, domain_groups=domain)
    assert model.software_signatures_ == [(0.0,) * len(SOFTWARE_SIGNATURE)]
    assert (log_width(model, new) > log_width(model, known) + 1e-9).all()
    np.testing.assert_allclose(log_width(model.set_params(ood_interval="cluster"), new), log_width(model, known))
    model.set_params(ood_interval="domain")
    meta = model._save_to(tmp_path)
    np.testing.assert_array_equal(StepTimeRegressor._load_from(tmp_path, meta).predict_interval(new),
                                  model.predict_interval(new))  # fmt: skip
    old = StepTimeRegressor._load_from(tmp_path, {k: v for k, v in meta.items() if k != "software_signatures"})
    np.testing.assert_allclose(log_width(old, new), log_width(model, known))  # no signatures: nothing is new
