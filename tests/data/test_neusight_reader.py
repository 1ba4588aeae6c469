"""Tests of perfcast.data.readers.neusight on tiny fixtures and on the real shared files."""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from fixtures.shared import shared_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfcast.data.readers.neusight import (
    map_fx_node,
    read_neusight_e2e,
    read_neusight_gemm,
    read_neusight_model_ops,
    read_neusight_vector,
)
from perfcast.data.records import REASON_COLUMN
from perfcast.data.tables import RUN_COLUMNS, read_table
from perfcast.data.validate import check_op_records, check_run_records
from perfcast.errors import DatasetError
from perfcast.features.hardware import resolve_gpu_name

GEMM_HEADER = (
    "op,gpu,neusight_split,dtype,framework,gemm_batch,gemm_m,gemm_n,gemm_k,latency_ms,kernel,"
    "n_kernels_launched,grid_x,grid_y,grid_z,block_x,block_y,block_z"
)
GEMM_ROWS = [
    "bmm,NVIDIA A100-PCIE-40GB,train,float32,pt2.1.0-cu121,12,64,196,196,0.041088,ampere_sgemm_64x32,1,4,2,12,128,1,1",
    "linear,Tesla T4,test,float32,pt2.1.0-cu121,1,4096,1280,3840,1.5,sgemm_128x64,2,10,30,1,256,1,1",
    "bmm,Tesla T4,train,float32,pt2.1.0-cu121,2,8,8,8,,k,1,1,1,1,64,1,1",  # NaN time
    "bmm,Tesla T4,train,float32,pt2.1.0-cu121,2,8,8,8,-0.5,k,1,1,1,1,64,1,1",  # negative time
    "conv,Tesla T4,train,float32,pt2.1.0-cu121,2,8,8,8,0.5,k,1,1,1,1,64,1,1",  # unknown op
    "bmm,Tesla T4,train,float32,pt2.1.0-cu121,2,eight,8,8,0.5,k,1,1,1,1,64,1,1",  # garbage shape
]

VECTOR_HEADER = (
    "op,gpu,neusight_split,dtype,framework,rows_B,cols_H,latency_ms,kernel,n_kernels_launched,"
    "grid_x,grid_y,grid_z,block_x,block_y,block_z"
)
VECTOR_ROWS = [
    "add,Tesla P4,train,float32,pt2.1.0-cu121,4,422,0.015,vectorized_add,1,1,1,1,256,1,1",
    "mulu,Tesla P4,train,float32,pt2.1.0-cu121,4,422,0.016,vectorized_mul,0,1,1,1,256,1,1",
    "ln,Tesla P4,test,float32,pt2.1.0-cu121,1024,1024,0.05,layer_norm_kernel,1,1024,1,1,128,1,1",
    "softmax,Tesla P4,test,float32,pt2.1.0-cu121,1024,1024,,softmax_kernel,1,1024,1,1,128,1,1",  # NaN time
    "sigmoid,Tesla P4,train,float32,pt2.1.0-cu121,4,422,0.015,k,1,1,1,1,256,1,1",  # unknown op
    "relu,Tesla P4,train,float32,pt2.1.0-cu121,4,422,-1,k,1,1,1,1,256,1,1",  # negative time
]

