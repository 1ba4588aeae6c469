"""Every shipped op and step predictor satisfies its protocol: one predict method whose
times, bounds and flags line up row by row, ``lo <= median <= hi``, and capability
attributes that say what the answers carry."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import perfcast.models
from perfcast.errors import OutOfDomainWarning
from perfcast.features.run_config import parse_run_row
from perfcast.models.analytic import AnalyticOpPredictor
from perfcast.models.bundle import PredictorBundle, load_bundle
from perfcast.models.calibration import CalibratedPredictor, fit_correction, predictor_identity
from perfcast.models.predictor_protocol import OpPrediction, OpPredictor, StepTimePredictor
from perfcast.models.step_calibration import CalibratedStepPredictor, config_cluster_key, fit_step_correction
from perfcast.models.step_predictor import OUT_OF_DOMAIN_COLUMN, StepPredictor

H100 = "h100-sxm5-80gb"
OPS = pd.DataFrame(
    [
        {"op": "matmul", "batch": 1, "m": 4096, "n": 4096, "k": 4096},
        {"op": "linear", "batch": 1, "m": 2048, "n": 11008, "k": 4096},
        {"op": "bmm", "batch": 32, "m": 512, "n": 512, "k": 128},
        {"op": "layernorm", "rows": 8192, "cols": 4096},
        {"op": "gelu", "rows": 8192, "cols": 16384},
        {"op": "softmax", "rows": 65536, "cols": 2048},
        {"op": "attention", "batch": 4, "heads": 32, "seq_q": 2048, "seq_kv": 2048, "head_dim": 128, "causal": True},
        {"op": "allreduce", "bytes": 1 << 26, "n_ranks": 8, "ranks_per_node": 8},
        {"op": "matmul", "batch": 1, "m": 8192, "n": 8192, "k": 8192, "gpu": "b200-hgx"},  # outside the op domain
    ]
).assign(dtype="bf16")
OPS["gpu"] = OPS["gpu"].fillna(H100)
OPS["causal"] = OPS["causal"].fillna(False).astype(bool)
RUNS = [
    {"model": "llama2-7b", "gpu": H100, "num_gpus": 8, "tp": 2, "dp": 4, "global_batch": 64},
    {"model": "gpt3-1.3b", "gpu": H100, "num_gpus": 8, "pp": 2, "dp": 4, "global_batch": 32},
    {"model": "gpt3-125m", "gpu": "a100-sxm4-80gb", "global_batch": 8},
]


@pytest.fixture(scope="module")
def bundle() -> PredictorBundle:
    return load_bundle(Path(perfcast.models.__file__).parent / "default_bundle")


def _op_predictors(bundle: PredictorBundle) -> dict[str, OpPredictor]:
    rows = OPS.iloc[:6]
    measured = bundle.predict_ops(rows)[0] * 1.3
    corr = fit_correction(H100, rows, measured, bundle.predict_ops(rows)[0], predictor=predictor_identity(bundle))
    return {
        "analytic": AnalyticOpPredictor(),
        "default bundle": bundle,
        "calibrated bundle": CalibratedPredictor(bundle, {H100: corr}),
        "calibrated analytic": CalibratedPredictor(AnalyticOpPredictor(), {}),
    }


def _step_predictors(bundle: PredictorBundle) -> dict[str, StepTimePredictor]:
    learned = bundle.step_predictor()
    configs = [parse_run_row(row) for row in RUNS[:2]]
    corr = fit_step_correction(
        config_cluster_key(configs[0]),
        learned.predict_configs(configs)["step_ms"].to_numpy() * 1.2,
        learned.predict_configs(configs)["step_ms"].to_numpy(),
        predictor=predictor_identity(learned),
    )
    return {
        "analytic": StepPredictor.analytic(),
        "composed": StepPredictor(bundle, bundle.collective_model, name=f"composed:{bundle.name}"),
        "learned": learned,
        "calibrated learned": CalibratedStepPredictor(learned, {corr.cluster: corr}),
    }


def test_every_shipped_op_predictor_satisfies_the_protocol(bundle):
    for label, predictor in _op_predictors(bundle).items():
        assert isinstance(predictor, OpPredictor), label
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OutOfDomainWarning)
            got = predictor.predict_ops_flagged(OPS, coverage=0.8)
            view = predictor.predict_ops(OPS, coverage=0.8)
        assert isinstance(got, OpPrediction), label
        assert [len(a) for a in got] == [len(OPS)] * 4, label
        assert got.out_of_domain.dtype == bool, label
        assert got.out_of_domain.any() == predictor.flags_out_of_domain, label  # the b200 row, for learned ones
        assert (np.isfinite(got.pred_ms) & (got.pred_ms > 0)).all(), label
        bounded = np.isfinite(got.pred_lo_ms) & np.isfinite(got.pred_hi_ms)
        assert bounded.any() == predictor.has_interval, label
        assert (got.pred_lo_ms[bounded] <= got.pred_ms[bounded]).all(), label
        assert (got.pred_ms[bounded] <= got.pred_hi_ms[bounded]).all(), label
        for times, same in zip(got[:3], view, strict=True):
            np.testing.assert_array_equal(times, same)  # predict_ops is the times of predict_ops_flagged


def test_the_calibrated_op_predictor_corrects_only_its_gpu(bundle):
    predictors = _op_predictors(bundle)
    base, calibrated = predictors["default bundle"], predictors["calibrated bundle"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutOfDomainWarning)
        plain, corrected = base.predict_ops_flagged(OPS), calibrated.predict_ops_flagged(OPS)
    on = (OPS["gpu"] == H100).to_numpy() & np.isin(OPS["op"], ["matmul", "linear", "bmm", "layernorm", "gelu"])
    other_gpu = (OPS["gpu"] != H100).to_numpy()
    assert (corrected.pred_ms[on] > plain.pred_ms[on]).all()
    np.testing.assert_array_equal(corrected.pred_ms[other_gpu], plain.pred_ms[other_gpu])
    np.testing.assert_array_equal(corrected.out_of_domain, plain.out_of_domain)


def test_every_shipped_step_predictor_satisfies_the_protocol(bundle):
    configs = [parse_run_row(row) for row in RUNS]
    for label, predictor in _step_predictors(bundle).items():
        assert isinstance(predictor, StepTimePredictor), label
        frame = predictor.predict_configs(configs, coverage=0.8)
        assert len(frame) == len(configs), label
        step, lo, hi = (frame[c].to_numpy(dtype=float) for c in ("step_ms", "step_lo_ms", "step_hi_ms"))
        assert (np.isfinite(step) & (step > 0)).all(), label
        assert (OUT_OF_DOMAIN_COLUMN in frame.columns) == predictor.flags_out_of_domain, label
        if label == "analytic":
            assert np.isnan(lo).all() and np.isnan(hi).all()
        else:
            assert (lo <= step).all() and (step <= hi).all(), label


def test_an_object_without_the_members_is_no_predictor():
    assert not isinstance(object(), OpPredictor)
    assert not isinstance(object(), StepTimePredictor)
    assert not isinstance(StepPredictor.analytic(), OpPredictor)
