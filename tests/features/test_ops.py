"""Tests of the op vocabulary and the FLOPs and memory traffic of each op."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import SpecError
from perfcast.features.ops import (
    ADAM_BYTES_PER_PARAM,
    ATTENTION_BACKWARD_FLOP_RATIO,
    OpClass,
    OpType,
    op_class,
    op_flops,
    op_kinds,
    op_memory_bytes,
    parse_op,
)


def _one(**row) -> pd.DataFrame:
    return pd.DataFrame([row])


def test_design_op_vocabulary_is_known():
    design = (
        "matmul bmm linear softmax layernorm rmsnorm add mul div pow relu gelu silu tanh attention "
        "allreduce allgather reducescatter alltoall sendrecv"
    ).split()
    assert set(design) <= {o.value for o in OpType}


@pytest.mark.parametrize(
    ("op", "cls"),
    [
        (OpType.MATMUL, OpClass.GEMM),
        (OpType.BMM, OpClass.GEMM),
        (OpType.LINEAR, OpClass.GEMM),
        (OpType.ATTENTION, OpClass.ATTENTION),
        (OpType.ALLREDUCE, OpClass.COLLECTIVE),
        (OpType.SENDRECV, OpClass.COLLECTIVE),
        (OpType.LAYERNORM, OpClass.VECTOR),
        (OpType.OPTIMIZER, OpClass.VECTOR),
    ],
)
def test_op_class(op, cls):
    assert op_class(op) is cls


def test_op_kinds_normalise_case_and_space():
    ops = pd.DataFrame({"op": [" MatMul", "LINEAR ", "allReduce"]})
    assert list(op_kinds(ops)) == ["matmul", "linear", "allreduce"]


def test_unknown_op_raises_listing_allowed_ops():
    with pytest.raises(SpecError) as info:
        op_flops(pd.DataFrame({"op": ["matmul", "conv2d"], "m": [1, 1], "n": [1, 1], "k": [1, 1]}))
    msg = str(info.value)
    assert "op='conv2d' is not a known op" in msg
    for allowed in ("matmul", "attention", "allreduce", "sendrecv"):
        assert allowed in msg
    with pytest.raises(SpecError, match="op=None"):
        parse_op(None)


# ------------------------------------------------------------------ FLOPs


@pytest.mark.parametrize("op", ["matmul", "bmm"])
def test_gemm_flops_are_2bmnk(op):
    assert op_flops(_one(op=op, batch=3, m=64, n=128, k=32))[0] == 2 * 3 * 64 * 128 * 32


def test_linear_adds_the_bias():
    assert op_flops(_one(op="linear", batch=2, m=64, n=128, k=32))[0] == 2 * 2 * 64 * 128 * 32 + 2 * 64 * 128


def test_gemm_batch_defaults_to_one_and_backward_flag_is_ignored():
    no_batch = op_flops(pd.DataFrame({"op": ["matmul"], "m": [8], "n": [16], "k": [4]}))[0]
    assert no_batch == 2 * 8 * 16 * 4
    assert op_flops(_one(op="matmul", m=8, n=16, k=4, backward=True))[0] == no_batch


def test_attention_flops_causal_halving_and_backward_ratio():
    shape = dict(op="attention", batch=2, heads=16, kv_heads=4, seq_q=1024, seq_kv=1024, head_dim=128)
    full = 4 * 2 * 16 * 1024 * 1024 * 128
    ops = pd.DataFrame(
        [
            {**shape, "causal": False, "backward": False},
            {**shape, "causal": True, "backward": False},
            {**shape, "causal": False, "backward": True},
            {**shape, "causal": "true", "backward": "true"},  # flags read from text cells
        ]
    )
    flops = op_flops(ops)
    assert ATTENTION_BACKWARD_FLOP_RATIO == 2.5
    assert list(flops) == [full, full / 2, 2.5 * full, 2.5 * full / 2]


def test_vector_flops_per_element_and_backward_doubles():
    ops = pd.DataFrame(
        [
            dict(op="layernorm", rows=10, cols=100),
            dict(op="layernorm", rows=10, cols=100, backward=True),
            dict(op="add", rows=10, cols=100),
            dict(op="gelu", rows=10, cols=100),
        ]
    )
    assert list(op_flops(ops)) == [8 * 1000, 16 * 1000, 1000, 8 * 1000]


def test_collectives_have_no_flops():
    ops = pd.DataFrame([dict(op=o, bytes=1 << 20, n_ranks=8) for o in ("allreduce", "alltoall", "sendrecv")])
    assert list(op_flops(ops)) == [0.0, 0.0, 0.0]


# ------------------------------------------------------------------ memory traffic


@pytest.mark.parametrize(("dtype", "operand", "out"), [("bf16", 2, 2), ("fp16", 2, 2), ("fp32", 4, 4), ("fp8", 1, 2)])
def test_gemm_memory_reads_operands_and_writes_output_once(dtype, operand, out):
    b, m, n, k = 2, 64, 128, 32
    got = op_memory_bytes(_one(op="matmul", batch=b, m=m, n=n, k=k, dtype=dtype))[0]
    assert got == b * (m * k + k * n) * operand + b * m * n * out


def test_gemm_memory_defaults_to_bf16():
    assert op_memory_bytes(pd.DataFrame({"op": ["matmul"], "m": [4], "n": [4], "k": [4]}))[0] == 3 * 16 * 2


def test_attention_memory_counts_q_k_v_o_and_doubles_in_backward():
    shape = dict(op="attention", batch=2, heads=16, kv_heads=4, seq_q=512, seq_kv=1024, head_dim=64, dtype="bf16")
    qo = 2 * 2 * 16 * 512 * 64
    kv = 2 * 2 * 4 * 1024 * 64
    fwd = op_memory_bytes(_one(**shape))[0]
    assert fwd == (qo + kv) * 2
    assert op_memory_bytes(_one(**shape, backward=True))[0] == 2 * fwd
    mha = {**shape, "kv_heads": 0}  # no kv_heads: as many as query heads
    assert op_memory_bytes(_one(**mha))[0] == (qo + 2 * 2 * 16 * 1024 * 64) * 2


def test_vector_memory_traffic():
    e = 10 * 100
    ops = pd.DataFrame(
        [
            dict(op="gelu", rows=10, cols=100, dtype="bf16"),  # read x, write y
            dict(op="add", rows=10, cols=100, dtype="bf16"),  # two inputs
            dict(op="add", rows=10, cols=100, dtype="bf16", scalar=True),  # tensor + scalar
            dict(op="gelu", rows=10, cols=100, dtype="bf16", backward=True),  # dy, x in; dx out
            dict(op="softmax", rows=10, cols=100, dtype="fp32"),
            dict(op="optimizer", rows=1, cols=1000, dtype="bf16"),
            dict(op="swiglu", rows=10, cols=100, dtype="bf16"),  # gate and up halves in, y out
            dict(op="swiglu", rows=10, cols=100, dtype="bf16", backward=True),  # dy, gate, up in; their grads out
        ]
    )
    assert ADAM_BYTES_PER_PARAM == 30.0
    assert list(op_memory_bytes(ops)) == [
        2 * e * 2, 3 * e * 2, 2 * e * 2, 3 * e * 2, 2 * e * 4, 30 * 1000, 3 * e * 2, 5 * e * 2,
    ]  # fmt: skip


def test_collective_memory_is_its_message():
    ops = pd.DataFrame([dict(op="allgather", bytes=12345, n_ranks=4)])
    assert op_memory_bytes(ops)[0] == 12345


def test_frame_arrays_and_text_cells_give_the_same_flops_and_bytes():
    ops = pd.DataFrame(
        {
            "op": ["matmul", "Linear ", "attention", "rmsnorm", "add", "optimizer", "allreduce", "softmax"],
            "batch": [1, 2, 3, 0, 0, 0, 0, 0],
            "m": [64, 32, 0, 0, 0, 0, 0, 0],
            "n": [128, 16, 0, 0, 0, 0, 0, 0],
            "k": [256, 8, 0, 0, 0, 0, 0, 0],
            "rows": [0, 0, 0, 512, 64, 1, 0, 32],
            "cols": [0, 0, 0, 1024, 64, 1000, 0, 50],
            "scalar": [False, False, False, False, True, False, False, False],
            "heads": [0, 0, 8, 0, 0, 0, 0, 0],
            "kv_heads": [0, 0, 2, 0, 0, 0, 0, 0],
            "seq_q": [0, 0, 128, 0, 0, 0, 0, 0],
            "seq_kv": [0, 0, 256, 0, 0, 0, 0, 0],
            "head_dim": [0, 0, 64, 0, 0, 0, 0, 0],
            "causal": [False, False, True, False, False, False, False, False],
            "bytes": [0, 0, 0, 0, 0, 0, 1 << 20, 0],
            "dtype": ["bf16", "fp8", "fp16", "fp32", "bf16", "bf16", "bf16", "tf32"],
            "backward": [False, True, True, True, False, False, False, True],
        }
    )
    arrays = {c: ops[c].to_numpy(dtype=object if ops[c].dtype == object else None) for c in ops}
    text = ops.astype(str)  # numbers and flags as text cells take the coercing path
    text["m"] = text["m"].where(ops["m"] > 0, "")  # empty cells count as 0
    for fn in (op_flops, op_memory_bytes):
        expected = fn(ops)
        np.testing.assert_array_equal(fn(arrays), expected)
        np.testing.assert_array_equal(fn(text), expected)
    assert op_flops(ops.iloc[:0]).shape == (0,)