MODEL_OPS_HEADER = (
    "gpu,model,mode,seq_len,batch,node,node_kind,target,input_shapes,output_shape,dtype,fw_latency_ms,"
    "bw_latency_ms,source_path"
)
_SRC = "scripts/asplos/label/Tesla_V100-PCIE-32GB/gpt2_large-train-1024-1.csv"
MODEL_OPS_ROWS = [
    # gpu, model, mode, seq, batch, node, kind, target, inputs, output, dtype, fw, bw
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "addmm", "call_function", "addmm",
     "[[3840], [1024, 1280], [1280, 3840]]", "(1024, 3840)", "torch.float32", 1.3, 2.5),
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "matmul", "call_function", "matmul",
     "[[1, 20, 1024, 64], [1, 20, 64, 1024]]", "(1, 20, 1024, 1024)", "torch.float32", 0.4, 0.0),
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "softmax", "call_function",
     "<function softmax at 0x7f014089c040>", "[[1, 20, 1024, 1024]]", "(1, 20, 1024, 1024)", "torch.float32", 0.2,
     0.3),
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "transformer_h_0_ln_1", "call_module",
     "transformer.h.0.ln_1", "[[1, 1024, 1280]]", "(1, 1024, 1280)", "torch.float32", 0.04, 0.09),
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "transformer_wte", "call_module", "transformer.wte",
     "[[1, 1024]]", "(1, 1024, 1280)", "torch.float32", 0.03, 0.4),
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "lm_head", "call_module", "lm_head",
     "[[1, 1024, 1280]]", "(1, 1024, 50257)", "torch.float32", 4.1, 8.9),
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "mul_1", "call_function", "mul",
     "[[1, 1024, 5120]]", "(1, 1024, 5120)", "torch.float32", 0.05, ""),
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "add_3", "call_function", "add",
     "[[1, 1024, 1280], [1, 1024, 1280]]", "(1, 1024, 1280)", "torch.float32", 0.05, 0.01),
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "add", "call_function", "add",
     "[[1], [1]]", "(1,)", "", 0.006, 0.0),  # Python scalar arithmetic
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "getitem", "call_function", "getitem",
     "[[1, 1024]]", "(1024,)", "torch.int64", 0.006, 0.0),  # no op equivalent
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "addmm_1", "call_function", "addmm",
     "[[1280], [1024, 1280], [1280, 12", "(1024, 1280)", "torch.float32", 0.5, 0.6),  # truncated shapes
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "addmm_2", "call_function", "addmm",
     "__import__('os').getcwd()", "(1024, 1280)", "torch.float32", 0.5, 0.6),  # not a literal
    ("Tesla_V100-PCIE-32GB", "gpt2_large", "train", 1024, 1, "tanh", "call_function", "tanh",
     "[[1, 1024, 5120]]", "(1, 1024, 5120)", "torch.float32", "", 0.1),  # NaN forward time
]  # fmt: skip

E2E_HEADER = (
    "gpu,n_gpus,model,mode,seq_len,global_batch,dp,tp,pp,pp_num_microbatches,fused_kernels,dtype,timing_scope,"
    "e2e_latency_ms,fw_latency_ms,bw_latency_ms,num_layer_recorded,model_arch,cfg_n_layers,cfg_hidden,cfg_heads,"
    "cfg_ffn,cfg_vocab,cfg_max_pos,cfg_num_experts,source_path"
)
_LBL = "scripts/asplos/label"
E2E_ROWS = [
    f"Tesla_V100-PCIE-32GB,1,bert_large,inf,512,16,1,1,1,,False,float32,forward only (no_grad),518.2,518.2,,24.0,"
    f"BertLMHeadModel,24.0,1024.0,16.0,4096.0,30522.0,512.0,,{_LBL}/Tesla_V100-PCIE-32GB/bert_large-inf-512-16.json",
    f"NVIDIA_A100_80GB_PCIe,1,gpt2_large,train,1024,4,1,1,1,,True,float32,forward+backward,1635.7,560.1,1075.6,36.0,"
    f"GPT2LMHeadModel,36.0,1280.0,20.0,,50257.0,1024.0,,{_LBL}/NVIDIA_A100_80GB_PCIe/gpt2_large-train-1024-4.json",
    f"NVIDIA_A100-SXM4-40GB,4,gpt2_large,train,1024,4,1,1,4,1.0,False,float32,distributed,1597.6,,,0.0,"
    f"GPT2LMHeadModel,36.0,1280.0,20.0,,50257.0,1024.0,,{_LBL}/NVIDIA_A100-SXM4-40GB/gpt2_large-pp.json",
    f"NVIDIA_A100-SXM4-40GB,4,gpt2_large,train,1024,4,4,1,1,,False,float32,distributed,452.3,,,0.0,"
    f"GPT2LMHeadModel,36.0,1280.0,20.0,,50257.0,1024.0,,{_LBL}/NVIDIA_A100-SXM4-40GB/gpt2_large-dp.json",
    f"Tesla_V100-PCIE-32GB,1,switchxl4,inf,512,2,1,1,1,,False,float32,forward only (no_grad),596.3,596.3,,0.0,"
    f"SwitchTransformersForConditionalGeneration,24.0,1024.0,32.0,16384.0,32128.0,,4.0,{_LBL}/Tesla_V100/s.json",
    # garbage: pp microbatches that do not divide the batch, a NaN time, an unknown mode
    f"NVIDIA_A100-SXM4-40GB,4,gpt2_large,train,1024,4,1,1,4,3.0,False,float32,distributed,1597.6,,,0.0,"
    f"GPT2LMHeadModel,36.0,1280.0,20.0,,50257.0,1024.0,,{_LBL}/x.json",
    f"Tesla_V100-PCIE-32GB,1,bert_large,inf,512,8,1,1,1,,False,float32,forward only (no_grad),,,,24.0,"
    f"BertLMHeadModel,24.0,1024.0,16.0,4096.0,30522.0,512.0,,{_LBL}/y.json",
    f"Tesla_V100-PCIE-32GB,1,bert_large,serve,512,8,1,1,1,,False,float32,forward only (no_grad),10.0,,,24.0,"
    f"BertLMHeadModel,24.0,1024.0,16.0,4096.0,30522.0,512.0,,{_LBL}/z.json",
]


