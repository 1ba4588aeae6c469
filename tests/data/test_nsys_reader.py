"""Tests of perfcast.data.readers.nsys on tiny SQLite files with the nsys export schema.

Only the tables and columns the reader reads are created (no nsys binary needed). Times
are nanoseconds, as in real exports.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from perfcast.data.readers.aten import NO_EQUIVALENT_REASON, RECORD_COLUMNS
from perfcast.data.readers.nsys import UNLINKED_KERNELS, read_nsys_sqlite
from perfcast.data.validate import check_op_records
from perfcast.errors import DatasetError, SpecError
from perfcast.features.hardware import resolve_gpu_name

H100 = "NVIDIA H100 80GB HBM3"
FWD_TID = (4242 << 24) + 4242  # globalTid = pid << 24 | tid, as nsys encodes it
BWD_TID = (4242 << 24) + 4300
PUSH_POP, MARK = 59, 34

SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, correlationId INTEGER,
                                         shortName INTEGER, demangledName INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER, correlationId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, text TEXT, textId INTEGER, globalTid INTEGER,
                          eventType INTEGER);
CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT);
"""


class _Export:
    """Builds an export: NVTX ranges, launches inside them, kernels on the GPU."""

    def __init__(self) -> None:
        self.nvtx: list[tuple] = []
        self.runtime: list[tuple] = []
        self.kernels: list[tuple] = []
        self.strings: list[tuple] = [(1, "sm90_xmma_gemm_bf16"), (2, "void at::native::elementwise")]
        self.corr = 0

    def range(self, text: str, start: int, end: int, tid: int = FWD_TID, via_string_id: bool = False) -> None:
        if via_string_id:
            sid = 100 + len(self.strings)
            self.strings.append((sid, text))
            self.nvtx.append((start, end, None, sid, tid, PUSH_POP))
        else:
            self.nvtx.append((start, end, text, None, tid, PUSH_POP))

    def launch(self, at: int, kernel_ns: int, tid: int = FWD_TID, gpu_start: int = 10_000_000) -> None:
        self.corr += 1
        self.runtime.append((at, at + 500, tid, self.corr))
        start = gpu_start + 1000 * self.corr
        self.kernels.append((start, start + kernel_ns, 0, self.corr, 1, 1))

    def write(self, path: Path, *, device: bool = True) -> Path:
        con = sqlite3.connect(path)
        con.executescript(SCHEMA)
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", self.strings)
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, ?, ?)", self.kernels)
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", self.runtime)
        con.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?)", self.nvtx)
        if device:
            con.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, ?)", (H100,))
        con.commit()
        con.close()
        return path


def _sample() -> _Export:
    ex = _Export()
    # two iterations of linear -> addmm (kernel launched inside addmm): 40 us and 60 us
    for i, kernel_ns in enumerate((40_000, 60_000)):
        t0 = 1_000_000 * (i + 1)
        ex.range(
            "aten::linear, seq = 1, op_id = 10, sizes = [[8, 4096], [1024, 4096], [1024]], input_op_ids = [(1, 0)]",
            t0,
            t0 + 90_000,
        )
        ex.range("aten::addmm, op_id = 11, sizes = [[1024], [8, 4096], [4096, 1024], [], []]", t0 + 5_000, t0 + 80_000)
        ex.launch(t0 + 10_000, kernel_ns)
    # softmax, its name in StringIds (textId), two kernels (5 + 3 us)
    ex.range(
        "aten::_softmax, seq = 2, op_id = 20, sizes = [[8, 1024], [], []]", 3_000_000, 3_050_000, via_string_id=True
    )
    ex.launch(3_010_000, 5_000)
    ex.launch(3_020_000, 3_000)
    # an unmapped copy with a kernel, and a mark (no end) that must be ignored
    ex.range("aten::copy_, op_id = 30, sizes = [[8, 1024], [8, 1024], []]", 4_000_000, 4_020_000)
    ex.launch(4_005_000, 2_000)
    ex.nvtx.append((4_100_000, None, "a mark", None, FWD_TID, MARK))
    # a launch outside every range
    ex.launch(5_000_000, 1_000)
    # backward thread: MmBackward0 node -> aten::mm (20 us)
    ex.range("MmBackward0, seq = 1, op_id = 40, sizes = [[8, 1024]]", 6_000_000, 6_100_000, tid=BWD_TID)
    ex.range("aten::mm, op_id = 41, sizes = [[8, 1024], [1024, 4096]]", 6_010_000, 6_090_000, tid=BWD_TID)
    ex.launch(6_020_000, 20_000, tid=BWD_TID)
    # a mapped op without a kernel
    ex.range("aten::add, op_id = 50, sizes = [[8], [8], []]", 7_000_000, 7_001_000)
    return ex


