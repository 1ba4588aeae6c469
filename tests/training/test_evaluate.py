"""Leave-one-GPU-out evaluation and the few-shot curve on synthetic data."""

from __future__ import annotations

import numpy as np
from fixtures.make_fixtures import synthetic_op_records

from perfcast.features.op_features import featurize_ops
from perfcast.models.op_model import OpTimeRegressor
from perfcast.training.evaluate import (
    CALIBRATION_LEVELS,
    evaluate_logo,
    evaluation_class,
    few_shot_curve,
    markdown_table,
)


def test_logo_table_has_every_gpu_class_and_predictor() -> None:
    records = synthetic_op_records(n_per_gpu=80)
    y = records["measured_ms"].to_numpy()
    classes = evaluation_class(records, featurize_ops(records)["op_class"])
    result = evaluate_logo(
        records, y, eval_class=classes,
        make_model=lambda: OpTimeRegressor(n_estimators=20, n_jobs=1, max_rows_per_gpu=200),
    )  # fmt: skip
    assert set(result.table["gpu"]) == set(records["gpu"])
    assert set(result.table["predictor"]) == {"model", "roofline", "efficiency"}
    assert set(result.table["eval_class"]) == {"gemm_fp32", "vector"}
    assert len(result.predictions) == len(records)
    for level in CALIBRATION_LEVELS:
        assert (result.predictions[f"lo@{level}"] <= result.predictions["model"]).all()
    model = result.table[result.table["predictor"] == "model"]
    assert model["coverage"].between(0, 1).all()
    assert "| gemm_fp32 |" in markdown_table(result)

    curve = few_shot_curve(result.predictions, records, ks=(0, 5, 20), seeds=2)
    assert set(curve["k"]) == {0, 5, 20}
    # a per-GPU shift fitted on 20 ops of the synthetic law (one efficiency per GPU) must help
    median = curve.groupby("k")["mape"].median()
    assert median[20] <= median[0]
    assert np.isfinite(curve["mape"]).all()