def _write(tmp_path: Path, name: str, header: str, rows: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _write_model_ops(tmp_path: Path, rows: list[tuple] = MODEL_OPS_ROWS) -> Path:
    path = tmp_path / "model_ops.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(MODEL_OPS_HEADER.split(","))
        for row in rows:
            writer.writerow([*row, _SRC])
    return path


# ---------------------------------------------------------------------------- kernels


def test_gemm_fixture(tmp_path: Path) -> None:
    result = read_neusight_gemm(_write(tmp_path, "gemm.csv", GEMM_HEADER, GEMM_ROWS))
    assert (result.n_records, result.n_rejected) == (2, 4)
    reasons = result.rejected[REASON_COLUMN].tolist()
    assert "latency_ms is missing" in reasons[0]
    assert "latency_ms is not positive" in reasons[1]
    assert reasons[2].startswith("unknown op 'conv'")
    assert reasons[3] == "gemm_m is not a positive integer"
    rec = result.records
    assert rec["op"].tolist() == ["bmm", "linear"]
    assert rec[["batch", "m", "n", "k"]].values.tolist() == [[12, 64, 196, 196], [1, 4096, 1280, 3840]]
    assert rec["dtype"].tolist() == ["fp32", "fp32"]
    assert rec["gpu"].tolist() == ["NVIDIA A100-PCIE-40GB", "Tesla T4"]
    assert rec["split"].tolist() == ["train", "test"]
    assert rec["measured_ms"].tolist() == [0.041088, 1.5]
    assert rec["n_kernels_launched"].tolist() == [1, 2]
    assert not rec["backward"].any() and (rec["n_repeats"] == 25).all()
    assert rec["source"].iloc[0] == "neusight:gemm.csv"
    checked = check_op_records(rec, resolve_gpu=resolve_gpu_name)
    assert checked.n_rejected == 0
    assert checked.records["gpu"].tolist() == ["a100-pcie-40gb", "t4"]


def test_vector_fixture(tmp_path: Path) -> None:
    result = read_neusight_vector(_write(tmp_path, "vector.csv", VECTOR_HEADER, VECTOR_ROWS))
    assert (result.n_records, result.n_rejected) == (3, 3)
    reasons = result.rejected[REASON_COLUMN].tolist()
    assert "latency_ms is missing" in reasons[0]
    assert reasons[1].startswith("unknown op 'sigmoid'")
    assert "latency_ms is not positive" in reasons[2]
    rec = result.records
    assert rec["op"].tolist() == ["add", "mul", "layernorm"]
    assert rec["scalar"].tolist() == [False, True, False]
    assert rec[["rows", "cols"]].values.tolist() == [[4, 422], [4, 422], [1024, 1024]]
    assert set(rec["timing"]) == {"cuda_events"}  # CUDA events around each call: the launch included
    assert check_op_records(rec, resolve_gpu=resolve_gpu_name).n_rejected == 0


def test_missing_columns_are_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "gemm.csv", GEMM_HEADER, GEMM_ROWS)
    pd.read_csv(path).drop(columns=["gemm_k", "latency_ms"]).to_csv(path, index=False)
    with pytest.raises(DatasetError, match="gemm_k, latency_ms"):
        read_neusight_gemm(path)
    with pytest.raises(DatasetError, match="no such file"):
        read_neusight_vector(tmp_path / "absent.csv.gz")