def test_reads_records_with_outermost_rule_and_backward(tmp_path: Path) -> None:
    result = read_nsys_sqlite(_sample().write(tmp_path / "run.sqlite"), dtype="bf16")
    rec = result.records
    assert list(rec.columns) == list(RECORD_COLUMNS)
    assert sorted(rec["op"]) == ["linear", "matmul", "softmax"]
    assert set(rec["dtype"]) == {"bf16"} and set(rec["gpu"]) == {H100} and set(rec["timing"]) == {"gpu_kernels"}
    lin = rec[rec["op"] == "linear"].iloc[0]
    assert [lin[c] for c in ("batch", "m", "n", "k")] == [1, 8, 1024, 4096]
    assert lin["n_repeats"] == 2 and lin["measured_ms"] == pytest.approx(0.050)
    assert (lin["measured_min_ms"], lin["measured_max_ms"]) == pytest.approx((0.040, 0.060))
    assert lin["aten_op"] == "aten::linear" and not lin["backward"]
    soft = rec[rec["op"] == "softmax"].iloc[0]
    assert (soft["rows"], soft["cols"]) == (8, 1024) and soft["measured_ms"] == pytest.approx(0.008)
    mm = rec[rec["op"] == "matmul"].iloc[0]
    assert bool(mm["backward"]) and mm["measured_ms"] == pytest.approx(0.020)
    assert rec["source"].iloc[0] == "nsys:run.sqlite"


def test_rejected_summary(tmp_path: Path) -> None:
    rej = read_nsys_sqlite(_sample().write(tmp_path / "run.sqlite"), dtype="bf16").rejected.set_index("name")
    assert rej.loc["aten::copy_", "reason"] == NO_EQUIVALENT_REASON
    assert rej.loc["aten::copy_", "count"] == 1 and rej.loc["aten::copy_", "self_ms"] == pytest.approx(0.002)
    assert rej.loc["aten::add", "reason"] == "no GPU kernel launched by the op"
    assert rej.loc[UNLINKED_KERNELS, "count"] == 1
    assert "aten::addmm" not in rej.index  # inside its linear


def test_validation_accepts_records(tmp_path: Path) -> None:
    rec = read_nsys_sqlite(_sample().write(tmp_path / "run.sqlite"), dtype="torch.bfloat16").records
    checked = check_op_records(rec, resolve_gpu=resolve_gpu_name)
    assert checked.n_rejected == 0, checked.rejected
    assert checked.n_records == 3


def test_dtype_is_required_and_checked(tmp_path: Path) -> None:
    path = _sample().write(tmp_path / "run.sqlite")
    with pytest.raises(TypeError):
        read_nsys_sqlite(path)  # type: ignore[call-arg]
    with pytest.raises(SpecError, match="fp64"):
        read_nsys_sqlite(path, dtype="fp64")


def test_device_name_needed(tmp_path: Path) -> None:
    path = _sample().write(tmp_path / "run.sqlite", device=False)
    with pytest.raises(DatasetError, match="device="):
        read_nsys_sqlite(path, dtype="fp16")
    assert set(read_nsys_sqlite(path, dtype="fp16", device="NVIDIA A100-SXM4-80GB").records["gpu"]) == {
        "NVIDIA A100-SXM4-80GB"
    }


def test_bad_files_raise_dataset_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        read_nsys_sqlite(tmp_path / "absent.sqlite", dtype="bf16")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DatasetError, match="junk.sqlite"):
        read_nsys_sqlite(junk, dtype="bf16")
    partial = tmp_path / "partial.sqlite"
    con = sqlite3.connect(partial)
    con.execute("CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, text TEXT, globalTid INTEGER)")
    con.close()
    with pytest.raises(DatasetError, match="CUPTI_ACTIVITY_KIND_KERNEL"):
        read_nsys_sqlite(partial, dtype="bf16")


def test_ranges_without_sizes_raise(tmp_path: Path) -> None:
    ex = _Export()
    ex.range("aten::mm, seq = 1, op_id = 3", 0, 10_000)
    ex.launch(1_000, 5_000)
    with pytest.raises(DatasetError, match="record_shapes=True"):
        read_nsys_sqlite(ex.write(tmp_path / "noshape.sqlite"), dtype="bf16")


def test_unreadable_sizes_are_summarised(tmp_path: Path) -> None:
    ex = _Export()
    ex.range("aten::mm, op_id = 3, sizes = [[8, 16], [17, 4]]", 0, 10_000)  # inner sizes differ
    ex.launch(1_000, 5_000)
    ex.range("aten::bmm, op_id = 4, sizes = [[2, 8, 16], [2, 16, 4]", 20_000, 30_000)  # truncated
    ex.launch(21_000, 5_000)
    ex.range("aten::relu, op_id = 5, sizes = [[8, 16]]", 40_000, 50_000)
    ex.launch(41_000, 5_000)
    result = read_nsys_sqlite(ex.write(tmp_path / "bad.sqlite"), dtype="fp32")
    assert result.records["op"].tolist() == ["relu"]
    reasons = " | ".join(result.rejected["reason"])
    assert "inner sizes differ" in reasons and "no readable 'sizes" in reasons
