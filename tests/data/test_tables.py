"""Tests of perfcast.data.tables: formats by suffix, atomic writes, clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfcast.data.tables import (
    ERROR_COLUMN,
    OP_COLUMNS,
    OP_OUTPUT_COLUMNS,
    RUN_COLUMNS,
    RUN_OUTPUT_COLUMNS,
    cell_holds_value,
    distinct_rows,
    read_table,
    write_table,
)
from perfcast.errors import DatasetError


@pytest.mark.parametrize(
    ("value", "holds"),
    [(None, False), (float("nan"), False), (np.float32("nan"), False), (pd.NA, False), (pd.NaT, False), (" ", False),
     ("", False), ("x", True), (0, True), (np.int64(3), True), (False, True), ({"num_layers": 2}, True)],
)  # fmt: skip
def test_cell_holds_value(value, holds) -> None:
    assert cell_holds_value(value) is holds


@pytest.fixture()
def table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "op": ["matmul", "softmax", "allreduce"],
            "m": [128, None, None],
            "measured_ms": [0.5, 0.01, 1.25],
            "causal": [True, False, True],
        }
    )


def test_column_contract() -> None:
    assert RUN_COLUMNS[:3] == ("num_layers", "hidden_size", "num_heads")
    assert RUN_COLUMNS[-3:] == ("gpu", "num_gpus", "gpus_per_node")
    assert len(RUN_COLUMNS) == len(set(RUN_COLUMNS)) == 24
    assert OP_COLUMNS[0] == "op" and len(OP_COLUMNS) == len(set(OP_COLUMNS))
    assert OP_OUTPUT_COLUMNS == ("pred_ms", "pred_lo_ms", "pred_hi_ms")
    assert RUN_OUTPUT_COLUMNS[0] == "step_ms" and ERROR_COLUMN == "error"


@pytest.mark.parametrize("name", ["t.csv", "t.csv.gz", "t.parquet", "t.pq", "T.CSV"])
def test_round_trip(tmp_path: Path, table: pd.DataFrame, name: str) -> None:
    path = write_table(table, tmp_path / "sub" / "dir" / name)
    assert path == tmp_path / "sub" / "dir" / name
    back = read_table(path)
    pd.testing.assert_frame_equal(back, table, check_dtype=False)
    assert sorted(p.name for p in path.parent.iterdir()) == [name]


def test_csv_gz_is_compressed(tmp_path: Path, table: pd.DataFrame) -> None:
    path = write_table(table, tmp_path / "t.csv.gz")
    assert path.read_bytes()[:2] == b"\x1f\x8b"


def test_failed_write_keeps_old_file_and_leaves_no_temp(
    tmp_path: Path, table: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_table(table, tmp_path / "t.parquet")
    before = path.read_bytes()

    def boom(self: pd.DataFrame, target: object, *args: object, **kwargs: object) -> None:
        Path(str(target)).write_bytes(b"partial")  # a half-written temp file
        raise RuntimeError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", boom)
    with pytest.raises(DatasetError, match="disk full"):
        write_table(table.head(1), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_failed_csv_write_to_new_target_leaves_nothing(
    tmp_path: Path, table: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(self: pd.DataFrame, *args: object, **kwargs: object) -> None:
        raise OSError("no space left")

    monkeypatch.setattr(pd.DataFrame, "to_csv", boom)
    with pytest.raises(DatasetError, match="no space left"):
        write_table(table, tmp_path / "new.csv")
    assert list(tmp_path.iterdir()) == []


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        read_table(tmp_path / "absent.csv")


@pytest.mark.parametrize("name", ["t.xlsx", "t", "t.gz", "t.yaml"])
def test_bad_suffix(tmp_path: Path, table: pd.DataFrame, name: str) -> None:
    (tmp_path / name).write_text("x")
    with pytest.raises(DatasetError, match=r"\.csv, \.csv\.gz, \.parquet, \.pq, \.jsonl, \.ndjson, \.json"):
        read_table(tmp_path / name)
    with pytest.raises(DatasetError, match="must end with"):
        write_table(table, tmp_path / name)


@pytest.mark.parametrize(
    ("name", "content"),
    [("bad.parquet", b"not parquet at all"), ("bad.csv", b""), ("bad.csv.gz", b"not gzip")],
)
def test_unparseable_file(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=f"cannot parse .*{name}"):
        read_table(path)


def test_directory_is_not_a_table(tmp_path: Path) -> None:
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(DatasetError, match="not a file"):
        read_table(tmp_path / "d.csv")


@pytest.mark.parametrize("name", ["t.json", "t.jsonl"])
def test_json_tables_round_trip_with_empty_cells_as_null(tmp_path: Path, name: str) -> None:
    table = pd.DataFrame({"op": ["matmul", "gelu"], "m": [1024, None], "gpu": ["h100", None]})
    write_table(table, tmp_path / name)
    text = (tmp_path / name).read_text()
    assert "null" in text and "NaN" not in text
    back = read_table(tmp_path / name)
    assert back["op"].tolist() == ["matmul", "gelu"] and pd.isna(back["m"].iloc[1]) and back["m"].iloc[0] == 1024
    with pytest.raises(DatasetError, match="cannot parse"):
        (tmp_path / name).write_text("{not json")
        read_table(tmp_path / name)


def test_distinct_rows_index_each_row_into_the_first_occurrences():
    inverse, first = distinct_rows([np.array(["a", "b", "a", "a"], dtype=object), np.array([1.0, 1.0, np.nan, 1.0])])
    assert sorted(first.tolist()) == [0, 1, 2]  # ("a", 1), ("b", 1), ("a", NaN); row 3 repeats row 0
    assert inverse[3] == inverse[0] and len(set(inverse[:3].tolist())) == 3
    assert first[inverse].tolist() == [0, 1, 2, 0]
    empty_inverse, empty_first = distinct_rows([np.array([]), np.array([])])
    assert len(empty_inverse) == len(empty_first) == 0
