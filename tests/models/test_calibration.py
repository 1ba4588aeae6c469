"""Few-shot per-GPU corrections."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import BundleError, SpecError
from perfcast.models.calibration import (
    CALIBRATION_COLUMN,
    MIN_OPS_FOR_SLOPES,
    MIN_OPS_FOR_SPREAD,
    MIN_OPS_FOR_TREES,
    CalibratedPredictor,
    GpuCorrection,
    fit_correction,
    load_corrections,
    predictor_identity,
    save_correction,
    shrunk_shift,
)
from perfcast.models.predictor_protocol import OpPrediction
from perfcast.models.step_predictor import StepPredictor


class _Flat:
    name = "flat"
    has_interval = True
    flags_out_of_domain = False

    def predict_ops_flagged(self, ops: pd.DataFrame, *, coverage: float = 0.9) -> OpPrediction:
        pred = np.ones(len(ops))
        return OpPrediction(pred, pred * 0.8, pred * 1.25, np.zeros(len(ops), dtype=bool))


def _ops(n: int, op: str = "matmul", gpu: str = "h100-sxm5-80gb") -> pd.DataFrame:
    return pd.DataFrame({"op": [op] * n, "gpu": gpu})


def test_shift_recovers_a_constant_factor_and_shrinks_few_ops() -> None:
    assert shrunk_shift(np.log(np.full(100, 2.0))) == pytest.approx(np.log(2.0) * 100 / 102)
    assert abs(shrunk_shift(np.log([2.0]))) < abs(np.log(2.0)) / 2
    assert shrunk_shift(np.array([])) == 0.0


def test_corrections_apply_only_to_their_gpu_and_class(tmp_path: Path) -> None:
    ops = pd.concat([_ops(30), _ops(3, "add")], ignore_index=True)
    measured = np.r_[np.full(30, 1.5), np.full(3, 0.5)]
    corr = fit_correction("h100-sxm5-80gb", ops, measured, np.ones(len(ops)), model="flat", predictor="flat")
    assert corr.n_ops == {"gemm": 30, "vector": 3}
    assert set(corr.spread) == {"gemm"}  # enough ops for an empirical interval only there

    save_correction(corr, tmp_path)
    loaded = load_corrections(tmp_path, predictor_identity(_Flat()))
    assert loaded["h100-sxm5-80gb"] == corr

    predictor = CalibratedPredictor(_Flat(), loaded)
    query = pd.concat([_ops(2), _ops(2, "add"), _ops(2, gpu="a100-sxm4-80gb")], ignore_index=True)
    pred, lo, hi = predictor.predict_ops(query)
    assert pred[:2] == pytest.approx(np.exp(corr.shifts["gemm"]))
    assert pred[2:4] == pytest.approx(np.exp(corr.shifts["vector"]))
    np.testing.assert_array_equal(pred[4:], [1.0, 1.0])  # another GPU: untouched
    assert (lo <= pred).all() and (pred <= hi).all()
    assert hi[2] == pytest.approx(1.25 * pred[2])  # few ops: the model's interval, shifted
    applied = predictor.applied_calibrations(query)
    assert applied.dtype == object and applied.tolist() == [corr.label] * 4 + ["", ""]
    assert corr.label.startswith("h100-sxm5-80gb@") and CALIBRATION_COLUMN == "calibration"


def test_bad_inputs() -> None:
    with pytest.raises(SpecError, match="no usable measured ops"):
        fit_correction("t4", _ops(2), np.array([np.nan, -1.0]), np.ones(2))
    with pytest.raises(BundleError, match="not a perfcast GPU correction"):
        GpuCorrection.from_json('{"gpu": "t4"}')
    assert MIN_OPS_FOR_SPREAD > 5
    assert load_corrections("/nonexistent/perfcast", "flat") == {}


def _gemms(dims: np.ndarray, gpu: str = "t4") -> pd.DataFrame:
    return pd.DataFrame({"op": "matmul", "m": dims[:, 0], "n": dims[:, 1], "k": dims[:, 2], "gpu": gpu})


def test_residual_model_corrects_a_shape_dependent_error_and_round_trips() -> None:
    rng = np.random.default_rng(0)
    law = lambda ops: np.where(ops["m"] >= 512, 0.4, -0.3)  # noqa: E731  log(measured/predicted) by shape
    train = _gemms(np.exp(rng.uniform(np.log(16), np.log(8192), size=(40, 3))).astype(int))
    corr = fit_correction("t4", train, np.exp(law(train)), np.ones(len(train)))
    assert set(corr.residual) == {"gemm"} and len(corr.residual["gemm"]["alpha"]) == 40
    query = _gemms(np.exp(rng.uniform(np.log(16), np.log(8192), size=(200, 3))).astype(int))
    with_shape = np.abs(corr.log_factors(query) - law(query)).mean()
    shift_only = np.abs(corr.shifts["gemm"] - law(query)).mean()
    assert with_shape < 0.6 * shift_only
    assert GpuCorrection.from_json(corr.to_json()).log_factors(query) == pytest.approx(corr.log_factors(query))

    few = fit_correction("t4", train[:MIN_OPS_FOR_SLOPES - 1], np.exp(law(train[:MIN_OPS_FOR_SLOPES - 1])),
                         np.ones(MIN_OPS_FOR_SLOPES - 1))  # fmt: skip
    assert "trend_slopes" not in few.residual["gemm"]  # too few ops for a trend
    far = _gemms(np.array([[1, 1, 1]]))  # no measured op nearby: the shift alone
    assert few.log_factors(far)[0] == pytest.approx(few.shifts["gemm"], abs=5e-3)
    assert corr.log_factors(pd.DataFrame({"op": ["add"], "rows": [4], "cols": [4], "gpu": "t4"}))[0] == 0.0


def test_trend_follows_a_size_law_and_is_held_flat_outside_the_measured_range() -> None:
    rng = np.random.default_rng(1)
    train = _gemms(np.exp(rng.uniform(np.log(64), np.log(2048), size=(20, 3))).astype(int))
    flops = 2.0 * train["m"] * train["n"] * train["k"]
    law = 0.05 * (np.log(flops) - np.log(flops).mean())  # efficiency falls 5% per e-fold of FLOPs
    corr = fit_correction("t4", train, np.exp(law), np.ones(len(train)))
    gp = corr.residual["gemm"]
    assert 0 < gp["trend_slopes"][0] <= 0.05 + 1e-9  # the GP carries the rest of the smooth law
    inside = _gemms(np.array([[512, 512, 512]]))
    expected = 0.05 * (np.log(2.0 * 512**3) - np.log(flops).mean())
    assert corr.log_factors(inside)[0] == pytest.approx(expected, abs=0.05)
    huge, largest = _gemms(np.array([[10**6, 10**6, 10**6]])), _gemms(np.array([[2048, 2048, 2048]]))
    assert corr.log_factors(huge)[0] < 0.05 * (np.log(2.0 * 2048**3) - np.log(flops).mean()) + 0.05
    assert abs(corr.log_factors(huge)[0]) < 1.0 and np.isfinite(corr.log_factors(largest)[0])


def test_schema_2_corrections_still_apply() -> None:
    v2 = {"schema_version": 2, "gpu": "t4", "shifts": {"gemm": 0.1}, "n_ops": {"gemm": 1}, "spread": {},
          "model": "", "created_utc": "", "residual": {"gemm": {
              "kinds": ["matmul"], "x": [[0.0, np.log(64), np.log(64), np.log(64)]], "alpha": [1.0],
              "length_scale": 1.5, "prior_var": 0.1}}}  # fmt: skip
    corr = GpuCorrection.from_json(json.dumps(v2))
    at_point, far = _gemms(np.array([[64, 64, 64]])), _gemms(np.array([[1, 1, 1]]))
    assert corr.log_factors(at_point)[0] == pytest.approx(0.1 + 0.1 * 1.0)
    assert corr.log_factors(far)[0] == pytest.approx(0.1, abs=1e-3)


def test_trees_follow_a_sharp_kernel_switch_that_the_gp_smooths_over() -> None:
    rng = np.random.default_rng(2)
    law = lambda ops: np.where((ops["k"] >= 1024) & (ops["m"] < 256), 0.5, 0.0)  # noqa: E731  a kernel switch

    def draw(n: int) -> pd.DataFrame:
        return _gemms(np.exp(rng.uniform(np.log(16), np.log(8192), size=(n, 3))).astype(int))

    train, query = draw(400), draw(400)
    noise = rng.normal(0.0, 0.02, len(train))
    many = fit_correction("t4", train, np.exp(law(train) + noise), np.ones(len(train)))
    few = fit_correction("t4", train[: MIN_OPS_FOR_TREES - 1], np.exp(law(train) + noise)[: MIN_OPS_FOR_TREES - 1],
                         np.ones(MIN_OPS_FOR_TREES - 1))  # fmt: skip
    assert set(many.trees) == {"gemm"} and few.trees == {}
    err_many = np.abs(many.log_factors(query) - law(query)).mean()
    err_few = np.abs(few.log_factors(query) - law(query)).mean()
    assert err_many < 0.5 * err_few
    # the interval is the cross-fitted spread: about as wide as the error on new shapes
    spread = np.asarray(many.spread["gemm"])
    assert np.quantile(np.abs(spread), 0.9) > np.quantile(np.abs(noise), 0.9)
    assert GpuCorrection.from_json(many.to_json()).log_factors(query) == pytest.approx(many.log_factors(query))


def test_correct_scales_the_median_and_uses_the_measured_spread() -> None:
    ops = _ops(30)
    corr = fit_correction("t4", ops, np.full(30, 2.0), np.ones(30))
    pred, lo, hi = corr.correct(ops.iloc[:3], np.ones(3), np.full(3, 0.5), np.full(3, 3.0))
    assert pred == pytest.approx(np.full(3, np.exp(corr.shifts["gemm"])))
    assert (lo <= pred).all() and (hi >= pred).all() and (hi < 3.0).all()  # the GPU's own spread, narrower
    vec = pd.DataFrame({"op": ["add"], "rows": [4], "cols": [4], "gpu": "t4"})
    assert corr.correct(vec, np.ones(1), np.full(1, 0.5), np.full(1, 3.0))[2][0] == 3.0  # no vector correction


class _Other(_Flat):
    name = "other"


class _Bundle(_Flat):
    name = "bundle:mine"

    def __init__(self, manifest: dict) -> None:
        self.manifest = manifest


def test_predictor_identity_names_the_predictor_and_hashes_its_manifest() -> None:
    assert predictor_identity(_Flat()) == "flat"
    one, two = _Bundle({"created_utc": "a", "models": {}}), _Bundle({"created_utc": "b", "models": {}})
    assert (
        predictor_identity(one).startswith("bundle:mine@") and len(predictor_identity(one)) == len("bundle:mine@") + 12
    )
    assert predictor_identity(one) != predictor_identity(two)  # a retrained bundle is another predictor
    assert predictor_identity(one) == predictor_identity(_Bundle({"models": {}, "created_utc": "a"}))
    steps = StepPredictor(one, name="composed:bundle:mine")
    assert predictor_identity(steps) == "composed:bundle:mine@" + predictor_identity(one).split("@")[1]
    assert predictor_identity(StepPredictor.analytic()) == "analytic"
    assert predictor_identity(CalibratedPredictor(one, {})) == predictor_identity(one)


def test_a_correction_fitted_for_another_predictor_is_not_applied(tmp_path: Path, caplog) -> None:
    corr = fit_correction("t4", _ops(5), np.full(5, 2.0), np.ones(5), model="flat", predictor="flat")
    path = save_correction(corr, tmp_path)
    assert path.name == "t4--flat.json"
    other = fit_correction("t4", _ops(5), np.full(5, 4.0), np.ones(5), model="other", predictor="other")
    save_correction(other, tmp_path)  # both predictors' corrections of one GPU are kept
    assert load_corrections(tmp_path, "flat") == {"t4": corr}
    assert load_corrections(tmp_path, "other") == {"t4": other}

    calibrated = CalibratedPredictor(_Other(), {"t4": corr})
    assert calibrated.corrections == {} and calibrated.name == "other"
    pred, _, _ = calibrated.predict_ops(_ops(2, gpu="t4"))
    np.testing.assert_array_equal(pred, [1.0, 1.0])
    assert calibrated.applied_calibrations(_ops(2, gpu="t4")).tolist() == ["", ""]
    with caplog.at_level(logging.INFO, logger="perfcast"):
        assert load_corrections(tmp_path, "third") == {}
        load_corrections(tmp_path, "third")
    messages = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert len(messages) == 2 and all("third" in m for m in messages)  # once per file, not per load


def test_a_file_without_predictor_key_is_read_but_never_applied(tmp_path: Path, caplog) -> None:
    v4 = {"schema_version": 4, "gpu": "t4", "shifts": {"gemm": 0.5}, "n_ops": {"gemm": 3}, "spread": {},
          "model": "bundle:default_bundle", "created_utc": "2025-01-01", "residual": {}, "trees": {}}  # fmt: skip
    (tmp_path / "t4.json").write_text(json.dumps(v4))
    with caplog.at_level(logging.WARNING, logger="perfcast"):
        assert load_corrections(tmp_path, "bundle:default_bundle@abc") == {}
    assert any("names no predictor" in r.getMessage() and "t4.json" in r.getMessage() for r in caplog.records)
    assert GpuCorrection.from_json(json.dumps(v4)).shifts == {"gemm": 0.5}


def test_implausible_and_outlying_measurements_are_named_and_left_out() -> None:
    measured = np.r_[np.full(8, 2.0), 1e-300, 2.0 * 40, np.inf]
    corr = fit_correction("t4", _ops(11), measured, np.ones(11), predictor="flat",
                          labels=[f"op {i}" for i in range(11)])  # fmt: skip
    assert corr.n_ops == {"gemm": 8}
    assert corr.shifts["gemm"] == pytest.approx(shrunk_shift(np.log(np.full(8, 2.0))))
    assert len(corr.excluded) == 3
    assert "op 8: measured_ms=1e-300" in corr.excluded[0]
    assert "op 10: measured_ms=inf" in corr.excluded[1]
    assert corr.excluded[2].startswith("op 9: outlier")
    with pytest.raises(SpecError, match=r"no usable measured ops to calibrate t4: row 0: measured_ms=0"):
        fit_correction("t4", _ops(2), np.array([0.0, 5000.0]), np.ones(2), predictor="flat")


def _stored(**change) -> str:
    base = json.loads(fit_correction("t4", _gemms(np.full((12, 3), 64) * np.arange(1, 13)[:, None]),
                                     np.full(12, 2.0), np.ones(12), predictor="flat").to_json())  # fmt: skip
    for path, value in change.items():
        *parents, last = path.split("__")
        node = base
        for key in parents:
            node = node[key]
        node[last] = value
    return json.dumps(base)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"shifts__gemm": float("nan")}, "shifts.gemm"),
        ({"shifts__gemm": "0.1"}, "shifts.gemm"),
        ({"shifts__gemm": 50.0}, "shifts.gemm"),
        ({"n_ops__gemm": -3}, "n_ops.gemm"),
        ({"gpu": ""}, "gpu"),
        ({"predictor": 7}, "predictor"),
        ({"spread__gemm": [0.3, 0.1]}, "spread.gemm"),
        ({"residual__gemm__length_scale": -1.0}, "residual.gemm.length_scale"),
        ({"residual__gemm__alpha": [float("inf")] * 12}, "residual.gemm.alpha[0]"),
        ({"residual__gemm__x": [[1.0]] * 12}, "residual.gemm.x[0]"),
        ({"residual__gemm__trend_slopes": [0.1]}, "residual.gemm.trend_slopes"),
        ({"trees": {"gemm": {"kinds": ["matmul"], "booster": "not a model"}}}, "trees.gemm.booster"),
        ({"surprise": 1}, "unknown field"),
    ],
)
def test_a_stored_correction_with_a_bad_field_is_refused_naming_file_and_field(change, field) -> None:
    assert GpuCorrection.from_json(_stored()).shifts  # the unchanged one loads
    with pytest.raises(BundleError, match="^/cal/t4.json: ") as err:
        GpuCorrection.from_json(_stored(**change), where="/cal/t4.json")
    assert field in str(err.value)


def test_corrupt_files_in_the_store_are_refused(tmp_path: Path) -> None:
    (tmp_path / "t4--flat.json").write_text("{")
    with pytest.raises(BundleError, match="t4--flat.json: invalid JSON"):
        load_corrections(tmp_path, "flat")
    (tmp_path / "t4--flat.json").write_text("[1, 2]")
    with pytest.raises(BundleError, match="not a JSON object"):
        load_corrections(tmp_path, "flat")
    (tmp_path / "t4--flat.json").write_bytes(b"\xff\xfe")
    with pytest.raises(BundleError, match="cannot read"):
        load_corrections(tmp_path, "flat")


def test_a_gemm_correction_applies_to_the_dtype_family_it_measured() -> None:
    measured_ops = _ops(30).assign(dtype="bf16")
    corr = fit_correction("h100-sxm5-80gb", measured_ops, np.full(30, 1.5), np.ones(30), predictor="flat")
    assert set(corr.shifts) == {"gemm@16-bit"}
    predictor = CalibratedPredictor(_Flat(), {"h100-sxm5-80gb": corr})
    query = pd.concat([_ops(2).assign(dtype=d) for d in ("bf16", "fp16", "fp32", "fp8")], ignore_index=True)
    pred, lo, hi = predictor.predict_ops(query)
    assert pred[:4] == pytest.approx(np.exp(corr.shifts["gemm@16-bit"]))  # bf16 and fp16: one family
    np.testing.assert_array_equal(pred[4:], 1.0)  # fp32 and fp8 GEMMs were not measured: the model's own
    np.testing.assert_array_equal(hi[4:], 1.25)
    assert predictor.applied_calibrations(query).tolist() == [corr.label] * 4 + [""] * 4


def test_a_correction_stored_per_class_still_applies_to_every_dtype() -> None:
    whole = GpuCorrection(gpu="h100-sxm5-80gb", shifts={"gemm": float(np.log(2.0))}, n_ops={"gemm": 5},
                          predictor="flat")  # fmt: skip
    query = pd.concat([_ops(1).assign(dtype=d) for d in ("bf16", "fp32")], ignore_index=True)
    pred, _, _ = CalibratedPredictor(_Flat(), {"h100-sxm5-80gb": whole}).predict_ops(query)
    assert pred == pytest.approx([2.0, 2.0])
