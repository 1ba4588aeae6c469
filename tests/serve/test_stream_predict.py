"""Streaming prediction: chunk by chunk, same answers as one batch, stable breakdown columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.tables import read_table
from perfcast.models.step_predictor import StepPredictor
from perfcast.serve.batch import predict_steps_table
from perfcast.serve.stream_predict import BREAKDOWN_COLUMNS, stream_predict

GOOD = {"model": "gpt3-125m", "gpu": "h100-sxm5-80gb", "dp": 2, "micro_batch": 2, "global_batch": 8}
RUNS = pd.DataFrame([GOOD, {**GOOD, "tp": 2, "dp": 1, "global_batch": 4}, {**GOOD, "tp": 5}, {**GOOD, "pp": 2,
                     "dp": 1, "global_batch": 4}, GOOD])  # fmt: skip


def test_chunks_give_the_batch_answers_in_order(tmp_path: Path) -> None:
    src, out = tmp_path / "runs.csv", tmp_path / "out.parquet"
    RUNS.to_csv(src, index=False)
    seen: list[int] = []
    result = stream_predict(src, out, "steps", StepPredictor.analytic(), breakdown=True, chunk_rows=2,
                            progress=seen.append, preview_rows=3)  # fmt: skip
    assert seen == [2, 2, 1] and result.rows == 5 and result.n_errors == 1 and len(result.preview) == 3
    got = read_table(out)
    expected = predict_steps_table(RUNS, breakdown=True)
    np.testing.assert_allclose(got["step_ms"], expected["step_ms"], rtol=1e-12)
    assert list(got.columns[-len(BREAKDOWN_COLUMNS) - 1 : -1]) == list(BREAKDOWN_COLUMNS)
    valid = got["error"].fillna("") == ""
    comm = [c for c in BREAKDOWN_COLUMNS if c.startswith("comm_")]
    parts = got.loc[valid, ["compute_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms", *comm]].sum(axis=1)
    np.testing.assert_allclose(parts, got.loc[valid, "step_ms"], rtol=1e-9)


def test_a_chunk_of_only_bad_rows_keeps_the_columns(tmp_path: Path) -> None:
    from perfcast.serve.predictors import load_op_predictor, load_step_predictor

    runs = pd.DataFrame([GOOD, GOOD, {**GOOD, "tp": 5}, {**GOOD, "tp": 5}])  # second chunk all invalid
    runs.to_csv(tmp_path / "runs.csv", index=False)
    done = stream_predict(tmp_path / "runs.csv", tmp_path / "r.csv", "steps", load_step_predictor(None), chunk_rows=2)
    got = pd.read_csv(tmp_path / "r.csv")
    assert done.n_errors == 2 and got["out_of_domain"].isna().tolist() == [False, False, True, True]

    ops = pd.DataFrame({"op": ["matmul", "matmul"], "m": [512, 0], "n": [512, 512], "k": [512, 512],
                        "gpu": ["a100-sxm4-80gb"] * 2, "dtype": ["fp16"] * 2})  # fmt: skip
    ops.to_csv(tmp_path / "ops.csv", index=False)
    done = stream_predict(tmp_path / "ops.csv", tmp_path / "o.csv", "ops", load_op_predictor(None), chunk_rows=1)
    got = pd.read_csv(tmp_path / "o.csv")
    assert done.n_errors == 1 and "out_of_domain" in got.columns and len(got) == 2
