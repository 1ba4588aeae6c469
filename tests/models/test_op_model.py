"""OpTimeRegressor: the estimator contract (STYLE 8) on a tiny synthetic dataset.

The synthetic truth is ``t = L + roofline / eff(gpu, shape)`` with a per-GPU efficiency
close across GPUs and a shape term the features see (output-tile waste), plus 5% noise.
Its rows are timed with CUDA events (``timing``), as the 12-us launch term says.

``sklearn.utils.estimator_checks.parametrize_with_checks`` does not apply: the estimator's
``X`` is an op-table DataFrame (``op``, shapes, ``gpu``), and the checks feed numeric
arrays, so every check would fail at input validation. The clone / get_params /
set_params round trip is tested instead.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from perfcast.data.schema import QUERY_TIMING, OpTiming
from perfcast.errors import OutOfDomainWarning, SpecError
from perfcast.features.op_features import FEATURE_SPEC_VERSION, TIMING_FEATURE, featurize_ops
from perfcast.models import op_interval
from perfcast.models.op_base import DEFAULT_LAUNCH_MS, POOLED, base_ms
from perfcast.models.op_bounds import EFFICIENCY_MARGIN
from perfcast.models.op_model import OpTimeRegressor

GPU_EFF = {"a100-pcie-40gb": 0.70, "v100-pcie-32gb": 0.64, "t4": 0.60, "p100-pcie-16gb": 0.58}
TRUE_LAUNCH_MS = 0.012
FAST = {"n_estimators": 40, "learning_rate": 0.2, "n_jobs": 1}


def make_ops(gpus=GPU_EFF, n_gemm: int = 250, n_vector: int = 150, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """Synthetic GEMM and vector rows on ``gpus`` with their true times (no noise), ms."""
    rng = np.random.default_rng(seed)
    parts = []
    for gpu in gpus:
        dims = np.exp(rng.uniform(np.log(8), np.log(3000), size=(n_gemm, 3))).astype(int)
        parts.append(
            pd.DataFrame(
                {
                    "op": rng.choice(["bmm", "linear"], n_gemm),
                    "batch": rng.choice([1, 2, 8, 32], n_gemm),
                    "m": dims[:, 0],
                    "n": dims[:, 1],
                    "k": dims[:, 2],
                    "dtype": "fp32",
                    "gpu": gpu,
                }
            )
        )
        parts.append(
            pd.DataFrame(
                {
                    "op": rng.choice(["add", "relu", "softmax", "layernorm"], n_vector),
                    "rows": np.exp(rng.uniform(0, np.log(20000), n_vector)).astype(int),
                    "cols": np.exp(rng.uniform(np.log(8), np.log(4096), n_vector)).astype(int),
                    "dtype": "fp32",
                    "gpu": gpu,
                }
            )
        )
    ops = pd.concat(parts, ignore_index=True).assign(timing="cuda_events")
    return ops, true_ms(ops)


def true_ms(ops: pd.DataFrame) -> np.ndarray:
    feats = featurize_ops(ops)
    eff = ops["gpu"].map(GPU_EFF).to_numpy()
    shape = np.where(feats["op_class"] == "gemm", 0.5 + 0.5 * feats["tile_eff64"].fillna(1.0), 1.0)
    return TRUE_LAUNCH_MS + feats["roofline_ms"].to_numpy() / (eff * shape)


@pytest.fixture(scope="module")
def data() -> tuple[pd.DataFrame, np.ndarray]:
    ops, t = make_ops()
    noise = np.exp(np.random.default_rng(1).normal(0, 0.05, len(t)))
    return ops, t * noise


@pytest.fixture(scope="module")
def fitted(data) -> OpTimeRegressor:
    ops, t = data
    return OpTimeRegressor(**FAST, timing=True).fit(ops, t)


def test_fit_returns_self(data):
    ops, t = data
    model = OpTimeRegressor(**FAST, calibrate=False)
    assert model.fit(ops, t) is model


def test_unfitted_raises_not_fitted(data):
    ops, _ = data
    model = OpTimeRegressor()
    with pytest.raises(NotFittedError):
        model.predict(ops)
    with pytest.raises(NotFittedError):
        model.predict_interval(ops)


def test_fitted_state(fitted):
    assert set(fitted.boosters_) == {"gemm", "vector"}
    assert set(fitted.interval_kind_.values()) == {"gpu"}
    assert fitted.feature_spec_version_ == FEATURE_SPEC_VERSION
    assert fitted.train_gpus_ == tuple(sorted(GPU_EFF))
    for cls in ("gemm", "vector"):
        assert fitted.launch_ms_[(POOLED, cls, "cuda_events")] > 0
        values, weights = fitted.residuals_[cls]
        assert values.shape == weights.shape and np.isfinite(values).all()
        assert len(fitted.gpu_shifts_[cls]) == len(GPU_EFF)  # one shift per calibration GPU


def test_shapes_and_ordering(fitted, data):
    ops, _ = data
    sub = ops.iloc[::7]
    pred = fitted.predict(sub)
    interval = fitted.predict_interval(sub)
    assert pred.shape == (len(sub),)
    assert interval.shape == (len(sub), 2)
    assert (pred > 0).all()
    assert (interval[:, 0] <= pred).all() and (pred <= interval[:, 1]).all()
    narrow = fitted.predict_interval(sub, coverage=0.5)
    wide = fitted.predict_interval(sub, coverage=0.99)
    assert (narrow[:, 0] <= pred).all() and (pred <= narrow[:, 1]).all()
    assert (wide[:, 1] - wide[:, 0] >= narrow[:, 1] - narrow[:, 0] - 1e-12).all()


def test_bad_coverage(fitted, data):
    with pytest.raises(SpecError, match="coverage"):
        fitted.predict_interval(data[0].iloc[:3], coverage=1.0)


def test_recovers_truth_on_held_out_gpu(data):
    ops, t = data
    held = ops["gpu"] == "v100-pcie-32gb"
    model = OpTimeRegressor(**FAST).fit(ops[~held], t[~held])
    test = ops[held]
    truth = true_ms(test)
    pred = model.predict(test)
    roof = featurize_ops(test)["roofline_ms"].to_numpy()
    mape_model = np.mean(np.abs(pred - truth) / truth)
    mape_roof = np.mean(np.abs(roof - truth) / truth)
    assert mape_model < 0.2
    assert mape_model < 0.5 * mape_roof
    interval = model.predict_interval(test, coverage=0.9)
    coverage = np.mean((truth >= interval[:, 0]) & (truth <= interval[:, 1]))
    assert coverage > 0.6


def test_deterministic(data):
    ops, t = data
    a = OpTimeRegressor(**FAST, calibrate=False, random_state=3).fit(ops, t).predict(ops.iloc[:50])
    b = OpTimeRegressor(**FAST, calibrate=False, random_state=3).fit(ops, t).predict(ops.iloc[:50])
    np.testing.assert_array_equal(a, b)


def test_clone_get_set_params_round_trip():
    model = OpTimeRegressor(n_estimators=7, max_depth=3, calibrate=False)
    params = model.get_params()
    assert params["n_estimators"] == 7 and params["max_depth"] == 3
    twin = clone(model)
    assert twin is not model and twin.get_params() == params
    assert twin.set_params(learning_rate=0.3) is twin
    assert twin.get_params()["learning_rate"] == 0.3
    assert model.get_params()["learning_rate"] == 0.07


def test_invalid_hyperparameters_raise_at_fit(data):
    ops, t = data
    with pytest.raises(SpecError, match="n_estimators=0"):
        OpTimeRegressor(n_estimators=0).fit(ops, t)


def test_bad_targets(data):
    ops, t = data
    bad = t.copy()
    bad[3] = 0.0
    with pytest.raises(SpecError, match="rows 3"):
        OpTimeRegressor(**FAST).fit(ops, bad)
    with pytest.raises(SpecError, match="y has"):
        OpTimeRegressor(**FAST).fit(ops, t[:-1])


def test_unknown_class_at_predict_names_ops(data):
    ops, t = data
    gemm = ops["op"].isin(["bmm", "linear"]).to_numpy()
    model = OpTimeRegressor(**FAST, calibrate=False).fit(ops[gemm], t[gemm])
    attention = pd.DataFrame(
        {"op": ["attention"], "batch": [1], "heads": [8], "seq_q": [512], "seq_kv": [512], "head_dim": [64],
         "dtype": ["fp32"], "gpu": ["t4"]}
    )  # fmt: skip
    with pytest.raises(SpecError, match=r"attention.*rows 0"):
        model.predict(attention)
    with pytest.raises(SpecError, match="softmax|relu|add|layernorm"):
        model.predict(ops[~gemm].iloc[:4])


def test_collectives_refused_at_fit():
    ops = pd.DataFrame({"op": ["allreduce"], "bytes": [1 << 20], "n_ranks": [8], "dtype": ["bf16"], "gpu": ["t4"]})
    with pytest.raises(SpecError, match="collective"):
        OpTimeRegressor(**FAST).fit(ops, [1.0])


def test_out_of_domain_warns_once_with_count(fitted, data):
    ops, _ = data
    inside = ops.iloc[:20]
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutOfDomainWarning)
        fitted.predict(inside)
    assert not fitted.out_of_domain(inside).any()
    h100 = inside.assign(gpu="h100-sxm5-80gb")  # more SMs and bandwidth than any training GPU
    huge = inside.iloc[:3].assign(m=10**6, n=10**6, k=10**6, op="bmm")
    both = pd.concat([h100, huge], ignore_index=True)
    with pytest.warns(OutOfDomainWarning, match=r"^23 of 23") as record:
        fitted.predict(both)
    assert len([w for w in record if issubclass(w.category, OutOfDomainWarning)]) == 1
    assert fitted.out_of_domain(both).all()


def test_few_gpus_fall_back_to_row_folds(caplog):
    ops, t = make_ops({"t4": 0.6, "p100-pcie-16gb": 0.58}, n_gemm=80, n_vector=0)
    with caplog.at_level(logging.WARNING, logger="perfcast.models.op_interval"):
        model = OpTimeRegressor(n_estimators=10, n_jobs=1).fit(ops, t)
    assert model.interval_kind_ == {"gemm": "row"}
    assert "WITHIN-GPU" in caplog.text
    interval = model.predict_interval(ops.iloc[:5])
    assert (interval[:, 0] <= interval[:, 1]).all()


def test_a_class_seen_on_one_gpu_borrows_the_gemm_gpu_shifts(caplog):
    ops, t = make_ops(n_gemm=120, n_vector=0)
    rng = np.random.default_rng(3)
    attn = pd.DataFrame(
        {
            "op": "attention",
            "batch": rng.choice([1, 4, 16], 120),
            "heads": 16,
            "seq_q": rng.choice([512, 1024, 4096], 120),
            "head_dim": 128,
            "dtype": "fp16",
            "gpu": "t4",
        }
    )
    attn["seq_kv"] = attn["seq_q"]  # fmt: skip
    feats = featurize_ops(attn)
    y_attn = TRUE_LAUNCH_MS + feats["roofline_ms"].to_numpy() / 0.5 * rng.lognormal(0, 0.02, len(attn))
    with caplog.at_level(logging.WARNING, logger="perfcast.models.op_interval"):
        model = OpTimeRegressor(**FAST).fit(pd.concat([ops, attn], ignore_index=True), np.r_[t, y_attn])
    assert model.interval_kind_ == {"gemm": "gpu", "attention": "borrowed:gemm"}
    np.testing.assert_array_equal(model.gpu_shifts_["attention"], model.gpu_shifts_["gemm"])
    assert "a GPU-level interval borrowed from gemm" in caplog.text
    # wider than the within-GPU interval alone: the spread between GPUs is added
    within = OpTimeRegressor(**FAST).fit(attn, y_attn)
    assert within.interval_kind_ == {"attention": "row"}
    q_borrowed, q_within = model.residual_quantiles("attention"), within.residual_quantiles("attention")
    assert q_borrowed[1] - q_borrowed[0] > q_within[1] - q_within[0]


def test_launch_default_without_tiny_ops():
    ops, t = make_ops({"t4": 0.6}, n_gemm=40, n_vector=0)
    big = ops.assign(m=ops["m"] + 2048, n=ops["n"] + 2048, k=ops["k"] + 2048)
    model = OpTimeRegressor(n_estimators=5, calibrate=False, n_jobs=1, timing=True).fit(big, true_ms(big))
    assert model.launch_ms_[(POOLED, "gemm", "cuda_events")] == DEFAULT_LAUNCH_MS


def test_launch_measured_from_tiny_ops():
    tiny = pd.DataFrame({"op": "add", "rows": 1, "cols": np.arange(4, 124), "dtype": "fp32", "gpu": "t4"})
    t = np.linspace(0.01, 0.03, len(tiny))
    model = OpTimeRegressor(n_estimators=5, calibrate=False, n_jobs=1, timing=True).fit(tiny, t)
    assert model.launch_ms_[("NVIDIA", "vector", "gpu_kernels")] == pytest.approx(np.quantile(t, 0.05))
    blind = OpTimeRegressor(n_estimators=5, calibrate=False, n_jobs=1, timing=False).fit(tiny, t)
    assert blind.launch_ms_[("NVIDIA", "vector")] == pytest.approx(np.quantile(t, 0.05))


def test_base_of_an_embedding_forward_is_its_issue_time_where_longer():
    rows = pd.DataFrame(
        {"op": ["embedding", "embedding", "add"], "rows": 4096, "cols": 4096, "dtype": "bf16",
         "backward": [False, True, False], "gpu": "h100-sxm5-80gb"}
    )  # fmt: skip
    feats = featurize_ops(rows)
    launch = {(POOLED, "vector"): 0.01}
    expected = 0.01 + np.array(
        [feats["issue_ms"].iloc[0], feats["roofline_ms"].iloc[1], feats["roofline_ms"].iloc[2]]
    )  # the forward gather is issue-bound; backward and other ops keep the roofline
    assert feats["issue_ms"].iloc[0] > feats["roofline_ms"].iloc[0]
    np.testing.assert_allclose(base_ms(feats, launch, "vector"), expected)


def test_predict_with_interval_matches_the_two_calls(fitted, data):
    X, _ = data
    pred, interval = fitted.predict_with_interval(X, coverage=0.8)
    np.testing.assert_array_equal(pred, fitted.predict(X))
    np.testing.assert_array_equal(interval, fitted.predict_interval(X, coverage=0.8))


def test_gpu_level_interval_is_symmetric_in_log_time(fitted, data):
    X, _ = data
    if fitted.interval_kind_["gemm"] != "gpu":
        pytest.skip("fixture trained on too few GPUs for a GPU-level interval")
    q_lo, q_hi = fitted.residual_quantiles("gemm", 0.9)
    assert q_lo == pytest.approx(-q_hi) and q_hi > 0


def test_predict_flagged_matches_the_separate_calls(fitted, data):
    ops, _ = data
    h100 = ops.iloc[:20].assign(gpu="h100-sxm5-80gb")  # outside the training GPUs' range
    mixed = pd.concat([ops.iloc[:40], h100, ops.iloc[-40:]], ignore_index=True)
    with pytest.warns(OutOfDomainWarning, match=r"^20 of 100"):
        pred, interval, ood = fitted.predict_flagged(mixed, coverage=0.8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutOfDomainWarning)
        want_pred, want_interval = fitted.predict_with_interval(mixed, coverage=0.8)
    np.testing.assert_array_equal(pred, want_pred)
    np.testing.assert_array_equal(interval, want_interval)
    np.testing.assert_array_equal(ood, fitted.out_of_domain(mixed))
    assert ood.sum() == 20
    with pytest.raises(SpecError, match="coverage"):
        fitted.predict_flagged(mixed, coverage=1.0)


def test_residual_quantiles_are_cached_per_class_and_coverage(data):
    ops, t = data
    model = OpTimeRegressor(n_estimators=15, n_jobs=1).fit(ops, t)
    for cls in model.boosters_:
        for coverage in (0.8, 0.9):
            first = model.residual_quantiles(cls, coverage)
            assert first == model._residual_quantiles(cls, coverage)  # the cache holds the computed value
            assert model.residual_quantiles(cls, coverage) == first
    assert set(model._quantile_cache) == {(c, cov) for c in model.boosters_ for cov in (0.8, 0.9)}
    assert model.residual_quantiles("gemm", 0.8) != model.residual_quantiles("gemm", 0.9)
    model.fit(ops.iloc[::2], t[::2])  # refitting clears the cache
    assert "_quantile_cache" not in vars(model)
    assert model.residual_quantiles("gemm", 0.9) == model._residual_quantiles("gemm", 0.9)


def test_efficiency_ceilings_are_the_best_measured_plus_margin_capped_at_one(fitted, data):
    ops, t = data
    feats = featurize_ops(ops)
    eff = feats["roofline_ms"].to_numpy() / t
    for cls in ("gemm", "vector"):
        best = eff[(feats["op_class"] == cls).to_numpy()].max()
        assert fitted.efficiency_ceiling_[cls] == {"32-bit": pytest.approx(min(1.0, best * (1 + EFFICIENCY_MARGIN)))}
    np.testing.assert_allclose(
        fitted.efficiency_ceilings(ops),
        np.where(feats["op_class"] == "gemm", fitted.efficiency_ceiling_["gemm"]["32-bit"],
                 fitted.efficiency_ceiling_["vector"]["32-bit"]),
    )  # fmt: skip
    # a dtype family the class never trained on has no ceiling but the roofline
    bf16 = ops.head(3).assign(dtype="bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutOfDomainWarning)
        np.testing.assert_array_equal(fitted.efficiency_ceilings(bf16), 1.0)


def test_the_physical_bound_raises_median_and_interval_to_the_floor(fitted, data):
    import copy

    ops, _ = data
    feats = featurize_ops(ops)
    tight = copy.deepcopy(fitted)
    tight.efficiency_ceiling_ = {"gemm": {"32-bit": 0.05}, "vector": {"32-bit": 0.05}}  # binds on most rows
    floor = feats["roofline_ms"].to_numpy() / 0.05
    pred, interval = tight.predict_with_interval(ops)
    raw = fitted._predict_ms(feats, fitted._row_timing(ops))
    np.testing.assert_allclose(pred, np.maximum(raw, floor))
    np.testing.assert_array_equal(tight.predict(ops), pred)
    assert (raw < floor).mean() > 0.3
    assert np.all(interval[:, 0] >= floor * (1 - 1e-12))
    assert np.all((interval[:, 0] <= pred) & (pred <= interval[:, 1]))
    bound = raw < floor  # the interval moves with the raised median: its upper end keeps its width
    q_hi = {c: tight.residual_quantiles(c)[1] for c in ("gemm", "vector")}
    hi = pred * np.exp(feats["op_class"].map(q_hi).to_numpy())
    np.testing.assert_allclose(interval[bound, 1], hi[bound])


def test_ceilings_survive_the_bundle_and_old_bundles_use_the_roofline(fitted, data, tmp_path):
    ops, _ = data
    meta = fitted._save_to(tmp_path)
    loaded = OpTimeRegressor._load_from(tmp_path, meta)
    assert loaded.efficiency_ceiling_ == fitted.efficiency_ceiling_
    np.testing.assert_array_equal(loaded.predict(ops), fitted.predict(ops))
    old = {k: v for k, v in meta.items() if k not in ("efficiency_ceiling", "efficiency_margin")}
    legacy = OpTimeRegressor._load_from(tmp_path, old)
    assert legacy.efficiency_ceiling_ == {}
    np.testing.assert_array_equal(legacy.efficiency_ceilings(ops), 1.0)
    roofline = featurize_ops(ops)["roofline_ms"].to_numpy()
    assert np.all(legacy.predict(ops) >= roofline)


@pytest.mark.filterwarnings("ignore::perfcast.errors.OutOfDomainWarning")  # the A40 is a new GPU here
def test_an_op_one_training_gpu_ran_gets_the_interval_of_such_ops(data, tmp_path):
    ops, t = data
    rng = np.random.default_rng(3)
    only_t4 = pd.DataFrame({"op": "silu", "rows": rng.integers(512, 20000, 150), "cols": 4096, "dtype": "fp32",
                            "gpu": "t4", "timing": "cuda_events"})  # fmt: skip
    fused = true_ms(only_t4) * 2.5  # a kernel slower than the ops the other GPUs share
    model = OpTimeRegressor(**FAST, timing=True).fit(pd.concat([ops, only_t4], ignore_index=True), [*t, *fused])
    assert len(model.op_key_gpus_["vector"]["4:4"]) == 4 and model.op_key_gpus_["vector"]["6:4"] == ("t4",)
    query = pd.concat([ops[ops["op"] == "add"].head(20), only_t4.head(20)], ignore_index=True).assign(gpu="a40")
    pred, interval = model.predict_with_interval(query)
    half_width = np.log(interval[:, 1] / pred)
    q_class = model.residual_quantiles("vector")[1]
    q_rare = op_interval.rare_op_quantile(model.rare_residuals_["vector"], 0.9)
    assert q_rare > q_class
    np.testing.assert_allclose(half_width[:20], q_class)  # add: run by every training GPU
    np.testing.assert_allclose(half_width[20:], q_rare)  # silu: by the t4 alone
    meta = model._save_to(tmp_path)
    np.testing.assert_array_equal(OpTimeRegressor._load_from(tmp_path, meta).predict_interval(query), interval)
    legacy = OpTimeRegressor._load_from(tmp_path, {k: v for k, v in meta.items() if k != "rare_residuals"})
    np.testing.assert_allclose(np.log(legacy.predict_interval(query)[:, 1] / pred), q_class)
    # on the t4, which ran it, silu keeps the class interval
    on_t4 = model.predict_with_interval(only_t4.head(20))
    np.testing.assert_allclose(np.log(on_t4[1][:, 1] / on_t4[0]), q_class)



KERNEL_FLOOR_MS = 0.0015  # kernel-only times of tiny ops, as in Vidur's tables
HELD_OUT = "p100-pcie-16gb"


def _timed_ms(ops: pd.DataFrame) -> np.ndarray:
    """The synthetic truth with the floor of each row's timing: a 12-us launch, or a 1.5-us kernel."""
    floor = np.where(ops["timing"] == "gpu_kernels", KERNEL_FLOOR_MS, TRUE_LAUNCH_MS)
    return true_ms(ops) - TRUE_LAUNCH_MS + floor