# ---------------------------------------------------------------------------- model ops


def test_model_ops_fixture(tmp_path: Path) -> None:
    result = read_neusight_model_ops(_write_model_ops(tmp_path))
    rec = result.records
    fw, bw = rec[~rec["backward"]], rec[rec["backward"]]
    assert len(fw) + result.n_rejected == len(MODEL_OPS_ROWS)
    assert fw["node"].tolist() == ["addmm", "matmul", "softmax", "transformer_h_0_ln_1", "transformer_wte", "lm_head",
                                   "mul_1", "add_3"]  # fmt: skip
    assert fw["op"].tolist() == ["linear", "bmm", "softmax", "layernorm", "embedding", "linear", "mul", "add"]
    # backward records only where bw_latency_ms > 0 (matmul has 0, mul_1 has none)
    assert bw["node"].tolist() == ["addmm", "softmax", "transformer_h_0_ln_1", "transformer_wte", "lm_head", "add_3"]
    assert bw.set_index("node").loc["addmm", "measured_ms"] == 2.5
    assert set(rec["timing"]) == {"cuda_events"}
    row = fw.set_index("node")
    assert row.loc["addmm", ["batch", "m", "n", "k"]].tolist() == [1, 1024, 3840, 1280]
    assert row.loc["matmul", ["batch", "m", "n", "k"]].tolist() == [20, 1024, 1024, 64]
    assert row.loc["lm_head", ["batch", "m", "n", "k"]].tolist() == [1, 1024, 50257, 1280]
    assert row.loc["softmax", ["rows", "cols"]].tolist() == [20 * 1024, 1024]
    assert row.loc["transformer_wte", ["rows", "cols"]].tolist() == [1024, 1280]
    assert bool(row.loc["mul_1", "scalar"]) and not bool(row.loc["add_3", "scalar"])
    assert row.loc["softmax", "target"] == "softmax"
    assert (rec["gpu"] == "Tesla V100-PCIE-32GB").all() and (rec["dtype"] == "fp32").all()
    assert (rec["graph_batch"] == 1).all() and (rec["graph_seq_len"] == 1024).all()
    reasons = result.rejected[REASON_COLUMN].tolist()
    assert reasons == [
        "operands are scalars: Python/size arithmetic, not a tensor op",
        "no op-table equivalent: getitem",
        "input_shapes is not a readable shape literal",
        "input_shapes is not a readable shape literal",
        "fw_latency_ms is missing or not a positive number",
    ]
    checked = check_op_records(rec, resolve_gpu=resolve_gpu_name)
    assert checked.n_rejected == 0
    assert (checked.records["gpu"] == "v100-pcie-32gb").all()


@pytest.mark.parametrize(
    ("kind", "target", "ins", "out", "expected"),
    [
        ("call_function", "bmm", "[[64, 2048, 64], [64, 64, 2048]]", "(64, 2048, 2048)",
         {"op": "bmm", "batch": 64, "m": 2048, "n": 2048, "k": 64}),
        ("call_function", "matmul", "[[8, 512, 64], [64, 32]]", "(8, 512, 32)",
         {"op": "matmul", "batch": 1, "m": 4096, "n": 32, "k": 64}),
        ("call_module", "model.decoder.layers.0.fc1", "[[4096, 2048]]", "(4096, 8192)",
         {"op": "linear", "batch": 1, "m": 4096, "n": 8192, "k": 2048}),
        ("call_module", "model.decoder.layers.0.activation_fn", "[[4096, 8192]]", "(4096, 8192)",
         {"op": "relu", "rows": 4096, "cols": 8192}),
        ("call_module", "bert.pooler.activation", "[[16, 1024]]", "(16, 1024)",
         {"op": "tanh", "rows": 16, "cols": 1024}),
        ("call_function", "<function embedding at 0x1>", "[[2, 2048], [2050, 2048]]", "(2, 2048, 2048)",
         {"op": "embedding", "rows": 4096, "cols": 2048}),
        ("call_function", "truediv", "[[4, 20, 1024, 1024], [1]]", "(4, 20, 1024, 1024)",
         {"op": "div", "rows": 81920, "cols": 1024, "scalar": True, "broadcast": False}),
        ("call_function", "add", "[[16, 16, 512, 512], [16, 1, 1, 512]]", "(16, 16, 512, 512)",
         {"op": "add", "rows": 131072, "cols": 512, "scalar": False, "broadcast": True}),
    ],
)  # fmt: skip
def test_map_fx_node(kind: str, target: str, ins: str, out: str, expected: dict) -> None:
    assert map_fx_node(kind, target, ins, out) == expected


