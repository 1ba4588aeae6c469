"""Per-cluster few-shot step corrections."""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import BundleError, SpecError
from perfcast.features.run_config import parse_run_row
from perfcast.models.physics_bounds import MFUCeiling
from perfcast.models.step_calibration import (
    CALIBRATION_COLUMN,
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


def test_shift_is_the_shrunk_median_log_ratio() -> None:
    corr = fit_step_correction("c", np.array([200.0, 220.0]), np.array([100.0, 100.0]))
    expected = np.median(np.log([2.0, 2.2])) * 2 / (2 + SHRINK_RUNS)
    assert corr.shift == pytest.approx(expected)
    assert corr.n_runs == 2
    three = fit_step_correction("c", np.array([200.0, 210.0, 290.0]), np.full(3, 100.0))
    assert three.shift == pytest.approx(np.log(2.1) * 3 / (3 + SHRINK_RUNS))  # the median, not the mean


def test_more_runs_move_the_shift_closer_to_the_measured_ratio() -> None:
    one = fit_step_correction("c", np.array([200.0]), np.array([100.0]))
    five = fit_step_correction("c", np.full(5, 200.0), np.full(5, 100.0))
    assert 0 < one.shift < five.shift < np.log(2.0)


def test_unusable_runs_are_named_and_none_left_is_an_error() -> None:
    corr = fit_step_correction("c", np.array([np.nan, 150.0, -1.0]), np.array([100.0, 100.0, 100.0]))
    assert corr.n_runs == 1
    assert [r.split(":")[0] for r in corr.excluded] == ["row 0", "row 2"]
    assert "measured_step_ms=-1 is not a positive finite time" in corr.excluded[1]
    with pytest.raises(SpecError, match="row 0: measured_step_ms=nan"):
        fit_step_correction("c", np.array([np.nan]), np.array([100.0]))
    with pytest.raises(SpecError, match="values"):
        fit_step_correction("c", np.array([1.0, 2.0]), np.array([1.0]))


def test_implausible_measurements_are_refused_with_row_and_value() -> None:
    labels = ["row 4", "row 7"]
    with pytest.raises(SpecError, match=r"cluster c: row 4: measured_step_ms=1e-300 is 1e-302x the predicted 100 ms"):
        fit_step_correction("c", np.array([1e-300]), np.array([100.0]), labels=labels[:1])
    corr = fit_step_correction("c", np.array([2780.0, 2780.0 * 172]), np.array([2700.0, 2700.0]), labels=labels)
    assert corr.n_runs == 1 and corr.factor == pytest.approx(np.exp(np.log(2780 / 2700) / (1 + SHRINK_RUNS)))
    assert corr.excluded == [
        "row 7: measured_step_ms=478160 is 177x the predicted 2700 ms; allowed 1/20..20x: "
        "not a plausible measurement of this config"
    ]


def test_an_outlier_among_three_or_more_runs_is_left_out() -> None:
    measured = np.array([210.0, 200.0, 220.0, 1500.0])  # x7.5 is plausible alone, not beside three x2.1
    corr = fit_step_correction("c", measured, np.full(4, 100.0))
    assert corr.n_runs == 3 and corr.log_residuals == pytest.approx(np.log([2.1, 2.0, 2.2]).tolist())
    assert len(corr.excluded) == 1 and corr.excluded[0].startswith("row 3: outlier, measured_step_ms=1500")
    two = fit_step_correction("c", np.array([200.0, 1500.0]), np.full(2, 100.0))
    assert two.n_runs == 2 and not two.excluded  # two runs cannot tell which one is off


class _Fixed:
    name = "fixed"

    def predict_configs(self, configs, *, coverage=0.9):
        n = len(configs)
        return pd.DataFrame({"step_ms": np.full(n, 10.0), "step_lo_ms": np.full(n, 8.0),
                             "step_hi_ms": np.full(n, 12.0), "composed_step_ms": np.full(n, 5.0),
                             "compute_ms": np.full(n, 6.0)})  # fmt: skip


def test_calibrated_predictor_scales_only_the_corrected_clusters() -> None:
    a100 = parse_run_row({"model": "gpt3-125m", "gpu": "a100-sxm4-80gb", "global_batch": 1})  # 5 ms at peak
    h100 = parse_run_row({"model": "gpt3-125m", "gpu": "h100-sxm5-80gb", "global_batch": 1})
    corr = fit_step_correction(config_cluster_key(a100), np.full(4, 300.0), np.full(4, 100.0), predictor="fixed")
    calibrated = CalibratedStepPredictor(_Fixed(), {corr.cluster: corr})
    out = calibrated.predict_configs([a100, h100, a100])
    assert calibrated.name == "fixed+calibrated"
    assert out[CALIBRATION_COLUMN].tolist() == [corr.label, "", corr.label]
    assert corr.label == f"{corr.cluster}@{corr.created_utc}"
    assert out["step_ms"].tolist() == pytest.approx([10 * corr.factor, 10.0, 10 * corr.factor])
    assert out.loc[0, "step_lo_ms"] < out.loc[0, "step_ms"] < out.loc[0, "step_hi_ms"]
    assert out.loc[0, "compute_ms"] == pytest.approx(6 * corr.factor)
    assert out["composed_step_ms"].tolist() == [5.0, 5.0, 5.0]


def test_a_correction_never_speeds_a_step_past_the_mfu_ceiling() -> None:
    a100 = parse_run_row({"model": "gpt3-125m", "gpu": "a100-sxm4-80gb", "global_batch": 1})
    h100 = parse_run_row({"model": "gpt3-125m", "gpu": "h100-sxm5-80gb", "global_batch": 1})
    fast = fit_step_correction(config_cluster_key(a100), np.full(4, 1.0), np.full(4, 10.0), predictor="fixed")
    out = CalibratedStepPredictor(_Fixed(), {fast.cluster: fast}).predict_configs([a100, h100])
    at_peak = MFUCeiling().floor_ms([a100])[0]  # 100% of the dense peak: no step-model ceiling
    assert 10 * fast.factor < at_peak  # the correction alone would beat the hardware
    assert out.loc[0, "step_ms"] == pytest.approx(at_peak) and out.loc[0, "step_lo_ms"] >= at_peak
    assert out.loc[0, "compute_ms"] / out.loc[0, "step_ms"] == pytest.approx(0.6)  # parts keep their shares
    assert out.loc[1, "step_ms"] == 10.0  # an uncorrected row is the base's
    # a cluster whose own runs measured a higher MFU may reach it (here 1.05 of the dense peak)
    shown = fit_step_correction(config_cluster_key(a100), np.full(4, 1.0), np.full(4, 10.0), predictor="fixed",
                                mfu=np.array([0.9, 1.05, np.nan, 0.7]))  # fmt: skip
    assert shown.best_mfu == 1.05
    calibrated = CalibratedStepPredictor(_Fixed(), {shown.cluster: shown})
    assert calibrated.predict_configs([a100]).loc[0, "step_ms"] == pytest.approx(at_peak / 1.05)
    assert calibrated.ceilings([a100, h100]).tolist() == pytest.approx([1.05, 1.0])
    assert ClusterCorrection.from_json(shown.to_json()).best_mfu == 1.05
    with pytest.raises(BundleError, match="best_mfu"):
        ClusterCorrection.from_json(shown.to_json().replace('"best_mfu": 1.05', '"best_mfu": 3.0'))


def test_json_round_trip_and_store(tmp_path) -> None:
    key = cluster_key("a100-sxm4-80gb", "ib-hdr")
    corr = fit_step_correction(key, np.array([120.0]), np.array([100.0]), predictor="bundle:x@0123456789ab")
    path = save_step_correction(corr, tmp_path)
    assert "/" not in path.name and path.name == "a100-sxm4-80gb_ib-hdr--bundle_x@0123456789ab.json"
    assert load_step_corrections(tmp_path, "bundle:x@0123456789ab") == {corr.cluster: corr}
    assert load_step_corrections(tmp_path, "analytic") == {}
    assert load_step_corrections(tmp_path / "missing", "analytic") == {}
    with pytest.raises(SpecError, match="names no predictor"):
        save_step_correction(fit_step_correction(key, np.array([120.0]), np.array([100.0])), tmp_path)


def test_a_correction_of_another_predictor_or_without_one_is_not_applied(tmp_path, caplog) -> None:
    a100 = parse_run_row({"model": "gpt3-125m", "gpu": "a100-sxm4-80gb", "global_batch": 8})
    key = config_cluster_key(a100)
    for_default = fit_step_correction(key, np.full(3, 300.0), np.full(3, 100.0), predictor="bundle:default@abc")
    calibrated = CalibratedStepPredictor(_Fixed(), {key: for_default})
    out = calibrated.predict_configs([a100])
    assert calibrated.name == "fixed" and out["step_ms"].tolist() == [10.0] and out[CALIBRATION_COLUMN].tolist() == [""]

    v1 = {"schema_version": 1, "cluster": key, "shift": 0.5, "n_runs": 1, "log_residuals": [0.6],
          "model": "fixed", "created_utc": ""}  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps(v1))
    with caplog.at_level(logging.WARNING, logger="perfcast"):
        assert load_step_corrections(tmp_path, "fixed") == {}
    assert any("old.json" in r.getMessage() and "names no predictor" in r.getMessage() for r in caplog.records)