@pytest.fixture(scope="module")
def two_timings() -> tuple[pd.DataFrame, pd.DataFrame, OpTimeRegressor, OpTimeRegressor]:
    """Training rows where t4 is timed kernel-only and the other GPUs with CUDA events; the held-out
    GPU's rows; a timing-aware and a timing-blind model fitted on them."""
    ops, _ = make_ops(n_gemm=40, n_vector=300)
    ops = ops.assign(timing=np.where(ops["gpu"] == "t4", "gpu_kernels", "cuda_events"))
    train, held = ops[ops["gpu"] != HELD_OUT], ops[ops["gpu"] == HELD_OUT].reset_index(drop=True)
    aware = OpTimeRegressor(**FAST, timing=True).fit(train, _timed_ms(train))
    blind = OpTimeRegressor(**FAST, timing=False).fit(train, _timed_ms(train))
    return train, held, aware, blind


def test_timing_gives_each_method_its_launch_term(two_timings):
    _, _, aware, blind = two_timings
    assert aware.uses_timing_ and not blind.uses_timing_
    assert aware.train_timings_["vector"] == ("cuda_events", "gpu_kernels")
    assert aware.launch_ms_[("NVIDIA", "vector", "cuda_events")] == pytest.approx(TRUE_LAUNCH_MS, rel=0.1)
    assert aware.launch_ms_[("NVIDIA", "vector", "gpu_kernels")] == pytest.approx(KERNEL_FLOOR_MS, rel=0.1)
    assert aware.feature_names_["vector"][-1] == TIMING_FEATURE
    assert TIMING_FEATURE not in blind.feature_names_["vector"]


