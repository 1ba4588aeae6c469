"""Dataset folders: atomic writes, cards, hashes and checked loading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfcast.data import dataset as ds
from perfcast.data.validate import check_op_records
from perfcast.errors import DatasetError


def _records() -> pd.DataFrame:
    raw = pd.DataFrame(
        {
            "op": ["matmul", "softmax"],
            "batch": [1, None],
            "m": [128, None],
            "n": [256, None],
            "k": [64, None],
            "rows": [None, 32],
            "cols": [None, 1000],
            "dtype": ["bf16", "fp32"],
            "gpu": ["h100-sxm5-80gb", "cpu"],
            "measured_ms": [0.05, 0.01],
            "source": "unit-test",
        }
    )
    return check_op_records(raw).records


def test_round_trip_keeps_records_and_card(tmp_path: Path) -> None:
    rejected = pd.DataFrame({"op": ["frob"], "reason": ["op: unknown"]})
    path = ds.write_dataset(tmp_path / "d", source="unit-test", how_measured="by hand", ops=_records(),
                            rejected=rejected)  # fmt: skip
    loaded = ds.load_dataset(path)
    pd.testing.assert_frame_equal(loaded.ops, _records(), check_dtype=False)
    assert loaded.card["tables"]["ops"]["rows"] == 2
    assert loaded.card["tables"]["ops"]["gpu_counts"] == {"h100-sxm5-80gb": 1, "cpu": 1}
    assert loaded.card["rejected"]["rows"] == 1 and loaded.card["rejected"]["by_reason"] == {"op: unknown": 1}
    assert loaded.runs.empty and len(loaded.rejected) == 1
    assert ds.list_datasets(tmp_path) == [path]


def test_the_card_counts_the_timing_methods_and_the_column_survives(tmp_path: Path) -> None:
    records = _records().assign(timing=["gpu_kernels", "cpu_op"])
    path = ds.write_dataset(tmp_path / "d", source="unit-test", how_measured="traces", ops=records)
    loaded = ds.load_dataset(path)
    assert loaded.card["tables"]["ops"]["timing_counts"] == {"gpu_kernels": 1, "cpu_op": 1}
    assert loaded.ops["timing"].tolist() == ["gpu_kernels", "cpu_op"]


def test_failed_write_keeps_the_previous_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ds.write_dataset(tmp_path / "d", source="v1", how_measured="x", ops=_records())

    def boom(df: pd.DataFrame, file: Path) -> None:
        file.write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(ds, "_to_parquet", boom)
    with pytest.raises(DatasetError, match="disk full"):
        ds.write_dataset(path, source="v2", how_measured="x", ops=_records())
    assert ds.read_card(path)["source"] == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no temporary folder left behind


def test_modified_table_is_detected(tmp_path: Path) -> None:
    path = ds.write_dataset(tmp_path / "d", source="s", how_measured="x", ops=_records())
    _records().assign(measured_ms=1.0).to_parquet(path / "ops.parquet", index=False)
    with pytest.raises(DatasetError, match="hash"):
        ds.load_dataset(path)


def test_bad_cards_and_empty_writes(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no card.json"):
        ds.load_dataset(tmp_path)
    (tmp_path / "card.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(DatasetError, match="schema_version"):
        ds.read_card(tmp_path)
    with pytest.raises(DatasetError, match="nothing to write"):
        ds.write_dataset(tmp_path / "e", source="s", how_measured="x")
    rejected = pd.DataFrame({"op": ["frob"], "reason": ["op: unknown"]})
    with pytest.raises(DatasetError, match="all 1 source rows were rejected, e.g. op: unknown"):
        ds.write_dataset(tmp_path / "e", source="s", how_measured="x", rejected=rejected)
    assert not (tmp_path / "e").exists()


def test_content_hash_ignores_storage_but_not_values() -> None:
    df = _records()
    assert ds.content_hash(df) == ds.content_hash(df.copy())
    assert ds.content_hash(df) != ds.content_hash(df.assign(measured_ms=[0.05, 0.02]))


def _mixed_source_rows() -> pd.DataFrame:
    """Records as a CSV reader leaves them: empty text cells (NaN), a column of numbers and text."""
    raw = pd.concat([check_op_records(_records()).records] * 2, ignore_index=True)
    raw["app"] = [None, "train", np.nan, "infer"]
    raw["note"] = pd.Series([1, "x", np.nan, 2.5], dtype=object)
    return raw


def test_written_dataset_validates_and_keeps_empty_cells_empty(tmp_path: Path) -> None:
    records = _mixed_source_rows()
    rejected = pd.DataFrame({"gpu": ["?"], "app": [np.nan], "backward": pd.Series([np.nan], dtype=object),
                             "reason": ["gpu: unknown"]})  # fmt: skip
    path = ds.write_dataset(tmp_path / "d", source="s", how_measured="x", ops=records, rejected=rejected)
    loaded = ds.load_dataset(path)  # the card's hashes match the files as written
    assert loaded.ops["app"].isna().tolist() == [True, False, True, False]
    assert loaded.ops["note"].tolist()[:2] == ["1", "x"] and pd.isna(loaded.ops["note"].iloc[2])
    assert loaded.rejected["app"].isna().all() and loaded.rejected["backward"].isna().all()
    for df in (pd.read_parquet(path / "ops.parquet"), pd.read_parquet(path / "rejected.parquet")):
        assert not (df.astype(str) == "nan").to_numpy().any()


def _edit_card(path: Path, edit) -> None:
    card = json.loads((path / "card.json").read_text())
    edit(card)
    (path / "card.json").write_text(json.dumps(card))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda c: c.update(tables=None), "tables must be an object"),
        (lambda c: c.update(tables=[]), "tables must be an object"),
        (lambda c: c.update(tables={}), "tables is empty"),
        (lambda c: c["tables"].update(runs=c["tables"]["ops"]), "runs.parquet is missing"),
        (lambda c: c["tables"].update(frob={"rows": 1, "content_hash": "x"}), "unknown table"),
        (lambda c: c["tables"]["ops"].update(rows=3), "2 rows, but the card says 3"),
        (lambda c: c["tables"]["ops"].update(rows="2"), "rows must be a whole number"),
        (lambda c: c["tables"]["ops"].update(content_hash=None), "content_hash must be"),
        (lambda c: c["tables"].update(ops=None), "tables.ops must be an object"),
        (lambda c: c.update(rejected=None), "rejected must be an object"),
        (lambda c: c["rejected"].update(rows=5), "1 rows, but the card says 5"),
    ],
)
def test_card_that_does_not_match_its_files_fails_validation(tmp_path: Path, edit, match: str) -> None:
    rejected = pd.DataFrame({"op": ["frob"], "reason": ["op: unknown"]})
    path = ds.write_dataset(tmp_path / "d", source="s", how_measured="x", ops=_records(), rejected=rejected)
    _edit_card(path, edit)
    with pytest.raises(DatasetError, match=match):
        ds.load_dataset(path)


def test_a_table_file_the_card_does_not_list_fails_validation(tmp_path: Path) -> None:
    path = ds.write_dataset(tmp_path / "d", source="s", how_measured="x", ops=_records())
    _records().to_parquet(path / "runs.parquet")
    with pytest.raises(DatasetError, match="does not list 'runs'"):
        ds.load_dataset(path)


@pytest.mark.parametrize("file", ["ops.parquet", "rejected.parquet"])
def test_damaged_parquet_in_a_dataset_is_named(tmp_path: Path, file: str) -> None:
    rejected = pd.DataFrame({"op": ["frob"], "reason": ["op: unknown"]})
    path = ds.write_dataset(tmp_path / "d", source="s", how_measured="x", ops=_records(), rejected=rejected)
    raw = (path / file).read_bytes()
    (path / file).write_bytes(raw[:4] + b"\x00" * (len(raw) - 8) + raw[-4:])
    with pytest.raises(DatasetError, match=f"{file}: unreadable Parquet file"):
        ds.load_dataset(path)


def test_writes_never_replace_a_folder_perfcast_did_not_write(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    with pytest.raises(DatasetError, match=r"not a perfcast dataset \(it holds thesis.tex\)"):
        ds.write_dataset(mine, source="s", how_measured="x", ops=_records())
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetError, match="not a folder"):
        ds.write_dataset(tmp_path / "file", source="s", how_measured="x", ops=_records())
    # an empty folder is fine; an existing dataset only with replace
    (tmp_path / "empty").mkdir()
    path = ds.write_dataset(tmp_path / "empty", source="v1", how_measured="x", ops=_records())
    with pytest.raises(DatasetError, match="already a dataset; pass --force"):
        ds.write_dataset(path, source="v2", how_measured="x", ops=_records(), replace=False)
    ds.write_dataset(path, source="v2", how_measured="x", ops=_records(), replace=True)
    assert ds.read_card(path)["source"] == "v2"
    (path / "notes.txt").write_text("mine")  # a user file inside a dataset: not replaced either
    with pytest.raises(DatasetError, match="notes.txt"):
        ds.write_dataset(path, source="v3", how_measured="x", ops=_records(), replace=True)
    assert (path / "notes.txt").read_text() == "mine"
