"""The reader registry and the one-call loader."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from fixtures.shared import SHARED_DATA

from perfcast.data.sources import READERS, detect_reader, get_reader, read_source
from perfcast.errors import DatasetError
from perfcast.features.hardware import resolve_gpu_name


def test_every_reader_imports_and_names_are_unique() -> None:
    assert len({r.name for r in READERS}) == len(READERS)
    for reader in READERS:
        assert callable(reader.load())
        assert reader.kind in {"ops", "runs"}


@pytest.mark.parametrize(
    ("name", "reader"),
    [
        ("neusight_kernels_gemm.csv.gz", "neusight-gemm"),
        ("vtrain_megatron_iteration_time.csv", "vtrain-iterations"),
        ("mlperf_training_llm_runs.csv", "mlperf-llm-runs"),
        ("published_llm_training_steps.csv", "published-steps"),
        ("run1.pt.trace.json.gz", "torch-trace"),
        ("profile.sqlite", "nsys-sqlite"),
        ("gpt_megatron_train.log", "megatron-log"),
    ],
)
def test_detect_reader_by_file_name(name: str, reader: str) -> None:
    assert detect_reader(name).name == reader


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(DatasetError, match="neusight-gemm"):
        detect_reader("mystery.xlsx")
    with pytest.raises(DatasetError, match="not a known reader"):
        get_reader("nope")


def test_required_options_are_named(tmp_path: Path) -> None:
    log = tmp_path / "megatron.log"
    log.write_text("nothing")
    with pytest.raises(DatasetError, match="--gpu"):
        read_source(log)


def test_checks_apply_after_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "deepbench_gemm.csv"
    pd.DataFrame(
        {
            "gpu": ["NVIDIA Tesla V100", "NVIDIA GTX 1080 Ti"],
            "precision": ["Float", "Float"],
            "sheet": "s",
            "app": "a",
            "M": [1024, 1024],
            "N": [1024, 1024],
            "K": [1024, 1024],
            "transA": "N",
            "transB": "N",
            "time_ms": [0.2, 0.3],
            "tflops_reported": [10.0, 7.0],
            "software": "x",
            "source_path": "p",
        }
    ).to_csv(path, index=False)
    loaded = read_source(path, resolve_gpu=resolve_gpu_name)
    assert loaded.kind == "ops" and list(loaded.records["gpu"]) == ["v100-sxm2-32gb"]
    assert "not in the hardware catalog" in loaded.rejected["reason"].iloc[0]
    assert loaded.n_read == 2


@pytest.mark.shared_data
@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent")
def test_every_shared_file_has_a_reader() -> None:
    files = [p for p in SHARED_DATA.iterdir() if p.suffix in {".csv", ".gz"}]
    assert len(files) == 15
    assert {detect_reader(p).name for p in files} == {r.name for r in READERS if r.patterns[0].count("_") > 0}
