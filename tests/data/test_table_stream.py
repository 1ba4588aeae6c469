"""Chunked table reading and atomic chunked writing."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfcast.data.table_stream import TableWriter, count_rows, iter_table_chunks
from perfcast.data.tables import sweep_stale_temps, temp_path
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


def test_changed_columns_are_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="columns differ"), TableWriter(tmp_path / "t.csv") as writer:
        writer.write(FRAME)
        writer.write(FRAME.rename(columns={"b": "c"}))
    assert list(tmp_path.iterdir()) == []


def test_empty_input_writes_an_empty_table_and_bad_input_is_named(tmp_path: Path) -> None:
    with TableWriter(tmp_path / "e.parquet"):
        pass
    assert pd.read_parquet(tmp_path / "e.parquet").empty
    with pytest.raises(DatasetError, match="no such file"):
        list(iter_table_chunks(tmp_path / "missing.csv"))
    with pytest.raises(DatasetError, match="chunk_rows=0"):
        list(iter_table_chunks(tmp_path / "e.parquet", chunk_rows=0))


def test_parquet_chunks_of_different_types_are_written(tmp_path: Path) -> None:
    """All-NaN predictions first, then numbers; an int column that turns float, then text; None then bools."""
    chunks = [
        pd.DataFrame({"x": [1, 2], "pred_ms": [np.nan, np.nan], "note": [3, 4], "ok": [None, None]}),
        pd.DataFrame({"x": [2.5, 3.5], "pred_ms": [1.0, 2.0], "note": ["a", None], "ok": [True, False]}),
        pd.DataFrame({"x": [4, 5], "pred_ms": [3.0, np.nan], "note": [5.5, 6.0], "ok": [None, True]}),
    ]
    path = tmp_path / "out.parquet"
    with TableWriter(path) as writer:
        for chunk in chunks:
            writer.write(chunk)
    got = pd.read_parquet(path)
    assert writer.rows == 6 and len(got) == 6
    np.testing.assert_array_equal(got["x"], [1, 2, 2.5, 3.5, 4, 5])
    np.testing.assert_array_equal(got["pred_ms"].isna(), [True, True, False, False, False, True])
    assert got["note"].tolist()[:3] == ["3", "4", "a"] and pd.isna(got["note"].iloc[3])  # irreconcilable: text
    assert got["ok"].isna().tolist() == [True, True, False, False, True, False]
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]  # no pieces left behind


def test_parquet_chunks_of_one_type_keep_pandas_dtypes(tmp_path: Path) -> None:
    frame = pd.DataFrame({"n": pd.array([1, None, 3, 4], dtype="Int64"), "s": ["a", "b", None, "d"]})
    with TableWriter(tmp_path / "t.parquet") as writer:
        writer.write(frame.iloc[:2])
        writer.write(frame.iloc[2:])
    got = pd.read_parquet(tmp_path / "t.parquet")
    assert str(got["n"].dtype) == "Int64"
    pd.testing.assert_frame_equal(got, frame, check_dtype=False)


def test_zero_row_parquet_yields_its_columns(tmp_path: Path) -> None:
    FRAME.iloc[:0].to_parquet(tmp_path / "empty.parquet", index=False)
    chunks = list(iter_table_chunks(tmp_path / "empty.parquet"))
    assert len(chunks) == 1 and chunks[0].empty and list(chunks[0].columns) == ["a", "b"]


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("t.parquet", lambda raw: raw[: len(raw) // 2]),  # truncated
        ("t.parquet", lambda raw: raw[:4] + b"\xff" * (len(raw) - 8) + raw[-4:]),  # damaged, magic intact
        ("t.csv.gz", lambda raw: raw[: len(raw) // 2]),  # truncated gzip
        ("t.csv.gz", lambda raw: b"\x1f\x8b" + b"\x00" * 30),  # a gzip header and garbage
    ],
)
def test_damaged_or_truncated_input_is_a_dataset_error(tmp_path: Path, name: str, damage) -> None:
    path = tmp_path / name
    big = pd.DataFrame({"a": np.arange(20_000), "b": np.random.default_rng(0).random(20_000)})
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(big.to_csv(index=False).encode()))
    else:
        big.to_parquet(path, index=False)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DatasetError, match=str(path)):
        list(iter_table_chunks(path, chunk_rows=1000))
    assert count_rows(path) is None or isinstance(count_rows(path), int)  # never raises


def test_output_naming_a_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out.csv").mkdir()
    with pytest.raises(DatasetError, match="is a folder"), TableWriter(tmp_path / "out.csv") as writer:
        writer.write(FRAME)
    assert (tmp_path / "out.csv").is_dir() and list((tmp_path / "out.csv").iterdir()) == []


def test_temporary_names_are_recognisable_and_swept_when_their_process_is_dead(tmp_path: Path) -> None:
    target = tmp_path / "out.parquet"
    mine = temp_path(target, ".parquet")
    assert mine.name.startswith(f".out.parquet.perfcast-{os.getpid()}-") and ".tmp" in mine.name
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / mine.name.replace(f"perfcast-{os.getpid()}-", f"perfcast-{dead_pid}-")
    stale.write_bytes(b"x" * 100)
    stale_dir = temp_path(target, ".parts")
    stale_dir = stale_dir.with_name(stale_dir.name.replace(f"-{os.getpid()}-", f"-{dead_pid}-"))
    stale_dir.mkdir()
    mine.write_bytes(b"live")  # this process is alive: kept
    foreign = tmp_path / ".out.parquet.tmp"  # not perfcast's pattern: kept
    foreign.write_bytes(b"y")
    with TableWriter(target) as writer:  # the next write to the folder sweeps
        writer.write(FRAME)
    assert not stale.exists() and not stale_dir.exists()
    assert mine.exists() and foreign.exists() and target.is_file()


def test_a_killed_swapped_out_dataset_is_restored_not_deleted(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    old = temp_path(tmp_path / "ds", kind="old")
    old = old.with_name(old.name.replace(f"-{os.getpid()}-", f"-{int(dead.stdout)}-"))
    old.mkdir()
    (old / "card.json").write_text("{}")
    assert sweep_stale_temps(tmp_path) == [old]
    assert (tmp_path / "ds" / "card.json").is_file() and not old.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_removes_the_temporary_file(tmp_path: Path, sig: signal.Signals) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        import pandas as pd
        from perfcast.data.table_stream import TableWriter
        with TableWriter({str(tmp_path / "out.parquet")!r}) as writer:
            writer.write(pd.DataFrame({{"a": range(1000)}}))
            print("written", flush=True)
            time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "written"
    assert any(p.name.startswith(".out.parquet.perfcast-") for p in tmp_path.iterdir())
    proc.send_signal(sig)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    assert list(tmp_path.iterdir()) == []
