"""Per-cluster few-shot step corrections."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import BundleError, SpecError
from perfcast.features.run_config import parse_run_row
from perfcast.models.step_calibration import (
    SHRINK_RUNS,
    CalibratedStepPredictor,
    ClusterCorrection,
    cluster_key,
    config_cluster_key,
    fit_step_correction,
    load_step_corrections,
    save_step_correction,
)


def test_cluster_key_names_gpu_and_fabric() -> None:
    assert cluster_key("h100-sxm5-80gb") == "h100-sxm5-80gb"
    assert cluster_key("h100-sxm5-80gb", "ib-ndr") == "h100-sxm5-80gb/ib-ndr"
    one = parse_run_row({"model": "gpt3-125m", "gpu": "a100-sxm4-80gb", "global_batch": 8})
    two = parse_run_row({"model": "gpt3-125m", "gpu": "a100-sxm4-80gb", "global_batch": 8, "dp": 8})
    assert config_cluster_key(one) == config_cluster_key(two)


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


class _Fixed:
    name = "fixed"

    def predict_configs(self, configs, *, coverage=0.9):
        n = len(configs)
        return pd.DataFrame({"step_ms": np.full(n, 10.0), "step_lo_ms": np.full(n, 8.0),
                             "step_hi_ms": np.full(n, 12.0), "composed_step_ms": np.full(n, 5.0),
                             "compute_ms": np.full(n, 6.0)})  # fmt: skip


def test_calibrated_predictor_scales_only_the_corrected_clusters() -> None:
    a100 = parse_run_row({"model": "gpt3-125m", "gpu": "a100-sxm4-80gb", "global_batch": 8})
    h100 = parse_run_row({"model": "gpt3-125m", "gpu": "h100-sxm5-80gb", "global_batch": 8})
    corr = fit_step_correction(config_cluster_key(a100), np.full(4, 300.0), np.full(4, 100.0))
    calibrated = CalibratedStepPredictor(_Fixed(), {corr.cluster: corr})
    out = calibrated.predict_configs([a100, h100, a100])
    assert calibrated.name == "fixed+calibrated"
    assert out["step_ms"].tolist() == pytest.approx([10 * corr.factor, 10.0, 10 * corr.factor])
    assert out.loc[0, "step_lo_ms"] < out.loc[0, "step_ms"] < out.loc[0, "step_hi_ms"]
    assert out.loc[0, "compute_ms"] == pytest.approx(6 * corr.factor)
    assert out["composed_step_ms"].tolist() == [5.0, 5.0, 5.0]


def test_json_round_trip_and_store(tmp_path) -> None:
    corr = fit_step_correction(cluster_key("a100-sxm4-80gb", "ib-hdr"), np.array([120.0]), np.array([100.0]))
    path = save_step_correction(corr, tmp_path)
    assert "/" not in path.name
    assert load_step_corrections(tmp_path) == {corr.cluster: corr}
    assert load_step_corrections(tmp_path / "missing") == {}


def test_foreign_json_is_refused() -> None:
    with pytest.raises(BundleError, match="schema_version"):
        ClusterCorrection.from_json('{"cluster": "x"}')
    with pytest.raises(BundleError, match="invalid JSON"):
        ClusterCorrection.from_json("{")
