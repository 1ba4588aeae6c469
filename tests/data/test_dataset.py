"""Dataset folders: atomic writes, cards, hashes and checked loading."""

from __future__ import annotations

import json
from pathlib import Path

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
    assert loaded.card["rejected"] == {"rows": 1, "by_reason": {"op: unknown": 1}}
    assert loaded.runs.empty and len(loaded.rejected) == 1
    assert ds.list_datasets(tmp_path) == [path]


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


def test_content_hash_ignores_storage_but_not_values() -> None:
    df = _records()
    assert ds.content_hash(df) == ds.content_hash(df.copy())
    assert ds.content_hash(df) != ds.content_hash(df.assign(measured_ms=[0.05, 0.02]))
