"""Tests of perfcast.data.readers.vidur on tiny fixtures and on the real shared files."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import pytest
from fixtures.shared import SHARED_DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfcast.data.readers.vidur import (
    OPS_REQUIRED_COLUMNS,
    read_vidur_collectives,
    read_vidur_ops,
)
from perfcast.data.records import REASON_COLUMN
from perfcast.data.validate import check_op_records
from perfcast.errors import DatasetError
from perfcast.features.hardware import resolve_gpu_name

OPS_FILE = SHARED_DATA / "vidur_llm_layer_ops.csv.gz"
COLL_FILE = SHARED_DATA / "vidur_collectives.csv.gz"

OPS_HEADER = (
    "gpu,model,op,n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tokens,tp,"
    "time_ms_median,time_ms_mean,time_ms_min,time_ms_max,time_ms_std,source_path,dtype"
)
_L70 = (
    "A100,meta-llama/Llama-2-70b-hf,{op},64,8,8192,28672,32768,True,{t},{tp},{ms},{ms},{ms},{ms},{std},p/l.csv,float16"
)
_PHI = "A40,microsoft/phi-2,{op},32,32,2560,10240,51200,False,{t},1,{ms},{ms},{ms},{ms},0.0,p/phi.csv,float16"
OPS_ROWS = [
    _L70.format(op="attn_pre_proj", t=128, tp=8, ms=0.05, std=0.001),  # 0
    _L70.format(op="attn_post_proj", t=128, tp=8, ms=0.04, std=0.001),  # 1
    _L70.format(op="mlp_up_proj", t=128, tp=2, ms=0.3, std=6.9e-18),  # 2: std is round-off of 0
    _L70.format(op="mlp_down_proj", t=128, tp=2, ms=0.2, std=0.001),  # 3
    _L70.format(op="mlp_act", t=128, tp=4, ms=0.01, std=0.001),  # 4
    _L70.format(op="input_layernorm", t=128, tp=4, ms=0.01, std=0.001),  # 5
    _L70.format(op="add", t=128, tp=4, ms=0.01, std=0.001),  # 6
    _L70.format(op="emb", t=128, tp=4, ms=0.01, std=0.001),  # 7
    _PHI.format(op="mlp_act", t=64, ms=0.02),  # 8
    _PHI.format(op="input_layernorm", t=64, ms=0.02),  # 9
    _L70.format(op="attn_rope", t=128, tp=1, ms=0.01, std=0.001),  # 10: rejected, no equivalent
    _L70.format(op="attn_pre_proj", t=128, tp=3, ms=0.05, std=0.001),  # 11: tp does not divide heads
    _L70.format(op="mlp_up_proj", t="lots", tp=1, ms=0.05, std=0.001),  # 12: garbage tokens
    _L70.format(op="add", t=128, tp=1, ms=-1.0, std=0.001),  # 13: negative time
    _L70.format(op="flash_attn", t=128, tp=1, ms=0.05, std=0.001),  # 14: unknown op
    _L70.format(op="add", t=128, tp=1, ms=0.05, std=0.001).replace(",True,", ",maybe,"),  # 15: bad flag
]

COLL_HEADER = (
    "cluster,collective,num_workers,devices_per_node,max_devices_per_node,rank,size_elements_fp16,size_bytes,"
    "time_ms_median,time_ms_mean,time_ms_min,time_ms_max,time_ms_std,source_path,dtype"
)
COLL_ROWS = [
    "a100_dgx,all_reduce,2,2,8,0,1024,2048,0.10,0.1,0.09,0.12,0.01,n/a100_dgx/all_reduce.csv,float16",
    "a100_dgx,all_reduce,2,2,8,1,1024,2048,0.20,0.2,0.15,0.25,0.01,n/a100_dgx/all_reduce.csv,float16",
    "a100_dgx,all_reduce,2,2,8,1,1024,2048,0.30,0.3,0.29,0.31,0.01,n/a100_dgx/all_reduce.csv,float16",
    "a40_pairwise_nvlink,send_recv,2,1,4,0,1024,2048,0.5,0.5,0.4,0.6,0.0,n/a40/send_recv.csv,float16",
    "a100_pairwise_nvlink,all_reduce,4,4,4,0,1024,2048,0.7,0.7,0.6,0.8,0.0,n/a100p/all_reduce.csv,float16",
    "tpu_pod,all_reduce,2,2,8,0,1024,2048,0.1,0.1,0.1,0.1,0.0,n/x.csv,float16",  # unknown cluster
    "a100_dgx,all_gather,2,2,8,0,1024,2048,0.1,0.1,0.1,0.1,0.0,n/x.csv,float16",  # unknown collective
    "a100_dgx,all_reduce,2,2,8,0,1024,oops,0.1,0.1,0.1,0.1,0.0,n/x.csv,float16",  # garbage size
]


def _write(tmp_path: Path, name: str, header: str, rows: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_ops_fixture_shapes(tmp_path: Path) -> None:
    result = read_vidur_ops(_write(tmp_path, "ops.csv", OPS_HEADER, OPS_ROWS))
    assert (result.n_records, result.n_rejected) == (10, 6)
    rec = result.records.set_index("kernel", drop=False)
    l70 = rec[rec["model"] == "meta-llama/Llama-2-70b-hf"]
    # QKV at tp=8: (64/8 + 2*8/8) heads * 128 = 1280
    assert tuple(l70.loc["attn_pre_proj", ["op", "batch", "m", "k", "n"]]) == ("matmul", 1, 128, 8192, 1280)
    assert tuple(l70.loc["attn_post_proj", ["m", "k", "n"]]) == (128, 1024, 8192)
    assert tuple(l70.loc["mlp_up_proj", ["m", "k", "n"]]) == (128, 8192, 28672)  # gated: 2*28672/2
    assert tuple(l70.loc["mlp_down_proj", ["m", "k", "n"]]) == (128, 14336, 8192)
    assert tuple(l70.loc["mlp_act", ["op", "rows", "cols"]]) == ("swiglu", 128, 7168)
    assert tuple(l70.loc["input_layernorm", ["op", "rows", "cols"]]) == ("rmsnorm", 128, 8192)
    assert tuple(l70.loc["add", ["op", "rows", "cols"]]) == ("add", 128, 8192)
    assert tuple(l70.loc["emb", ["op", "rows", "cols", "vocab_size"]]) == ("embedding", 128, 8192, 32768)
    phi = rec[rec["model"] == "microsoft/phi-2"]
    assert tuple(phi.loc["mlp_act", ["op", "cols"]]) == ("gelu", 10240)
    assert phi.loc["input_layernorm", "op"] == "layernorm"
    assert set(rec["gpu"]) == {"NVIDIA A100-SXM4-80GB", "NVIDIA A40"}
    assert set(rec["dtype"]) == {"fp16"} and not rec["backward"].any()
    assert l70.loc["mlp_up_proj", "measured_std_ms"] == 0.0  # round-off std -> 0
    assert rec["source"].str.startswith("vidur:p/").all()
    assert set(rec["timing"]) == {"gpu_kernels"}  # Vidur's profiler: the kernels' CUDA time


def test_ops_fixture_rejections(tmp_path: Path) -> None:
    reasons = read_vidur_ops(_write(tmp_path, "ops.csv", OPS_HEADER, OPS_ROWS)).rejected[REASON_COLUMN].tolist()
    assert reasons[0] == "no op-table equivalent: rotary embedding"
    assert "n_head is not divisible by tp" in reasons[1]
    assert "num_tokens is not a positive integer" in reasons[2]
    assert "time_ms_median is not a positive number" in reasons[3]
    assert "unknown Vidur op 'flash_attn'" in reasons[4]
    assert "use_gated_mlp is not true/false" in reasons[5]


def test_ops_records_pass_the_checks(tmp_path: Path) -> None:
    records = read_vidur_ops(_write(tmp_path, "ops.csv", OPS_HEADER, OPS_ROWS)).records
    checked = check_op_records(records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (10, 0)
    assert set(checked.records["gpu"]) == {"a100-sxm4-80gb", "a40"}


def test_kv_heads_replicated_when_fewer_than_tp(tmp_path: Path) -> None:
    row = "A100,m,attn_pre_proj,32,2,4096,11008,32000,True,16,8,0.01,0.01,0.01,0.01,0.001,p/x.csv,float16"
    rec = read_vidur_ops(_write(tmp_path, "ops.csv", OPS_HEADER, [row])).records
    assert rec.loc[0, "n"] == (32 // 8 + 2 * 1) * 128


def test_missing_columns_raise(tmp_path: Path) -> None:
    path = tmp_path / "ops.csv"
    pd.DataFrame({"gpu": ["A100"], "op": ["add"]}).to_csv(path, index=False)
    with pytest.raises(DatasetError, match="n_head"):
        read_vidur_ops(path)
    with pytest.raises(DatasetError, match="no such file"):
        read_vidur_collectives(tmp_path / "absent.csv.gz")


def test_collectives_fixture_merges_ranks(tmp_path: Path) -> None:
    result = read_vidur_collectives(_write(tmp_path, "coll.csv", COLL_HEADER, COLL_ROWS))
    assert (result.n_records, result.n_rejected) == (3, 3)
    rec = result.records
    ar = rec[rec["cluster"] == "a100_dgx"].iloc[0]
    # rank 0: 0.10; rank 1 profiled twice: median(0.20, 0.30) = 0.25; slowest rank wins
    assert ar["measured_ms"] == pytest.approx(0.25)
    assert (ar["n_ranks_reported"], ar["n_rows_merged"]) == (2, 3)
    assert (ar["measured_min_ms"], ar["measured_max_ms"]) == (0.09, 0.31)
    assert (ar["op"], ar["bytes"], ar["n_ranks"], ar["ranks_per_node"]) == ("allreduce", 2048, 2, 2)
    assert rec["n_rows_merged"].sum() + result.n_rejected == len(COLL_ROWS)
    bridged = dict(zip(rec["cluster"], rec["nvlink_bridged"], strict=True))
    assert bridged == {"a100_dgx": False, "a40_pairwise_nvlink": True, "a100_pairwise_nvlink": True}
    gpus = dict(zip(rec["cluster"], rec["gpu"], strict=True))
    assert gpus == {
        "a100_dgx": "NVIDIA A100-SXM4-80GB",
        "a40_pairwise_nvlink": "NVIDIA A40",
        "a100_pairwise_nvlink": "NVIDIA A100 80GB PCIe",
    }
    reasons = result.rejected[REASON_COLUMN].tolist()
    assert "unknown Vidur cluster 'tpu_pod'" in reasons[0]
    assert "unsupported collective 'all_gather'" in reasons[1]
    assert "size_bytes is not a positive integer" in reasons[2]
    checked = check_op_records(rec, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (3, 0)


_CELL = st.one_of(
    st.none(),
    st.integers(-5, 40000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "nan", "True", "false", "add", "attn_pre_proj", "mlp_act", "emb", "A100", "x,y", '"']),
    st.text(max_size=6),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.fixed_dictionaries({c: _CELL for c in OPS_REQUIRED_COLUMNS}), min_size=1, max_size=6))
def test_ops_reader_never_raises_and_covers_input(rows: list[dict]) -> None:
    frame = pd.DataFrame(rows, columns=list(OPS_REQUIRED_COLUMNS))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ops.csv"
        frame.to_csv(path, index=False)
        n_rows = len(pd.read_csv(path))
        result = read_vidur_ops(path)
    assert result.n_records + result.n_rejected == n_rows
    assert (result.rejected[REASON_COLUMN] != "").all()
    check_op_records(result.records)  # accepted records are well-formed enough to validate


@pytest.mark.skipif(not OPS_FILE.exists(), reason="shared Vidur data not available")
def test_real_ops_file() -> None:
    result = read_vidur_ops(OPS_FILE)
    assert (result.n_records, result.n_rejected) == (130968, 14610)
    assert set(result.rejected[REASON_COLUMN]) == {"no op-table equivalent: rotary embedding"}
    checked = check_op_records(result.records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (130968, 0)
    gemm = checked.records[checked.records["op"] == "matmul"]
    tflops = 2.0 * gemm["m"] * gemm["n"] * gemm["k"] / gemm["measured_ms"] / 1e9
    peak = gemm["gpu"].map({"a100-sxm4-80gb": 312.0, "a40": 149.7})
    assert (tflops < peak).all()  # the shape mapping never implies more than the fp16 peak
    assert tflops.max() > 0.8 * 312.0  # ... and the largest GEMMs come close to it


@pytest.mark.skipif(not COLL_FILE.exists(), reason="shared Vidur data not available")
def test_real_collectives_file() -> None:
    result = read_vidur_collectives(COLL_FILE)
    assert (result.n_records, result.n_rejected) == (17403, 0)
    assert result.records["n_rows_merged"].sum() == 17418
    checked = check_op_records(result.records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (17403, 0)
    assert checked.records.groupby("gpu").size().to_dict() == {
        "a100-pcie-80gb": 6480,
        "a100-sxm4-80gb": 8937,
        "a40": 1986,
    }
