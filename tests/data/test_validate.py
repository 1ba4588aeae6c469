"""Row-level checks of canonical op and run records."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfcast.data.records import REASON_COLUMN
from perfcast.data.validate import check_op_records, check_run_records
from perfcast.errors import DatasetError, UnknownEntryError
from perfcast.features.hardware import resolve_gpu_name


def _ops() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "op": ["matmul", "LayerNorm", "allreduce", "frobnicate", "matmul", "softmax", "attention"],
            "batch": [1, None, None, 1, 1, None, 2],
            "m": [64, None, None, 8, 0, None, None],
            "n": [64, None, None, 8, 8, None, None],
            "k": [64, None, None, 8, 8, None, None],
            "rows": [None, 128, None, None, None, 16, None],
            "cols": [None, 1024, None, None, None, "x", None],
            "bytes": [None, None, 1 << 20, None, None, None, None],
            "n_ranks": [None, None, 8, None, None, None, None],
            "heads": [None, None, None, None, None, None, 8],
            "seq_q": [None, None, None, None, None, None, 128],
            "seq_kv": [None, None, None, None, None, None, 128],
            "head_dim": [None, None, None, None, None, None, 64],
            "causal": [None, None, None, None, None, None, "true"],
            "dtype": ["float32", "bf16", "fp16", "fp32", "fp32", "fp32", "bf16"],
            "gpu": ["NVIDIA A100-SXM4-80GB", "cpu", "a100", "t4", "t4", "t4", "h100"],
            "measured_ms": [0.1, 0.2, 1.5, 0.1, 0.1, 0.1, -1.0],
            "source": "test",
        }
    )


def test_good_rows_are_canonical_and_bad_rows_have_reasons() -> None:
    result = check_op_records(_ops(), resolve_gpu=resolve_gpu_name)
    assert list(result.records["op"]) == ["matmul", "layernorm", "allreduce"]
    assert list(result.records["dtype"]) == ["fp32", "bf16", "fp16"]
    assert list(result.records["gpu"]) == ["a100-sxm4-80gb", "cpu", "a100-sxm4-80gb"]
    assert str(result.records["m"].dtype) == "Int64"
    reasons = result.rejected[REASON_COLUMN]
    assert list(reasons.index) == [3, 4, 5, 6]  # input row positions are kept
    assert "op: " in reasons[3] and "frobnicate" in reasons[3]
    assert "m must be a positive integer for op=matmul" in reasons[4]
    assert "cols is not a whole number" in reasons[5]
    assert "measured_ms must be a positive finite time" in reasons[6]


def test_unknown_gpu_is_rejected_with_the_catalog_message() -> None:
    df = _ops().iloc[[0]].assign(gpu="NVIDIA GeForce GTX 1080 Ti")
    result = check_op_records(df, resolve_gpu=resolve_gpu_name)
    assert result.n_records == 0
    with pytest.raises(UnknownEntryError) as err:
        resolve_gpu_name("NVIDIA GeForce GTX 1080 Ti")
    assert str(err.value) in result.rejected[REASON_COLUMN].iloc[0]


def test_missing_required_column_is_a_dataset_error() -> None:
    with pytest.raises(DatasetError, match="measured_ms"):
        check_op_records(_ops().drop(columns=["measured_ms"]))


def _runs() -> pd.DataFrame:
    base = {
        "num_layers": 24, "hidden_size": 1024, "num_heads": 16, "vocab_size": 50304, "seq_len": 1024, "tp": 1,
        "pp": 1, "dp": 8, "micro_batch": 4, "global_batch": 64, "dtype": "fp16", "gpu": "A100", "num_gpus": 8,
        "timing_scope": "step", "source": "test", "measured_step_ms": 100.0, "recompute": "full",
    }  # fmt: skip
    rows = [dict(base) for _ in range(4)]
    rows[1]["timing_scope"] = "epoch"
    rows[2]["measured_step_ms"] = np.nan
    rows[3]["recompute"] = "sometimes"
    return pd.DataFrame(rows)


def test_run_records() -> None:
    result = check_run_records(_runs(), resolve_gpu=resolve_gpu_name)
    assert result.n_records == 1 and result.records["gpu"].iloc[0] == "a100-sxm4-80gb"
    reasons = list(result.rejected[REASON_COLUMN])
    assert "timing_scope" in reasons[0] and "epoch" in reasons[0]
    assert "no measured time" in reasons[1]
    assert "recompute must be one of none, selective, op-sac, full" in reasons[2]


def test_time_to_train_alone_is_a_measurement() -> None:
    df = _runs().iloc[[0]].assign(measured_step_ms=np.nan, measured_ttt_min=12.5, timing_scope="time_to_train")
    assert check_run_records(df).n_records == 1


cells = st.one_of(st.none(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=6), st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fixed_dictionaries({c: cells for c in _ops().columns}), min_size=1, max_size=8))
def test_never_raises_and_loses_no_row(rows: list[dict[str, object]]) -> None:
    df = pd.DataFrame(rows)
    result = check_op_records(df, resolve_gpu=resolve_gpu_name)
    assert result.n_records + result.n_rejected == len(df)