def _v2(**change) -> str:
    data = {"schema_version": 2, "cluster": "h100", "shift": 0.1, "n_runs": 2, "log_residuals": [0.1, 0.2],
            "model": "m", "created_utc": "", "predictor": "m", "excluded": []}  # fmt: skip
    return json.dumps({**data, **change})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"shift": float("nan")}, "'shift' = nan"),
        ({"shift": float("inf")}, "'shift' = inf"),
        ({"shift": "0.1"}, "'shift' = '0.1'"),
        ({"shift": True}, "'shift' = True"),
        ({"shift": 40.0}, "'shift' = 40.0"),
        ({"n_runs": 0}, "'n_runs' = 0"),
        ({"log_residuals": [0.1]}, "'log_residuals'"),
        ({"log_residuals": [0.1, None]}, "'log_residuals[1]'"),
        ({"cluster": None}, "'cluster'"),
        ({"excluded": "row 1"}, "'excluded'"),
    ],
)
def test_a_stored_correction_with_a_bad_field_is_refused(change, field) -> None:
    assert ClusterCorrection.from_json(_v2()).shift == 0.1
    with pytest.raises(BundleError, match="^/cal/steps/h100.json: field ") as err:
        ClusterCorrection.from_json(_v2(**change), where="/cal/steps/h100.json")
    assert field in str(err.value) and "allowed" in str(err.value)
    with pytest.raises(BundleError, match="'shift' is missing"):
        ClusterCorrection.from_json(json.dumps({k: v for k, v in json.loads(_v2()).items() if k != "shift"}))


