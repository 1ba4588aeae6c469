"""Chunked table reading and atomic chunked writing."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from perfcast.data.table_stream import TableWriter, count_rows, iter_table_chunks
from perfcast.errors import DatasetError

FRAME = pd.DataFrame({"a": range(10), "b": [f"x{i}" for i in range(10)]})


@pytest.mark.parametrize("name", ["t.csv", "t.csv.gz", "t.parquet"])
def test_chunks_round_trip_with_a_running_index(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with TableWriter(path) as writer:
        for start in range(0, 10, 4):
            writer.write(FRAME.iloc[start : start + 4])
    assert writer.rows == 10
    chunks = list(iter_table_chunks(path, chunk_rows=3))
    assert [len(c) for c in chunks] == [3, 3, 3, 1]
    assert chunks[1].index.tolist() == [3, 4, 5]
    pd.testing.assert_frame_equal(pd.concat(chunks).reset_index(drop=True), FRAME)
    assert count_rows(path) == (None if name.endswith(".gz") else 10)


def test_a_failed_write_leaves_the_old_table(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    FRAME.to_csv(path, index=False)
    with pytest.raises(RuntimeError), TableWriter(path) as writer:
        writer.write(FRAME.head(2))
        raise RuntimeError("interrupted")
    pd.testing.assert_frame_equal(pd.read_csv(path), FRAME)
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_changed_columns_and_types_are_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="columns differ"), TableWriter(tmp_path / "t.csv") as writer:
        writer.write(FRAME)
        writer.write(FRAME.rename(columns={"b": "c"}))
    with pytest.raises(DatasetError, match="changes type"), TableWriter(tmp_path / "t.parquet") as writer:
        writer.write(FRAME)
        writer.write(FRAME.assign(a=["text"] * 10))


def test_empty_input_writes_an_empty_table_and_bad_input_is_named(tmp_path: Path) -> None:
    with TableWriter(tmp_path / "e.parquet"):
        pass
    assert pd.read_parquet(tmp_path / "e.parquet").empty
    with pytest.raises(DatasetError, match="no such file"):
        list(iter_table_chunks(tmp_path / "missing.csv"))
    with pytest.raises(DatasetError, match="chunk_rows=0"):
        list(iter_table_chunks(tmp_path / "e.parquet", chunk_rows=0))