@pytest.mark.parametrize(
    ("kind", "target", "ins", "out", "reason"),
    [
        ("call_module", "transformer.drop", "[[4, 1024, 1280]]", "(4, 1024, 1280)",
         "no op-table equivalent: transformer.drop"),
        ("call_method", "view", "[[4, 1024, 1280], [1]]", "(4, 1024, 20, 64)", "no op-table equivalent: view"),
        ("call_module", "mystery.block", "[[4, 8]]", "(4, 8)", "no op-table equivalent: mystery.block"),
        ("call_function", "addmm", "[[3840], [4096, 1280], [1000, 3840]]", "(4096, 3840)",
         "shapes do not fit addmm(bias, input[M,K], weight[K,N])"),
        ("call_function", "matmul", "[[4, 8]]", "(4, 8)", "shapes do not fit matmul(A[..., M, K], B[..., K, N])"),
        ("call_function", "softmax", "[[4, 8]]", "(4, 8", "output_shape is not a readable shape literal"),
        ("call_function", "softmax", "[[4, -8]]", "(4, 8)",
         "input_shapes is not a list of shapes of non-negative integers"),
        ("call_function", "softmax", float("nan"), "(4, 8)", "input_shapes is missing"),
    ],
)  # fmt: skip
def test_map_fx_node_rejects(kind: str, target: str, ins: object, out: str, reason: str) -> None:
    assert map_fx_node(kind, target, ins, out) == reason


# ---------------------------------------------------------------------------- e2e


def test_e2e_fixture(tmp_path: Path) -> None:
    result = read_neusight_e2e(_write(tmp_path, "e2e.csv", E2E_HEADER, E2E_ROWS))
    assert (result.n_records, result.n_rejected) == (5, 3)
    assert result.rejected[REASON_COLUMN].tolist() == [
        "micro_batch = global_batch / dp / pp_num_microbatches is not a positive integer",
        "e2e_latency_ms is missing or not a positive number",
        "mode is not one of inf, train",
    ]
    rec = result.records
    assert list(rec.columns[: len(RUN_COLUMNS)]) == list(RUN_COLUMNS)
    assert rec["timing_scope"].tolist() == ["fwd", "fwd_bwd", "fwd_bwd", "fwd_bwd", "fwd"]
    assert rec["micro_batch"].tolist() == [16, 4, 4, 1, 2]
    assert rec[["tp", "pp", "dp", "num_gpus", "gpus_per_node"]].values.tolist() == [
        [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 4, 1, 4, 4], [1, 1, 4, 4, 4], [1, 1, 1, 1, 1],
    ]  # fmt: skip
    assert rec["ffn_hidden_size"].tolist() == [4096, 5120, 5120, 5120, 16384]  # GPT-2: 4 * hidden
    assert rec["num_experts"].isna().tolist() == [True, True, True, True, False]
    assert rec["num_experts"].iloc[4] == 4 and rec["top_k"].iloc[4] == 1
    assert rec["gpu"].tolist()[:3] == ["Tesla V100-PCIE-32GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-40GB"]
    assert rec["architecture"].iloc[0] == "BertLMHeadModel"
    assert rec["fused_kernels"].tolist() == [False, True, False, False, False]
    assert (rec["dtype"] == "fp32").all() and (rec["recompute"] == "none").all()
    assert not rec["flash_attention"].any()
    checked = check_run_records(rec, resolve_gpu=resolve_gpu_name)
    assert checked.n_rejected == 0
    assert checked.records["gpu"].tolist()[:3] == ["v100-pcie-32gb", "a100-pcie-80gb", "a100-sxm4-40gb"]


