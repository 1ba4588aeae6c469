"""Tests of perfcast.models.intervals: the interval maths on synthetic residuals with known laws."""

from __future__ import annotations

import numpy as np
import pytest

from perfcast.errors import SpecError
from perfcast.models.intervals import (
    central_levels,
    check_coverage,
    conformal_bounds,
    conformal_quantile,
    interpolated_weighted_quantiles,
    log_interval,
    random_effect_abs_quantile,
    split_group_shifts,
    straddle_zero,
    weighted_conformal_bounds,
    weighted_quantile,
    weighted_quantiles,
)

LEVELS = (0.5, 0.8, 0.9, 0.95)


def _covered(r: np.ndarray, lo: float, hi: float) -> float:
    return float(np.mean((r >= lo) & (r <= hi)))


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_check_coverage_refuses_values_outside_the_open_unit_interval(bad: float) -> None:
    with pytest.raises(SpecError, match="coverage"):
        check_coverage(bad)


def test_check_coverage_accepts_levels_inside() -> None:
    for c in (1e-6, 0.5, 0.9, 1 - 1e-6):
        check_coverage(c)
    assert central_levels(0.9) == pytest.approx((0.05, 0.95))


def test_straddle_zero_and_log_interval_keep_the_median_inside() -> None:
    assert straddle_zero(0.2, 0.5) == (0.0, 0.5)
    assert straddle_zero(-0.3, -0.1) == (-0.3, 0.0)
    pred = np.array([1.0, 2.0, 4.0])
    out = log_interval(pred, *straddle_zero(-0.5, 0.25))
    assert out.shape == (3, 2)
    np.testing.assert_allclose(out, np.column_stack([pred * np.exp(-0.5), pred * np.exp(0.25)]))
    rows = log_interval(pred, np.array([0.0, -1.0, -0.1]), np.array([0.0, 1.0, 0.1]))  # per-row bounds
    assert (rows[:, 0] <= pred).all() and (pred <= rows[:, 1]).all()


def test_weighted_quantile_is_the_lower_step_quantile() -> None:
    values = np.array([3.0, 1.0, 2.0, 10.0])
    assert weighted_quantile(values, np.ones(4), 0.5) == 2.0
    assert weighted_quantile(values, np.array([1.0, 1.0, 1.0, 97.0]), 0.5) == 10.0
    assert weighted_quantile(values, np.ones(4), 1.0) == 10.0
    np.testing.assert_array_equal(weighted_quantiles(values, np.ones(4), [0.0, 0.25, 0.5, 1.0]), [1, 1, 2, 10])


def test_interpolated_weighted_quantiles_interpolate_between_midpoints() -> None:
    values = np.array([0.0, 1.0, 2.0, 3.0])
    # equal weights: points at 1/8, 3/8, 5/8, 7/8
    np.testing.assert_allclose(
        interpolated_weighted_quantiles(values, np.ones(4), np.array([0.0, 0.25, 0.5])), [0, 0.5, 1.5]
    )
    heavy_top = interpolated_weighted_quantiles(values, np.array([1.0, 1.0, 1.0, 9.0]), np.array([0.5]))
    assert heavy_top[0] > 2.0


def test_conformal_bounds_use_finite_sample_ranks() -> None:
    r = np.random.default_rng(0).permutation(np.arange(1.0, 21.0))  # 20 residuals 1..20
    assert conformal_bounds(r, 0.9) == (1.0, 20.0)  # too few for the 95% tails: the extremes
    big = np.arange(1.0, 201.0)
    assert conformal_bounds(big, 0.9) == (10.0, 191.0)  # ranks floor(201*0.05), ceil(201*0.95)
    assert conformal_bounds(big, 0.5) == (50.0, 151.0)


def test_conformal_bounds_cover_new_draws_near_the_target_and_widen_with_coverage() -> None:
    rng = np.random.default_rng(1)
    calib, fresh = rng.standard_t(5, 2000), rng.standard_t(5, 200_000)
    widths = []
    for c in LEVELS:
        lo, hi = conformal_bounds(calib, c)
        assert _covered(fresh, lo, hi) == pytest.approx(c, abs=0.03), c
        widths.append(hi - lo)
    assert np.all(np.diff(widths) > 0)


