"""Streaming prediction: chunk by chunk, same answers as one batch, stable breakdown columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.tables import read_table
from perfcast.models.step_predictor import StepPredictor
from perfcast.serve.batch import BREAKDOWN_COLUMNS, predict_steps_table
from perfcast.serve.stream_predict import stream_predict

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
    parts = got.loc[valid, ["compute_ms", "attention_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms", *comm]].sum(axis=1)
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


def test_parquet_output_whatever_the_chunk_types(tmp_path: Path) -> None:
    """First chunk all invalid (predictions all NaN), an input column int then float then text."""
    runs = pd.DataFrame([{**GOOD, "tp": 5, "tag": 1}, {**GOOD, "tp": 5, "tag": 2}, {**GOOD, "tag": 2.5},
                         {**GOOD, "tag": "x"}, {**GOOD, "tag": None}])  # fmt: skip
    runs.to_csv(tmp_path / "runs.csv", index=False)
    done = stream_predict(tmp_path / "runs.csv", tmp_path / "out.parquet", "steps", StepPredictor.analytic(),
                          chunk_rows=2)  # fmt: skip
    got = read_table(tmp_path / "out.parquet")
    assert done.rows == 5 and len(got) == 5 and done.n_errors == 2
    assert got["step_ms"].isna().tolist() == [True, True, False, False, False]
    assert got["tag"].tolist()[:4] == ["1", "2", "2.5", "x"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "runs.csv"]


def test_zero_row_parquet_input_gives_the_header(tmp_path: Path) -> None:
    RUNS.iloc[:0].to_parquet(tmp_path / "runs.parquet", index=False)
    for out in ("out.parquet", "out.csv"):
        done = stream_predict(tmp_path / "runs.parquet", tmp_path / out, "steps", StepPredictor.analytic())
        got = read_table(tmp_path / out)
        assert done.rows == 0 and got.empty
        assert list(got.columns[: len(RUNS.columns)]) == list(RUNS.columns)
        assert {"step_ms", "step_lo_ms", "step_hi_ms", "error"} <= set(got.columns)


def test_cli_bad_inputs_and_outputs_are_one_line_exit_2(tmp_path: Path) -> None:
    import gzip

    from typer.testing import CliRunner

    from perfcast.serve.cli import app

    RUNS.to_parquet(tmp_path / "runs.parquet", index=False)
    raw = (tmp_path / "runs.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "bad.parquet").write_bytes(raw[:4] + b"\x00" * (len(raw) - 8) + raw[-4:])
    big = pd.concat([RUNS] * 400, ignore_index=True).to_csv(index=False).encode()
    (tmp_path / "cut.csv.gz").write_bytes(gzip.compress(big)[:300])
    (tmp_path / "folder.csv").mkdir()
    cases = [
        ("cut.parquet", "o.csv", "cut.parquet"),
        ("bad.parquet", "o.csv", "bad.parquet"),
        ("cut.csv.gz", "o.csv", "truncated"),
        ("runs.parquet", "folder.csv", "is a folder"),
    ]
    runner = CliRunner()
    for kind in ("steps", "ops"):
        for src, out, match in cases:
            args = [
                "predict",
                kind,
                str(tmp_path / src),
                "-o",
                str(tmp_path / out),
                "--model",
                "analytic",
                "--show",
                "0",
            ]
            result = runner.invoke(app, args)
            assert result.exit_code == 2, (kind, src, result.output)
            assert result.output.strip().startswith("error:") and match in result.output, result.output
            assert "Aborted" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.parquet", "cut.csv.gz", "cut.parquet", "folder.csv",
                                                          "runs.parquet"]  # fmt: skip
