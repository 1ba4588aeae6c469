"""Roofline peaks: one catalog lookup per distinct (unit, dtype), the same figures as row by row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfcast.data.schema import DType
from perfcast.errors import SpecError
from perfcast.features.hardware import HardwareSpec
from perfcast.features.op_features import featurize_ops
from perfcast.features.ops import OpClass, op_classes
from perfcast.features.roofline import _peaks_flops, roofline_time_s


def _peaks_row_by_row(kinds: np.ndarray, dtypes: pd.Series, hw: HardwareSpec) -> np.ndarray:
    """Reference: each row's peak looked up on its own."""
    out = []
    for cls, dtype in zip(op_classes(kinds), dtypes, strict=True):
        tensor = cls in (OpClass.GEMM.value, OpClass.ATTENTION.value)
        dt = DType.parse(dtype)
        out.append((hw.peak_tflops(dt) if tensor else hw.vector_tflops(dt)) * 1e12)
    return np.array(out)


@pytest.mark.parametrize("gpu", ["h100-sxm5-80gb", "a100-sxm4-80gb", "mi300x"])
def test_peaks_match_the_row_by_row_lookup(gpu):
    rng = np.random.default_rng(0)
    kinds = rng.choice(np.array(["matmul", "linear", "attention", "softmax", "add", "allreduce"]), 500)
    dtypes = pd.Series(rng.choice(["bf16", "BF16", "bfloat16", "fp32", "float16", "fp16"], 500))
    hw = HardwareSpec.from_name(gpu)
    np.testing.assert_array_equal(_peaks_flops(kinds, dtypes, hw), _peaks_row_by_row(kinds, dtypes, hw))
    assert _peaks_flops(kinds[:0], dtypes[:0], hw).shape == (0,)


def test_unknown_dtype_still_raises():
    hw = HardwareSpec.from_name("h100-sxm5-80gb")
    with pytest.raises(SpecError, match="dtype"):
        _peaks_flops(np.array(["matmul", "add"]), pd.Series(["bf16", "int3"]), hw)


def test_featurized_roofline_equals_roofline_time_per_gpu():
    rng = np.random.default_rng(1)
    n = 300
    ops = pd.DataFrame({
        "op": rng.choice(["matmul", "bmm", "softmax", "add", "attention", "allreduce"], n),
        "batch": rng.integers(1, 8, n), "m": rng.integers(1, 4096, n), "n": rng.integers(1, 4096, n),
        "k": rng.integers(1, 4096, n), "rows": rng.integers(1, 8192, n), "cols": rng.integers(1, 8192, n),
        "heads": 16, "kv_heads": 8, "seq_q": rng.integers(64, 4096, n), "seq_kv": 2048, "head_dim": 128,
        "bytes": 1 << 20, "n_ranks": 8, "ranks_per_node": 8,
        "dtype": rng.choice(["bf16", "fp16", "fp32"], n), "gpu": rng.choice(["h100-sxm5-80gb", "a100-sxm4-80gb"], n),
    })  # fmt: skip
    got = featurize_ops(ops)["roofline_ms"].to_numpy()
    want = np.empty(n)
    for gpu in ops["gpu"].unique():
        rows = (ops["gpu"] == gpu).to_numpy()
        want[rows] = roofline_time_s(ops[rows], HardwareSpec.from_name(gpu)) * 1e3
    np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)
    assert np.isnan(got[(ops["op"] == "allreduce").to_numpy()]).all()
    assert np.isfinite(got[(ops["op"] != "allreduce").to_numpy()]).all()
