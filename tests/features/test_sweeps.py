"""Tests of profiling plans: coverage of the requested families, keys, dedup and a seeded order."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

from perfcast.data.schema import OpType
from perfcast.errors import SpecError
from perfcast.features.sweeps import FAMILIES, KEY_COLUMNS, PLAN_COLUMNS, parse_op_families, plan_key, profile_plan

SMALL = {
    "presets": ["gpt3-125m", "llama3-8b", "mixtral-8x7b"],
    "token_counts": (512, 2048),
    "tp_degrees": (1, 2),
    "seq_lens": (512, 1024),
    "collective_bytes": (2**20, 2**24),
    "collective_ranks": (2, 4),
}


@pytest.fixture(scope="module")
def plan() -> pd.DataFrame:
    return profile_plan(list(FAMILIES), ["bf16", "fp32", "fp8"], **SMALL)


def test_plan_covers_every_requested_family(plan):
    assert list(plan.columns) == list(PLAN_COLUMNS)
    assert set(plan["family"]) == set(FAMILIES)
    for family, ops in FAMILIES.items():
        assert set(plan.loc[plan["family"] == family, "op"]) == {op.value for op in ops}


def test_short_prefix_covers_every_family(plan):
    first = plan.head(len(FAMILIES))
    assert list(first["family"]) == list(FAMILIES)  # round-robin interleave


def test_keys_unique_and_recomputable(plan):
    assert plan["key"].is_unique
    assert plan.head(50).apply(plan_key, axis=1).tolist() == plan["key"].head(50).tolist()
    assert not plan.duplicated(list(KEY_COLUMNS)).any()


def test_key_is_stable_across_versions():
    row = {"op": "matmul", "batch": 1, "m": 512, "n": 4096, "k": 4096, "dtype": "bf16"}
    assert plan_key(row) == plan_key({**row, "rows": 0, "scalar": False, "heads": None})
    canonical = "|".join(
        f"{c}={row.get(c, 'False' if c in ('scalar', 'causal', 'backward') else 0)}" for c in KEY_COLUMNS
    )
    canonical = canonical.replace("=False", "=0")
    assert plan_key(row) == hashlib.sha1(canonical.encode()).hexdigest()[:16] == "a16943d8eacbcc84"
    assert plan_key(row) != plan_key({**row, "dtype": "fp32"})


def test_dedup_repeated_presets():
    once = profile_plan(["gemm", "norm"], ["bf16"], **SMALL)
    twice = profile_plan(["gemm", "norm"], ["bf16"], **{**SMALL, "presets": SMALL["presets"] * 2})
    assert set(once["key"]) == set(twice["key"])


def test_order_is_deterministic_given_seed():
    a = profile_plan(["gemm", "attention"], ["bf16"], seed=3, **SMALL)
    b = profile_plan(["gemm", "attention"], ["bf16"], seed=3, **SMALL)
    c = profile_plan(["gemm", "attention"], ["bf16"], seed=4, **SMALL)
    pd.testing.assert_frame_equal(a, b)
    assert set(a["key"]) == set(c["key"])
    assert a["key"].tolist() != c["key"].tolist()


def test_coarse_to_fine_spreads_sizes_early():
    plan = profile_plan(["gemm"], ["bf16"], **SMALL)
    flops = 2.0 * plan["batch"] * plan["m"] * plan["n"] * plan["k"]
    head = flops.head(max(8, len(plan) // 10))
    assert head.min() <= flops.quantile(0.1) and head.max() >= flops.quantile(0.9)


def test_gemm_shapes_follow_the_workload():
    plan = profile_plan(["gemm"], ["bf16"], presets=["llama3-8b"], token_counts=(1024,), tp_degrees=(2,))
    rows = set(zip(plan["op"], plan["m"], plan["n"], plan["k"], strict=True))
    assert ("matmul", 1024, (16 + 2 * 4) * 128, 4096) in rows  # qkv under tp2
    assert ("matmul", 1024, 4096, (16 + 2 * 4) * 128) in rows  # its data gradient
    assert ("matmul", 4096, (16 + 2 * 4) * 128, 1024) in rows  # its weight gradient
    assert ("matmul", 1024, 2 * 14336 // 2, 4096) in rows  # fused gate+up
    assert ("matmul", 1024, 128256 // 2, 4096) in rows  # LM head, vocab already a multiple of 256


def test_attention_rows():
    plan = profile_plan(["attention"], ["bf16"], presets=["llama3-8b"], tp_degrees=(1, 8), seq_lens=(1024,))
    assert set(zip(plan["heads"], plan["kv_heads"], strict=True)) == {(32, 8), (4, 1)}
    assert plan["causal"].all() and (plan["head_dim"] == 128).all()
    assert set(plan["batch"]) == {1, 8}


def test_gemm_only_dtypes_and_bias():
    plan = profile_plan(list(FAMILIES), ["fp8", "bf16"], **SMALL)
    assert set(plan.loc[plan["dtype"] == "fp8", "family"]) == {"gemm"}
    assert "linear" in set(plan["op"])  # gpt3 has biases
    assert not plan["backward"].any()


def test_backward_rows_only_for_vector_and_attention():
    plan = profile_plan(["gemm", "norm", "attention"], ["bf16"], backward=True, **SMALL)
    assert set(plan.loc[plan["backward"], "family"]) == {"norm", "attention"}


def test_no_collectives_without_ranks():
    plan = profile_plan(["collective", "norm"], ["bf16"], **{**SMALL, "collective_ranks": ()})
    assert set(plan["family"]) == {"norm"}


def test_single_op_names_and_errors():
    assert parse_op_families(["rmsnorm", "relu"]) == {
        "norm": frozenset({OpType.RMSNORM}),
        "elementwise": frozenset({OpType.RELU}),
    }
    plan = profile_plan(["rmsnorm", "tanh"], ["fp32"], **SMALL)
    assert set(plan["op"]) == {"rmsnorm", "tanh"}
    with pytest.raises(SpecError, match="conv2d"):
        profile_plan(["conv2d"], ["fp32"])
    with pytest.raises(SpecError, match="dtype"):
        profile_plan(["gemm"], ["int4"])
    with pytest.raises(SpecError):
        profile_plan(["gemm"], ["fp32"], presets=["no-such-model"])
