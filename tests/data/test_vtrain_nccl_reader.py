"""Tests of perfcast.data.readers.vtrain.read_vtrain_nccl on a tiny fixture and the real file."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest
from fixtures.shared import SHARED_DATA

from perfcast.data.readers.vtrain import VTRAIN_GPU, read_vtrain_nccl
from perfcast.data.records import REASON_COLUMN
from perfcast.data.validate import check_op_records
from perfcast.errors import DatasetError
from perfcast.features.hardware import resolve_gpu_name

REAL_FILE = SHARED_DATA / "vtrain_nccl_allreduce.csv.gz"

HEADER = (
    "gpu,n_gpus,collective,size_bytes,count,dtype,time_us_out_of_place,busbw_GBps_out_of_place,"
    "time_us_in_place,busbw_GBps_in_place,source_path"
)
ROWS = [
    "A100,2,all_reduce,1048576,262144,float,44.21,23.72,45.1,23.25,trace/a100/AR_GPU2_1M_1024M_LUT",
    "V100,8,all_reduce,2097152,524288,float,100.0,36.7,,,trace/v100/AR_GPU8_1M_1024M_LUT",
    "A100,2,all_gather,1048576,262144,float,44.21,23.72,45.1,23.25,x",  # unsupported collective
    "A100,2,all_reduce,1048576,262144,int8,44.21,23.72,45.1,23.25,x",  # unknown dtype
    "A100,two,all_reduce,1048576,262144,float,44.21,23.72,45.1,23.25,x",  # garbage rank count
    "A100,2,all_reduce,1048576,262144,float,0,23.72,45.1,23.25,x",  # zero time
]


def _fixture(tmp_path: Path) -> Path:
    path = tmp_path / "nccl.csv.gz"
    pd.read_csv(io.StringIO("\n".join([HEADER, *ROWS]))).to_csv(path, index=False)
    return path


def test_fixture_maps_to_op_rows(tmp_path: Path) -> None:
    result = read_vtrain_nccl(_fixture(tmp_path))
    assert (result.n_records, result.n_rejected) == (2, 4)
    a100, v100 = (result.records.iloc[i] for i in range(2))
    assert (a100["op"], a100["bytes"], a100["n_ranks"], a100["ranks_per_node"]) == ("allreduce", 1048576, 2, 2)
    assert a100["dtype"] == "fp32" and a100["gpu"] == VTRAIN_GPU and not a100["backward"]
    assert a100["measured_ms"] == pytest.approx(0.04421)
    assert a100["measured_in_place_ms"] == pytest.approx(0.0451)
    assert a100["busbw_gbps_out_of_place"] == pytest.approx(23.72)
    assert a100["source"] == "vtrain:trace/a100/AR_GPU2_1M_1024M_LUT"
    assert v100["gpu"] == "NVIDIA V100-SXM2-32GB" and v100["ranks_per_node"] == 8
    assert pd.isna(v100["measured_in_place_ms"])


def test_fixture_rejections(tmp_path: Path) -> None:
    reasons = read_vtrain_nccl(_fixture(tmp_path)).rejected[REASON_COLUMN].tolist()
    assert "is not all_reduce" in reasons[0]
    assert "dtype is not a known nccl-tests type" in reasons[1]
    assert "n_gpus is not a positive integer" in reasons[2]
    assert "time_us_out_of_place is not a positive number" in reasons[3]


def test_fixture_records_pass_the_checks(tmp_path: Path) -> None:
    checked = check_op_records(read_vtrain_nccl(_fixture(tmp_path)).records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (2, 0)
    assert checked.records["gpu"].tolist() == ["a100-sxm4-80gb", "v100-sxm2-32gb"]


def test_missing_columns_raise(tmp_path: Path) -> None:
    path = tmp_path / "nccl.csv"
    pd.DataFrame({"gpu": ["A100"], "n_gpus": [2]}).to_csv(path, index=False)
    with pytest.raises(DatasetError, match="size_bytes"):
        read_vtrain_nccl(path)


@pytest.mark.skipif(not REAL_FILE.exists(), reason="shared vTrain data not available")
def test_real_file() -> None:
    result = read_vtrain_nccl(REAL_FILE)
    assert (result.n_records, result.n_rejected) == (14336, 0)
    checked = check_op_records(result.records, resolve_gpu=resolve_gpu_name)
    assert (checked.n_records, checked.n_rejected) == (14336, 0)
    assert checked.records["gpu"].value_counts().to_dict() == {"a100-sxm4-80gb": 7168, "v100-sxm2-32gb": 7168}
    # nccl-tests bus bandwidth of an all-reduce: algbw * 2(n-1)/n, algbw = bytes / time
    rec = checked.records
    busbw = rec["bytes"] / (rec["measured_ms"] * 1e6) * 2 * (rec["n_ranks"] - 1) / rec["n_ranks"]
    assert (busbw / rec["busbw_gbps_out_of_place"]).between(0.98, 1.02).all()