# ---------------------------------------------------------------------------- robustness

_CELL = st.one_of(
    st.none(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=12),
    st.sampled_from(["bmm", "linear", "addu", "ln", "float32", "inf", "train", "(1,)", "[[1, 2]]", "[[1, 2", "True"]),
)


def _fuzz_rows(header: str, data: st.DataObject) -> pd.DataFrame:
    columns = header.split(",")
    n = data.draw(st.integers(min_value=1, max_value=6))
    rows = [[data.draw(_CELL) for _ in columns] for _ in range(n)]
    return pd.DataFrame(rows, columns=columns)


_READERS = {
    "gemm": (read_neusight_gemm, GEMM_HEADER),
    "vector": (read_neusight_vector, VECTOR_HEADER),
    "e2e": (read_neusight_e2e, E2E_HEADER),
    "model_ops": (read_neusight_model_ops, MODEL_OPS_HEADER),
}


@pytest.mark.parametrize("name", list(_READERS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_reader_never_raises_on_garbage_cells(name: str, data: st.DataObject) -> None:
    reader, header = _READERS[name]
    frame = _fuzz_rows(header, data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.csv"
        frame.to_csv(path, index=False)
        n_rows = len(read_table(path))
        result = reader(path)
    records = result.records
    if name == "model_ops":  # one forward record per mapped row, plus backward records
        records = records[~records["backward"]]
    assert len(records) + result.n_rejected == n_rows
    assert (result.rejected[REASON_COLUMN] != "").all()


# ---------------------------------------------------------------------------- real files


@pytest.mark.shared_data
def test_real_gemm_file() -> None:
    result = read_neusight_gemm(shared_file("neusight_kernels_gemm.csv.gz"))
    assert (result.n_records, result.n_rejected) == (141664, 0)
    checked = check_op_records(result.records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (141664, 0)
    assert set(checked.records["gpu"]) == {
        "a100-pcie-40gb", "a100-pcie-80gb", "mi100", "mi210", "p100-pcie-16gb", "p4", "t4", "v100-pcie-32gb",
    }  # fmt: skip


@pytest.mark.shared_data
def test_real_vector_file() -> None:
    result = read_neusight_vector(shared_file("neusight_kernels_vector.csv.gz"))
    assert (result.n_records, result.n_rejected) == (161593, 0)
    assert result.records["scalar"].sum() == 12594 + 3 * 12622  # addu, mulu, divu, powu
    checked = check_op_records(result.records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (161593, 0)


@pytest.mark.shared_data
def test_real_model_ops_file() -> None:
    result = read_neusight_model_ops(shared_file("neusight_model_op_latency.csv.gz"))
    rec = result.records
    assert (int((~rec["backward"]).sum()), int(rec["backward"].sum()), result.n_rejected) == (2127, 674, 6803)
    reasons = result.rejected[REASON_COLUMN]
    assert (reasons == "operands are scalars: Python/size arithmetic, not a tensor op").sum() == 784
    assert (reasons == "no op-table dtype: torch.int64").sum() == 48
    assert reasons.str.startswith("no op-table equivalent: ").sum() == 6803 - 784 - 48
    checked = check_op_records(rec, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (2247, 554)
    assert checked.rejected[REASON_COLUMN].str.contains("'AMD Instinct MI250' is not in the hardware catalog").all()


@pytest.mark.shared_data
def test_real_e2e_file() -> None:
    result = read_neusight_e2e(shared_file("neusight_e2e_latency.csv"))
    assert (result.n_records, result.n_rejected) == (100, 0)
    rec = result.records
    assert (rec["tp"] * rec["pp"] * rec["dp"] == rec["num_gpus"]).all()
    assert rec["timing_scope"].value_counts().to_dict() == {"fwd": 69, "fwd_bwd": 31}
    checked = check_run_records(rec, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (84, 16)
    assert checked.rejected[REASON_COLUMN].str.contains("'AMD Instinct MI250' is not in the hardware catalog").all()
