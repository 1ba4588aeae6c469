"""Per-cluster few-shot step corrections."""

from __future__ import annotations

import numpy as np
import pytest

from perfcast.errors import BundleError, SpecError
from perfcast.models.step_calibration import (
    SHRINK_RUNS,
    ClusterCorrection,
    apply_step_corrections,
    cluster_key,
    fit_step_correction,
    load_step_corrections,
    save_step_correction,
)


def test_cluster_key_names_gpu_node_size_and_fabric() -> None:
    assert cluster_key("h100-sxm5-80gb", 8) == "h100-sxm5-80gb/8gpn"
    assert cluster_key("h100-sxm5-80gb", 8, "ib-ndr") == "h100-sxm5-80gb/8gpn/ib-ndr"


def test_shift_is_the_shrunk_mean_log_ratio() -> None:
    corr = fit_step_correction("c", np.array([200.0, 220.0]), np.array([100.0, 100.0]))
    expected = np.mean(np.log([2.0, 2.2])) * 2 / (2 + SHRINK_RUNS)
    assert corr.shift == pytest.approx(expected)
    assert corr.n_runs == 2


def test_more_runs_move_the_shift_closer_to_the_measured_ratio() -> None:
    one = fit_step_correction("c", np.array([200.0]), np.array([100.0]))
    five = fit_step_correction("c", np.full(5, 200.0), np.full(5, 100.0))
    assert 0 < one.shift < five.shift < np.log(2.0)


def test_unusable_runs_are_ignored_and_none_is_an_error() -> None:
    corr = fit_step_correction("c", np.array([np.nan, 150.0, -1.0]), np.array([100.0, 100.0, 100.0]))
    assert corr.n_runs == 1
    with pytest.raises(SpecError, match="measured_step_ms"):
        fit_step_correction("c", np.array([np.nan]), np.array([100.0]))
    with pytest.raises(SpecError, match="values"):
        fit_step_correction("c", np.array([1.0, 2.0]), np.array([1.0]))


def test_apply_scales_only_the_corrected_clusters_and_keeps_order() -> None:
    corr = fit_step_correction("a", np.full(4, 300.0), np.full(4, 100.0))
    pred, lo, hi, done = apply_step_corrections(
        np.array(["a", "b"]), np.array([10.0, 10.0]), np.array([8.0, 8.0]), np.array([12.0, 12.0]), {"a": corr}
    )
    assert done.tolist() == [True, False]
    assert pred[0] == pytest.approx(10.0 * corr.factor)
    assert lo[0] <= pred[0] <= hi[0]
    assert (pred[1], lo[1], hi[1]) == (10.0, 8.0, 12.0)


def test_json_round_trip_and_store(tmp_path) -> None:
    corr = fit_step_correction(cluster_key("a100-sxm4-80gb", 8, "ib-hdr"), np.array([120.0]), np.array([100.0]))
    path = save_step_correction(corr, tmp_path)
    assert "/" not in path.name
    assert load_step_corrections(tmp_path) == {corr.cluster: corr}
    assert load_step_corrections(tmp_path / "missing") == {}


def test_foreign_json_is_refused() -> None:
    with pytest.raises(BundleError, match="schema_version"):
        ClusterCorrection.from_json('{"cluster": "x"}')
    with pytest.raises(BundleError, match="invalid JSON"):
        ClusterCorrection.from_json("{")
