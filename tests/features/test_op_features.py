"""featurize_ops / FEATURE_SPEC."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import SpecError, UnknownEntryError
from perfcast.features.hardware import HardwareSpec
from perfcast.features.op_features import (
    FEATURE_SPEC,
    FEATURE_SPEC_VERSION,
    GATHER_CYCLES_PER_ELEMENT,
    META_COLUMNS,
    featurize_ops,
)
from perfcast.features.roofline import roofline_time_s

OPS = pd.DataFrame(
    [
        {"op": "matmul", "batch": 1, "m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "gpu": "h100-sxm5-80gb"},
        {"op": "linear", "batch": 1, "m": 100, "n": 130, "k": 64, "dtype": "fp32", "gpu": "NVIDIA A100-SXM4-80GB"},
        {"op": "softmax", "rows": 8192, "cols": 1024, "dtype": "fp16", "gpu": "a100-sxm4-80gb"},
        {"op": "add", "rows": 1, "cols": 1000, "scalar": True, "dtype": "fp32", "gpu": "t4"},
        {"op": "attention", "batch": 2, "heads": 32, "kv_heads": 8, "seq_q": 2048, "seq_kv": 2048, "head_dim": 128,
         "causal": True, "dtype": "bf16", "gpu": "h100-sxm5-80gb"},
        {"op": "embedding", "rows": 4096, "cols": 4096, "dtype": "bf16", "gpu": "h100-sxm5-80gb"},
        {"op": "optimizer", "rows": 1, "cols": 10**8, "dtype": "bf16", "gpu": "mi300x"},
        {"op": "allreduce", "bytes": 1 << 26, "n_ranks": 16, "ranks_per_node": 8, "dtype": "bf16",
         "gpu": "h100-sxm5-80gb"},
    ],
    index=[10, 11, 12, 13, 14, 15, 16, 17],
)  # fmt: skip
CLASSES = ["gemm", "gemm", "vector", "vector", "attention", "vector", "vector", "collective"]


@pytest.fixture(scope="module")
def feats() -> pd.DataFrame:
    return featurize_ops(OPS)


def test_spec():
    assert FEATURE_SPEC.version == FEATURE_SPEC_VERSION == 3
    assert set(FEATURE_SPEC.columns) == {"gemm", "attention", "vector", "collective"}
    for cols in FEATURE_SPEC.columns.values():
        assert len(cols) == len(set(cols))
    assert len(FEATURE_SPEC.all_columns) == len(set(FEATURE_SPEC.all_columns))


def test_columns_and_classes(feats):
    assert list(feats.columns) == [*META_COLUMNS, *FEATURE_SPEC.all_columns]
    assert list(feats.index) == list(OPS.index)
    assert list(feats["op_class"]) == CLASSES
    assert feats.loc[11, "gpu_id"] == "a100-sxm4-80gb"
    assert feats.loc[16, "vendor"] == "AMD" and feats.loc[16, "is_amd"] == 1.0


def test_class_columns_filled_and_others_nan(feats):
    spec_cols = set(FEATURE_SPEC.all_columns)
    for idx, cls in zip(OPS.index, CLASSES, strict=True):
        own = list(FEATURE_SPEC.columns[cls])
        assert feats.loc[idx, own].notna().all(), (idx, feats.loc[idx, own][feats.loc[idx, own].isna()])
        others = sorted(spec_cols - set(own))
        assert feats.loc[idx, others].isna().all(), (idx, cls)


def test_roofline_uses_dtype_peak(feats):
    h100 = HardwareSpec.from_name("h100-sxm5-80gb")
    flops = 2 * 4096**3
    assert feats.loc[10, "roofline_ms"] == pytest.approx(flops / (h100.peak_tflops("bf16") * 1e12) * 1e3)
    a100 = HardwareSpec.from_name("a100-sxm4-80gb")
    expected = roofline_time_s(OPS.loc[[11]].assign(gpu="a100-sxm4-80gb"), a100)[0] * 1e3
    assert feats.loc[11, "roofline_ms"] == pytest.approx(expected)
    # fp32 GEMM: the fp32 (vector) figure, not TF32 tensor cores
    assert feats.loc[11, "ridge"] != feats.loc[11, "ridge"]  # NaN: ridge is a vector-class column
    ai = feats.loc[11, "flops"] / feats.loc[11, "mem_bytes"]
    ridge = a100.peak_tflops("fp32") * 1e12 / (a100.mem_bw_gbps * 1e9)
    assert feats.loc[11, "l_ai_over_ridge"] == pytest.approx(np.log(ai / ridge))
    assert np.isnan(feats.loc[17, "roofline_ms"])


def test_issue_time_of_embedding_forwards_only(feats):
    h100 = HardwareSpec.from_name("h100-sxm5-80gb")
    cycles_per_ms = h100.sm_count * h100.boost_clock_mhz * 1e3
    assert feats.loc[15, "issue_ms"] == pytest.approx(4096 * 4096 * GATHER_CYCLES_PER_ELEMENT / cycles_per_ms)
    assert feats.loc[15, "issue_ms"] > feats.loc[15, "roofline_ms"]  # an H100 gather is issue-bound
    assert (feats.drop(index=15)["issue_ms"] == 0).all()
    backward = featurize_ops(OPS.loc[[15]].assign(backward=True))
    assert backward["issue_ms"].iloc[0] == 0
    # a GPU without a boost clock takes its nearest same-vendor entry's (H200: the H100's)
    h200 = featurize_ops(OPS.loc[[15]].assign(gpu="h200-sxm-141gb"))
    assert HardwareSpec.from_name("h200-sxm-141gb").boost_clock_mhz is None
    assert h200["issue_ms"].iloc[0] == pytest.approx(feats.loc[15, "issue_ms"])


def test_wave_features(feats):
    h100 = HardwareSpec.from_name("h100-sxm5-80gb")
    tiles128 = (4096 // 128) ** 2
    assert feats.loc[10, "l_waves128"] == pytest.approx(np.log(tiles128 / h100.sm_count))
    waves = tiles128 / h100.sm_count
    assert feats.loc[10, "wave_eff128"] == pytest.approx(waves / np.ceil(waves))
    assert feats.loc[10, "tile_eff128"] == 1.0
    # 100 x 130 output: one 256 tile, 2 x 3 tiles of 64
    assert feats.loc[11, "tile_eff64"] == pytest.approx(100 * 130 / (2 * 3 * 64 * 64))
    assert feats.loc[11, "wave_eff256"] == pytest.approx(1 / 108)
    for col in ("wave_eff64", "wave_eff128", "wave_eff256", "tile_eff64", "tile_eff128", "tile_eff256"):
        values = feats.loc[[10, 11], col]
        assert ((values > 0) & (values <= 1)).all()
    assert 0 < feats.loc[14, "wave_eff128"] <= 1
    assert feats.loc[14, "l_gqa"] == pytest.approx(np.log(4))
    assert feats.loc[14, "is_causal"] == 1.0
    assert 0 < feats.loc[12, "row_wave_eff"] <= 1
    assert feats.loc[13, "is_scalar"] == 1.0 and feats.loc[13, "is_binary"] == 0.0


def test_unknown_gpu_names_rows():
    bad = OPS.iloc[:3].assign(gpu=["t4", "rtx-9999", "rtx-9999"], dtype="fp16")
    with pytest.raises(UnknownEntryError, match=r"rtx-9999.*rows 11, 12"):
        featurize_ops(bad)


def test_unknown_op_and_dtype_name_rows():
    with pytest.raises(SpecError, match=r"op='conv'.*row 11"):
        featurize_ops(OPS.iloc[:2].assign(op=["matmul", "conv"]))
    with pytest.raises(SpecError, match=r"dtype='int4'.*row 10"):
        featurize_ops(OPS.iloc[:2].assign(dtype=["int4", "fp32"]))


def test_pure_and_deterministic():
    before = OPS.copy()
    a = featurize_ops(OPS)
    b = featurize_ops(OPS.sample(frac=1.0, random_state=0)).loc[OPS.index]
    pd.testing.assert_frame_equal(OPS, before)
    pd.testing.assert_frame_equal(a, b)


def test_nullable_flags():
    mixed = OPS.iloc[:4].assign(scalar=pd.array([pd.NA, pd.NA, False, True], dtype="boolean"))
    pd.testing.assert_frame_equal(featurize_ops(mixed), featurize_ops(OPS.iloc[:4]))
