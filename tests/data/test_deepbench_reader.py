"""Tests of perfcast.data.readers.deepbench on tiny fixtures and on the real shared files."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import pytest
from fixtures.shared import shared_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfcast.data.readers.deepbench import read_deepbench_allreduce, read_deepbench_gemm
from perfcast.data.records import REASON_COLUMN
from perfcast.data.tables import read_table
from perfcast.data.validate import check_op_records
from perfcast.errors import DatasetError
from perfcast.features.hardware import resolve_gpu_name

GEMM_HEADER = "gpu,precision,sheet,app,M,N,K,transA,transB,time_ms,tflops_reported,software,source_path"
_SW = "CUDA Version=10.1.243"
GEMM_ROWS = [
    f"NVIDIA V100,Float,Results FP32,,1760,16,1760,N,N,0.059,1.68,{_SW},results/train/DeepBench_NV_V100.xlsx",
    f'NVIDIA V100,"16 bit inputs, 16 bit multiplication, 32 bit addition",Results - FP16 ip,DeepSpeech,'
    f"5124,700,2048,T,N,0.2,73.4,{_SW},results/train/DeepBench_NV_V100.xlsx",
    f"Nvidia TitanX,Float,Results - FP32,,1760,16,1760,N,T,0.1,1.0,{_SW},results/train/DeepBench_NV_TitanX.xlsx",
    f'NVIDIA Tesla P100,"16 bit inputs, 32 bit multiplication, 32 bit addition",Results - Psuedo FP16,,'
    f"1760,16,1760,N,N,0.1,1.0,{_SW},results/train/DeepBench_NV_P100.xlsx",  # pseudo fp16
    f"NVIDIA T4,Int8,Results - INT8,,1760,16,1760,N,N,0.1,1.0,{_SW},results/train/DeepBench_NV_T4.xlsx",  # int8
    f"NVIDIA T4,Float,Results FP32,,1760,16,1760,N,N,,,{_SW},results/train/DeepBench_NV_T4.xlsx",  # NaN time
    f"NVIDIA T4,Float,Results FP32,,1760,16,1760,N,N,-2,1.0,{_SW},results/train/DeepBench_NV_T4.xlsx",  # negative
    f"NVIDIA T4,Float,Results FP32,,0,16,1760,X,N,0.1,1.0,{_SW},results/train/DeepBench_NV_T4.xlsx",  # bad M, flag
]

ALLREDUCE_HEADER = (
    "gpu,precision,sheet,size_floats,n_devices,mean_time_ms,gigabytes_per_s_reported,algorithm,std_time_ms,"
    "software,source_path"
)
ALLREDUCE_ROWS = [
    f"NVIDIA Tesla P100,Float,Results FP32,100000,4,0.09,17.5,NCCL 2.0 MPI,0.003,{_SW},results/train/P100.xlsx",
    f"NVIDIA Tesla P100,Float,Results FP32,100000,8,0.15,21.6,NCCL 2.0 Single,0.002,{_SW},results/train/P100.xlsx",
    f"NVIDIA V100,Float,Results FP32,100000,8,,,NCCL Single Process,,{_SW},results/train/V100.xlsx",  # NaN time
    f"NVIDIA V100,Float,Results FP32,100000,8,-1.0,,NCCL MPI,0.1,{_SW},results/train/V100.xlsx",  # negative
    f"NVIDIA V100,Float,Results FP32,1e5x,8,1.0,,NCCL MPI,0.1,{_SW},results/train/V100.xlsx",  # garbage size
]


def _write(tmp_path: Path, name: str, header: str, rows: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_gemm_fixture(tmp_path: Path) -> None:
    result = read_deepbench_gemm(_write(tmp_path, "gemm.csv", GEMM_HEADER, GEMM_ROWS))
    assert (result.n_records, result.n_rejected) == (3, 5)
    assert result.rejected[REASON_COLUMN].tolist() == [
        "pseudo-fp16 (fp16 storage, fp32 math) has no op-table dtype",
        "precision 'Int8' has no op-table dtype",
        "time_ms is missing or not a positive number",
        "time_ms is missing or not a positive number",
        "M is not a positive integer; transA is not N or T",
    ]
    rec = result.records
    assert (rec["op"] == "matmul").all() and (rec["batch"] == 1).all()
    assert rec[["m", "n", "k"]].values.tolist() == [[1760, 16, 1760], [5124, 700, 2048], [1760, 16, 1760]]
    assert rec["dtype"].tolist() == ["fp32", "fp16", "fp32"]
    assert rec["transA"].tolist() == ["N", "T", "N"] and rec["transB"].tolist() == ["N", "N", "T"]
    assert rec["measured_ms"].tolist() == [0.059, 0.2, 0.1]
    assert rec["source"].iloc[0] == "deepbench:results/train/DeepBench_NV_V100.xlsx"
    assert rec["app"].iloc[1] == "DeepSpeech"
    assert set(rec["timing"]) == {"loop_mean"}  # a timer around back-to-back repeats
    checked = check_op_records(rec, resolve_gpu=resolve_gpu_name)
    assert checked.n_records == 2  # the TitanX is not in the catalog
    assert checked.records["gpu"].tolist() == ["v100-sxm2-32gb", "v100-sxm2-32gb"]
    assert "TitanX" in checked.rejected[REASON_COLUMN].iloc[0]


def test_allreduce_fixture(tmp_path: Path) -> None:
    result = read_deepbench_allreduce(_write(tmp_path, "ar.csv", ALLREDUCE_HEADER, ALLREDUCE_ROWS))
    assert (result.n_records, result.n_rejected) == (2, 3)
    assert result.rejected[REASON_COLUMN].tolist() == [
        "mean_time_ms is missing or not a positive number",
        "mean_time_ms is missing or not a positive number",
        "size_floats is not a positive integer",
    ]
    rec = result.records
    assert (rec["op"] == "allreduce").all() and (rec["dtype"] == "fp32").all()
    assert rec["bytes"].tolist() == [400000, 400000]
    assert rec["n_ranks"].tolist() == [4, 8]
    assert rec["ranks_per_node"].isna().tolist() == [True, False]  # only the single-process run says
    assert rec["ranks_per_node"].iloc[1] == 8
    assert rec["measured_ms"].tolist() == [0.09, 0.15]
    assert rec["measured_std_ms"].tolist() == [0.003, 0.002]
    assert rec["algorithm"].tolist() == ["NCCL 2.0 MPI", "NCCL 2.0 Single"]
    checked = check_op_records(rec, resolve_gpu=resolve_gpu_name)
    assert checked.n_rejected == 0 and (checked.records["gpu"] == "p100-pcie-16gb").all()


def test_missing_columns_are_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "gemm.csv", GEMM_HEADER, GEMM_ROWS)
    pd.read_csv(path).drop(columns=["K", "time_ms"]).to_csv(path, index=False)
    with pytest.raises(DatasetError, match="K, time_ms"):
        read_deepbench_gemm(path)
    with pytest.raises(DatasetError, match="no such file"):
        read_deepbench_allreduce(tmp_path / "absent.csv")


_CELL = st.one_of(
    st.none(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=12),
    st.sampled_from(["Float", "N", "T", "NCCL 2.0 Single", "16 bit inputs, 16 bit multiplication, 32 bit addition"]),
)
_READERS = {"gemm": (read_deepbench_gemm, GEMM_HEADER), "allreduce": (read_deepbench_allreduce, ALLREDUCE_HEADER)}


@pytest.mark.parametrize("name", list(_READERS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_reader_never_raises_on_garbage_cells(name: str, data: st.DataObject) -> None:
    reader, header = _READERS[name]
    columns = header.split(",")
    n = data.draw(st.integers(min_value=1, max_value=6))
    frame = pd.DataFrame([[data.draw(_CELL) for _ in columns] for _ in range(n)], columns=columns)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.csv"
        frame.to_csv(path, index=False)
        n_rows = len(read_table(path))
        result = reader(path)
    assert result.n_records + result.n_rejected == n_rows
    assert (result.rejected[REASON_COLUMN] != "").all()


@pytest.mark.shared_data
def test_real_gemm_file() -> None:
    result = read_deepbench_gemm(shared_file("deepbench_gemm.csv"))
    assert (result.n_records, result.n_rejected) == (1920, 160)
    assert (result.rejected[REASON_COLUMN] == "pseudo-fp16 (fp16 storage, fp32 math) has no op-table dtype").all()
    assert result.records["dtype"].value_counts().to_dict() == {"fp32": 1600, "fp16": 320}
    checked = check_op_records(result.records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (800, 1120)  # 7 GPUs x 160 rows not in the catalog
    assert checked.records.groupby(["gpu", "dtype"]).size().to_dict() == {
        ("p100-pcie-16gb", "fp32"): 160,
        ("t4", "fp16"): 160,
        ("t4", "fp32"): 160,
        ("v100-sxm2-32gb", "fp16"): 160,
        ("v100-sxm2-32gb", "fp32"): 160,
    }
    assert checked.rejected[REASON_COLUMN].str.contains("is not in the hardware catalog").all()


@pytest.mark.shared_data
def test_real_allreduce_file() -> None:
    result = read_deepbench_allreduce(shared_file("deepbench_allreduce.csv"))
    assert (result.n_records, result.n_rejected) == (168, 50)  # T4 and V100 sheets have no times
    assert (result.rejected[REASON_COLUMN] == "mean_time_ms is missing or not a positive number").all()
    assert int(result.records["ranks_per_node"].notna().sum()) == 41  # the NCCL 2.0 Single runs
    checked = check_op_records(result.records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (28, 140)  # only the P100 is in the catalog
    assert (checked.records["gpu"] == "p100-pcie-16gb").all()