def test_foreign_json_is_refused() -> None:
    with pytest.raises(BundleError, match="schema_version"):
        ClusterCorrection.from_json('{"cluster": "x"}')
    with pytest.raises(BundleError, match="not a JSON object"):
        ClusterCorrection.from_json("null")
    with pytest.raises(BundleError, match="invalid JSON"):
        ClusterCorrection.from_json("{")


def _breakdown(attention: np.ndarray, comm: np.ndarray, step_ms: float = 100.0) -> pd.DataFrame:
    """Prediction rows whose breakdown gives attention and exposed communication these shares."""
    return pd.DataFrame({"step_ms": step_ms, "attention_ms": attention * step_ms, "comm_dp_ms": comm * step_ms,
                         "compute_ms": (1 - attention - comm) * step_ms})  # fmt: skip


def test_component_factors_tell_a_slow_attention_from_a_slow_step() -> None:
    attention, comm = np.array([0.05, 0.3, 0.6, 0.1, 0.45]), np.array([0.05, 0.05, 0.1, 0.3, 0.0])
    rows = _breakdown(attention, comm)
    measured = 100.0 * (1 - attention + 2.5 * attention)  # only the attention is 2.5x slower
    corr = fit_step_correction("c", measured, np.full(5, 100.0), breakdown=rows)
    assert corr.factors["attention"] > corr.factors["compute"] + 0.3  # the slowdown lands on attention
    shift_only = fit_step_correction("c", measured, np.full(5, 100.0))
    new = _breakdown(np.array([0.7, 0.02]), np.array([0.0, 0.0]))
    truth = 100.0 * (1 + 1.5 * new["attention_ms"] / 100.0)
    err_factors = np.abs(corr.row_factors(new) * 100.0 / truth - 1)
    err_shift = np.abs(shift_only.row_factors(new) * 100.0 / truth - 1)
    assert (err_factors < err_shift).all()  # the factors carry to configs of other shares


def test_one_run_moves_the_factors_part_way_toward_its_ratio() -> None:
    rows = _breakdown(np.array([0.3]), np.array([0.1]))
    corr = fit_step_correction("c", np.array([150.0]), np.array([100.0]), breakdown=rows)
    values = np.array(list(corr.factors.values()))
    assert (values > 1.0).all() and (values < 1.5).all()  # every component slower, none past the run's ratio
    assert 1.0 < corr.row_factors(rows)[0] < 1.5  # shrunk toward no correction


def test_component_factors_round_trip_and_are_checked(tmp_path) -> None:
    rows = _breakdown(np.array([0.2, 0.5]), np.array([0.1, 0.1]))
    corr = fit_step_correction("c", np.array([150.0, 210.0]), np.full(2, 100.0), breakdown=rows, predictor="p")
    again = ClusterCorrection.from_json(corr.to_json())
    assert again == corr
    np.testing.assert_allclose(again.row_factors(rows), corr.row_factors(rows))
    bad = json.loads(corr.to_json())
    bad["factors"]["attention"] = 1e6
    with pytest.raises(BundleError, match="factors"):
        ClusterCorrection.from_json(json.dumps(bad))
    bad["factors"] = {"memory": 1.0}
    with pytest.raises(BundleError, match="factors"):
        ClusterCorrection.from_json(json.dumps(bad))
    with pytest.raises(SpecError, match="breakdown has 1 rows"):
        fit_step_correction("c", np.array([150.0, 210.0]), np.full(2, 100.0), breakdown=rows.iloc[:1])


def test_a_far_slower_cluster_stores_factors_that_load_again() -> None:
    attention, comm = np.array([0.1, 0.5, 0.3, 0.6]), np.array([0.1, 0.0, 0.3, 0.1])
    measured = np.array([1500.0, 1900.0, 1700.0, 1950.0])  # about 19x the predicted 100 ms
    corr = fit_step_correction("c", measured, np.full(4, 100.0), breakdown=_breakdown(attention, comm))
    assert ClusterCorrection.from_json(corr.to_json()) == corr