def test_timing_tells_the_methods_apart_on_a_held_out_gpu(two_timings):
    _, held, aware, blind = two_timings
    for timing in ("cuda_events", "gpu_kernels"):
        rows = held.assign(timing=timing)
        truth = _timed_ms(rows)
        ape = np.abs(aware.predict(rows) / truth - 1)
        assert np.median(ape) < 0.1, timing
    # blind to the method, one prediction serves both: one of them is far off on the small ops
    events, kernel = (blind.predict(held.assign(timing=v)) for v in ("cuda_events", "gpu_kernels"))
    np.testing.assert_array_equal(events, kernel)
    small = featurize_ops(held)["roofline_ms"].to_numpy() < 1e-3
    worst = max(
        np.median(np.abs(events[small] / _timed_ms(held.assign(timing=v))[small] - 1))
        for v in ("cuda_events", "gpu_kernels")
    )
    assert worst > 0.5


def test_a_query_without_timing_gets_the_kernel_time(two_timings):
    _, held, aware, _ = two_timings
    assert QUERY_TIMING is OpTiming.GPU_KERNELS
    np.testing.assert_array_equal(
        aware.predict(held.drop(columns="timing")), aware.predict(held.assign(timing="gpu_kernels"))
    )
    # the source says how a row was timed when its timing cell is empty
    from_source = held.drop(columns="timing").assign(source="neusight:neusight_kernels_vector.csv.gz")
    np.testing.assert_array_equal(aware.predict(from_source), aware.predict(held.assign(timing="cuda_events")))


