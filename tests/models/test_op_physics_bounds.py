"""Physical bounds of predicted op times: never below the roofline, never above the efficiency ceiling.

The sweep covers every catalog GPU x every compute op class (several ops each) x a small
grid of shapes x the dtypes whose peak the GPU's catalog entry has, for the shipped
default op predictor and the analytic one (one batch per predictor, so it stays fast).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import OutOfDomainWarning, SpecError
from perfcast.features.hardware import HardwareSpec, list_hardware
from perfcast.features.roofline import roofline_time_s
from perfcast.models.analytic import AnalyticOpPredictor
from perfcast.serve.predictors import load_op_predictor

TENSOR_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4", "mxfp4")
VECTOR_DTYPES = ("fp32", "fp16", "bf16")
GEMM_SHAPES = (  # (op, batch, m, n, k)
    ("matmul", 1, 128, 128, 128),
    ("matmul", 1, 8192, 8192, 8192),
    ("linear", 1, 16384, 4096, 14336),
    ("linear", 1, 1, 4096, 4096),
    ("bmm", 64, 1024, 1024, 128),
)
VECTOR_OPS = ("add", "mul", "div", "pow", "relu", "gelu", "silu", "tanh", "softmax", "layernorm", "rmsnorm",
              "embedding", "optimizer")  # fmt: skip
VECTOR_SHAPES = ((1, 1), (4096, 4096), (32768, 8192))
ATTENTION_SHAPES = (  # (batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal)
    (1, 8, 8, 128, 128, 64, False),
    (4, 32, 8, 4096, 4096, 128, True),
    (32, 32, 8, 1, 4096, 128, False),
)
REL_TOL = 1e-9


def _has_peak(gpu: HardwareSpec, dtype: str, tensor: bool) -> bool:
    try:
        (gpu.peak_tflops if tensor else gpu.vector_tflops)(dtype)
    except SpecError:
        return False
    return True


def _sweep() -> pd.DataFrame:
    rows = []
    for gpu in list_hardware():
        for dtype in TENSOR_DTYPES:
            if not _has_peak(gpu, dtype, tensor=True):
                continue
            for op, b, m, n, k in GEMM_SHAPES:
                rows.append({"op": op, "batch": b, "m": m, "n": n, "k": k, "dtype": dtype, "gpu": gpu.id})
            if dtype in ("fp16", "bf16", "fp32"):
                for b, h, kvh, sq, skv, hd, causal in ATTENTION_SHAPES:
                    shape = {"batch": b, "heads": h, "kv_heads": kvh, "seq_q": sq, "seq_kv": skv, "head_dim": hd}
                    rows.append({"op": "attention", **shape, "causal": causal, "dtype": dtype, "gpu": gpu.id})
        for dtype, op, (r, c) in itertools.product(VECTOR_DTYPES, VECTOR_OPS, VECTOR_SHAPES):
            if _has_peak(gpu, dtype, tensor=False):
                rows.append({"op": op, "rows": r, "cols": c, "scalar": False, "dtype": dtype, "gpu": gpu.id})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def sweep() -> pd.DataFrame:
    ops = _sweep()
    assert len(ops) > 1000
    return ops


@pytest.fixture(scope="module")
def roofline_ms(sweep) -> np.ndarray:
    out = np.empty(len(sweep))
    for gpu, idx in sweep.groupby("gpu").indices.items():
        out[idx] = roofline_time_s(sweep.iloc[idx], HardwareSpec.from_name(gpu)) * 1e3
    return out


def test_sweep_covers_every_gpu_and_class(sweep):
    assert {g.id for g in list_hardware() if g.peak_fp32_tflops is not None} <= set(sweep["gpu"])
    assert {"matmul", "linear", "bmm", "attention", "add", "layernorm"} <= set(sweep["op"])
    # the block-scaled dtypes appear only where the GPU has block-scaled tensor cores
    fp4 = sweep.loc[sweep["dtype"] == "mxfp4", "gpu"].unique()
    assert all(HardwareSpec.from_name(g).peak_fp4_tflops is not None for g in fp4)


def test_default_op_predictor_obeys_the_physical_bounds(sweep, roofline_ms):
    predictor = load_op_predictor(None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutOfDomainWarning)  # most of the sweep extrapolates on purpose
        pred, lo, hi = predictor.predict_ops(sweep)
    learned = np.zeros(len(sweep), dtype=bool)
    ceiling = np.ones(len(sweep))
    op_model = getattr(predictor, "op_model", None)
    if op_model is not None:
        from perfcast.features.op_features import featurize_ops

        classes = featurize_ops(sweep)["op_class"].to_numpy()
        learned = np.isin(classes, list(op_model.boosters_))
        if learned.any():
            ceiling[learned] = op_model.efficiency_ceilings(sweep.loc[learned])
    for name, values in (("pred", pred), ("lo", lo), ("hi", hi)):
        bad = ~(np.isfinite(values) & (values > 0))
        assert not bad.any(), f"{name}: {int(bad.sum())} non-finite or non-positive, e.g. {sweep[bad].head(3)}"
    assert np.all(lo <= pred) and np.all(pred <= hi)
    below = pred < roofline_ms * (1 - REL_TOL)
    assert not below.any(), f"{int(below.sum())} predictions below the roofline:\n{sweep[below].head()}"
    assert np.all(lo >= roofline_ms / ceiling * (1 - REL_TOL)), "an interval's lower end is below the floor"
    assert np.all((0 < ceiling) & (ceiling <= 1))
    efficiency = roofline_ms / pred
    assert np.all(efficiency <= ceiling * (1 + REL_TOL)), "an efficiency above the ceiling"


def test_analytic_op_predictor_is_the_roofline(sweep, roofline_ms):
    pred, lo, hi = AnalyticOpPredictor().predict_ops(sweep)
    assert np.all(np.isfinite(pred) & (pred > 0))
    np.testing.assert_allclose(pred, roofline_ms, rtol=1e-12)  # efficiency exactly 1, the ceiling
    assert np.isnan(lo).all() and np.isnan(hi).all()  # no interval, by contract