def test_weighted_conformal_bounds_cover_near_the_target_and_follow_the_weights() -> None:
    rng = np.random.default_rng(2)
    calib, fresh = np.sort(rng.normal(0.1, 0.3, 2000)), rng.normal(0.1, 0.3, 200_000)
    equal = np.full(len(calib), 1.0 / len(calib))
    widths = []
    for c in LEVELS:
        lo, hi = weighted_conformal_bounds(calib, equal, c)
        assert _covered(fresh, lo, hi) == pytest.approx(c, abs=0.03), c
        widths.append(hi - lo)
    assert np.all(np.diff(widths) > 0)
    # weight on the upper half moves both bounds up
    w = np.where(calib > np.median(calib), 9.0, 1.0)
    lo_w, hi_w = weighted_conformal_bounds(calib, w / w.sum(), 0.8)
    lo_e, hi_e = weighted_conformal_bounds(calib, equal, 0.8)
    assert lo_w > lo_e and hi_w > hi_e


def test_normalised_conformal_interval_covers_heteroscedastic_draws() -> None:
    rng = np.random.default_rng(3)
    scale_cal, scale_new = rng.uniform(0.05, 0.5, 2000), rng.uniform(0.05, 0.5, 200_000)
    scores = np.sort(np.abs(rng.normal(0.0, scale_cal)) / scale_cal)
    err_new = rng.normal(0.0, scale_new)
    qs = []
    for c in LEVELS:
        q = conformal_quantile(scores, c)
        assert np.mean(np.abs(err_new) <= q * scale_new) == pytest.approx(c, abs=0.03), c
        qs.append(q)
    assert np.all(np.diff(qs) > 0)
    assert conformal_quantile(scores[:5], 0.9) == scores[4]  # too few scores: the largest


def test_split_group_shifts_take_off_each_groups_median() -> None:
    groups = np.array(["a"] * 3 + ["b"] * 3)
    res = np.array([0.1, 0.2, 0.3, -1.0, -0.9, -0.8])
    centred, shifts = split_group_shifts(res, np.ones(6), groups)
    np.testing.assert_allclose(shifts, [0.2, -0.9])
    np.testing.assert_allclose(centred, [-0.1, 0.0, 0.1, -0.1, 0.0, 0.1], atol=1e-12)


def test_random_effect_interval_is_a_symmetric_t_predictive_and_widens_with_group_disagreement() -> None:
    from scipy import stats

    shifts = np.array([-0.2, 0.0, 0.1, 0.3])
    q = random_effect_abs_quantile(shifts, np.zeros(1), np.ones(1), 0.9)
    scale = shifts.std(ddof=1) * np.sqrt(1 + 1 / 4)
    t3 = stats.t(3, loc=shifts.mean(), scale=scale)
    assert t3.cdf(q) - t3.cdf(-q) == pytest.approx(0.9, abs=1e-5)
    spread = np.linspace(-0.1, 0.1, 101)
    narrow = random_effect_abs_quantile(shifts / 4, spread, np.ones(101), 0.9)
    wide = random_effect_abs_quantile(shifts, spread, np.ones(101), 0.9)
    assert 0 < narrow < wide
    assert random_effect_abs_quantile(shifts, spread, np.ones(101), 0.5) < wide
    same = random_effect_abs_quantile(np.full(3, 0.25), spread, np.ones(101), 0.9)  # no disagreement
    assert same == weighted_quantile(np.abs(0.25 + spread), np.ones(101) / 101, 0.9)


def test_random_effect_interval_covers_rows_of_unseen_groups() -> None:
    """Normal group shifts plus a normal row spread: over many calibrations on 8 groups, the rows
    of new groups are covered at the target or a little above (the t predictive is conservative)."""
    rng = np.random.default_rng(4)
    levels = (0.5, 0.8, 0.9)
    covered = {c: [] for c in levels}
    groups = np.repeat(np.arange(8), 50)
    for _ in range(100):
        res = rng.normal(0.0, 0.3, 8)[groups] + rng.normal(0.0, 0.1, len(groups))
        centred, shifts = split_group_shifts(res, np.ones(len(res)), groups)
        new = rng.normal(0.0, 0.3, (50, 1)) + rng.normal(0.0, 0.1, (50, 20))
        qs = [random_effect_abs_quantile(shifts, centred, np.ones(len(centred)), c) for c in levels]
        assert np.all(np.diff(qs) > 0)
        for c, q in zip(levels, qs, strict=True):
            covered[c].append(np.mean(np.abs(new) <= q))
    for c in levels:
        assert c - 0.02 <= np.mean(covered[c]) <= c + 0.08, (c, np.mean(covered[c]))
