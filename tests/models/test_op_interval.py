"""op_interval: the op model's residual folds, borrowed GPU shifts and interval quantiles."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfcast.models import op_interval


def test_gpu_equal_weights_give_each_gpu_the_same_total():
    gpus = np.array(["a", "a", "a", "b"])
    w = op_interval.gpu_equal_weights(gpus, np.array([1.0, 1.0, 2.0, 5.0]))
    assert w[gpus == "a"].sum() == w[gpus == "b"].sum()
    assert np.isclose(w.mean(), 1.0)


def test_fit_residuals_holds_out_one_gpu_per_fold_with_enough_gpus():
    gpus = np.repeat(["a", "b", "c"], 4)
    t = np.full(12, 2.0)
    held_sets = []

    def out_of_fold(held, rng):
        held_sets.append(set(gpus[held]))
        return np.ones(held.sum())

    (res, w), kind = op_interval.fit_residuals(
        "gemm", gpus, t, np.ones(12), calibrate=True, seed=0, in_sample=lambda rows: None, out_of_fold=out_of_fold
    )
    assert kind == "gpu" and held_sets == [{"a"}, {"b"}, {"c"}]
    np.testing.assert_allclose(res, np.log(2.0))


def test_fit_residuals_without_calibration_are_in_sample():
    (res, _), kind = op_interval.fit_residuals(
        "vector", np.array(["a", "b"]), np.array([1.0, 4.0]), np.ones(2), calibrate=False, seed=0,
        in_sample=lambda rows: np.full(rows.sum(), 2.0), out_of_fold=None,
    )  # fmt: skip
    assert kind == "in-sample"
    np.testing.assert_allclose(res, np.log([0.5, 2.0]))


def test_a_class_with_too_few_gpus_borrows_the_donor_shifts():
    kind = {"gemm": "gpu", "attention": "row"}
    shifts = {"gemm": np.array([0.1, -0.1, 0.2]), "attention": np.empty(0)}
    op_interval.borrow_gpu_shifts(kind, shifts)
    assert kind["attention"] == "borrowed:gemm"
    np.testing.assert_array_equal(shifts["attention"], shifts["gemm"])


def test_residual_quantiles_are_symmetric_with_gpu_shifts_and_straddle_zero():
    values, weights = np.linspace(-0.2, 0.3, 11), np.ones(11)
    q_lo, q_hi = op_interval.residual_quantiles(values, weights, np.array([0.1, -0.1, 0.0]), 0.9)
    assert q_lo == -q_hi and q_hi > 0
    q_lo, q_hi = op_interval.residual_quantiles(np.full(5, 0.4), np.ones(5), np.empty(0), 0.9)
    assert q_lo == 0.0 < q_hi


def test_op_keys_are_the_op_code_and_element_size():
    feats = pd.DataFrame({"op_code": [0.0, 0.0, np.nan], "elem_bytes": [4.0, 2.0, 2.0]})
    assert list(op_interval.op_keys(feats)) == ["0:4", "0:2", "-1:2"]  # GEMM and attention rows: size only


def test_rare_op_residuals_keep_the_keys_few_other_gpus_ran():
    gpus = np.array(["a", "b", "c", "d", "a", "b"])
    keys = np.array(["add", "add", "add", "add", "swiglu", "swiglu"], dtype=object)
    res = np.array([0.1, -0.1, 0.05, 0.0, 0.9, -0.5])
    assert op_interval.key_gpus(keys, gpus) == {"add": ("a", "b", "c", "d"), "swiglu": ("a", "b")}
    values, weights = op_interval.rare_op_residuals(res, gpus, keys, np.ones(6))
    # swiglu was run by one other GPU when either was held out: only its |residuals| are kept
    assert set(np.unique(values)) == {0.5, 0.9}
    assert op_interval.rare_op_quantile((values, weights), 0.9) == 0.9
    assert op_interval.rare_op_residuals(res[:4], gpus[:4], keys[:4], np.ones(4)) is None
    assert op_interval.rare_op_quantile(None, 0.9) == 0.0


def test_a_query_is_rare_on_a_gpu_that_did_not_run_a_key_few_gpus_ran():
    ran = {"add": ("a", "b"), "swiglu": ("a",)}
    keys = np.array(["add", "swiglu", "swiglu", "embedding"], dtype=object)
    gpus = np.array(["z", "z", "a", "a"])
    # add: two GPUs ran it; swiglu on z: one did, not z; on a: a ran it; embedding: none did
    np.testing.assert_array_equal(op_interval.rare_rows(keys, gpus, ran), [False, True, False, True])
