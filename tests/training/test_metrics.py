"""Tests of perfcast.training.metrics: known values, input checks and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfcast.errors import SpecError
from perfcast.training.metrics import (
    ape,
    interval_coverage,
    mape,
    mean_relative_width,
    median_ape,
    p90_ape,
    spearman,
    summarize,
)

TRUE = np.array([1.0, 2.0, 4.0, 10.0])
PRED = np.array([1.1, 1.0, 4.0, 12.0])  # APE: 10, 50, 0, 20

positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


def test_known_values() -> None:
    np.testing.assert_allclose(ape(PRED, TRUE), [10.0, 50.0, 0.0, 20.0])
    assert mape(PRED, TRUE) == pytest.approx(20.0)
    assert median_ape(PRED, TRUE) == pytest.approx(15.0)
    assert p90_ape(PRED, TRUE) == pytest.approx(41.0)  # linear between 20 and 50 at 0.7
    assert interval_coverage([0.5, 2.5, 4.0, 9.0], [1.5, 3.0, 4.0, 11.0], TRUE) == pytest.approx(0.75)
    assert mean_relative_width([0.9, 0.5], [1.1, 1.5], [1.0, 2.0]) == pytest.approx(0.35)
    assert spearman(PRED, TRUE) == pytest.approx(0.8)  # ranks (2,1,3,4) vs (1,2,3,4)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_spearman_ties_and_constant() -> None:
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(spearman([5, 5, 5], [1, 2, 3]))


def test_summarize() -> None:
    out = summarize(PRED, TRUE)
    assert set(out) == {"n", "mape", "median_ape", "p90_ape"}
    assert out["n"] == 4 and out["mape"] == pytest.approx(20.0)
    full = summarize(PRED, TRUE, lo=PRED * 0.9, hi=PRED * 1.1)
    assert full["coverage"] == pytest.approx(0.5)  # 1.0 in [0.99,1.21], 4.0 in [3.6,4.4]
    assert full["rel_width"] == pytest.approx(0.2)
    with pytest.raises(SpecError, match="both lo and hi"):
        summarize(PRED, TRUE, lo=PRED)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: ape([1.0, 2.0], [1.0]), "shape mismatch"),
        (lambda: ape([1.0], [0.0]), "true must be positive"),
        (lambda: mape([1.0, 1.0], [1.0, -2.0]), "true must be positive"),
        (lambda: mape([], []), "empty"),
        (lambda: mape([np.nan], [1.0]), "non-finite"),
        (lambda: interval_coverage([2.0], [1.0], [1.5]), "lo > hi"),
        (lambda: interval_coverage([1.0], [2.0, 3.0], [1.5]), "shape mismatch"),
        (lambda: mean_relative_width([1.0], [2.0], [0.0]), "pred must be positive"),
        (lambda: spearman([1.0], [1.0]), "at least 2"),
        (lambda: summarize([1.0, 2.0], [1.0, 2.0], lo=[1.0], hi=[2.0]), "shape mismatch"),
    ],
)
def test_bad_input_raises_spec_error(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError, match=match):
        call()


@given(st.lists(positive, min_size=1, max_size=50))
def test_perfect_prediction_has_zero_error(values: list[float]) -> None:
    assert np.all(ape(values, values) == 0.0)
    assert summarize(values, values)["p90_ape"] == 0.0


@given(st.lists(st.tuples(positive, positive, positive), min_size=1, max_size=50))
def test_coverage_is_a_fraction(rows: list[tuple[float, float, float]]) -> None:
    a, b, true = (np.array(c) for c in zip(*rows, strict=False))
    cov = interval_coverage(np.minimum(a, b), np.maximum(a, b), true)
    assert 0.0 <= cov <= 1.0


@given(st.lists(st.integers(min_value=-1000, max_value=1000), min_size=2, max_size=50, unique=True))
def test_spearman_of_monotone_transform_is_one(values: list[int]) -> None:
    x = np.array(values, dtype=np.float64)
    assert spearman(x**3 + 7.0, x) == pytest.approx(1.0)
    assert spearman(-np.exp(x / 1000.0), x) == pytest.approx(-1.0)