def test_unknown_timing_is_refused(two_timings):
    _, held, aware, _ = two_timings
    with pytest.raises(SpecError, match="timing='wallclock' is not a known timing"):
        aware.predict(held.assign(timing="wallclock"))


def test_timing_survives_the_bundle_and_models_saved_without_it_ignore_it(two_timings, tmp_path):
    _, held, aware, blind = two_timings
    rows = held.assign(timing=np.where(np.arange(len(held)) % 2, "gpu_kernels", "cuda_events"))
    meta = aware._save_to(tmp_path)
    assert meta["timing"] is True
    loaded = OpTimeRegressor._load_from(tmp_path, meta)
    assert loaded.uses_timing_ and loaded.launch_ms_ == aware.launch_ms_
    np.testing.assert_array_equal(loaded.predict(rows), aware.predict(rows))
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    old = blind._save_to(old_dir)
    old = {k: v for k, v in old.items() if k not in ("timing", "train_timings")}
    old["params"] = {k: v for k, v in old["params"].items() if k != "timing"}
    old["launch_ms"] = [entry for entry in old["launch_ms"] if len(entry) == 3]
    legacy = OpTimeRegressor._load_from(old_dir, old)
    assert not legacy.uses_timing_ and legacy.timing is False
    np.testing.assert_array_equal(legacy.predict(rows), blind.predict(held))
