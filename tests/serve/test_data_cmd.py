"""`perfcast data` commands through the real Typer app."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from perfcast.serve.cli import app

runner = CliRunner()


def _deepbench(path: Path) -> Path:
    pd.DataFrame(
        {
            "gpu": ["NVIDIA Tesla V100", "NVIDIA Tesla V100", "NVIDIA GTX 1080 Ti"],
            "precision": "Float",
            "sheet": "s",
            "app": "a",
            "M": [1024, 2048, 1024],
            "N": 1024,
            "K": 1024,
            "transA": "N",
            "transB": "N",
            "time_ms": [0.2, 0.4, 0.3],
            "tflops_reported": 10.0,
            "software": "x",
            "source_path": "p",
        }
    ).to_csv(path, index=False)
    return path


def test_import_ls_show_validate(tmp_path: Path) -> None:
    src = _deepbench(tmp_path / "deepbench_gemm.csv")
    out = tmp_path / "datasets" / "db"
    result = runner.invoke(app, ["data", "import", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    card = json.loads((out / "card.json").read_text())
    assert card["tables"]["ops"]["rows"] == 2 and card["rejected"]["rows"] == 1
    listing = runner.invoke(app, ["data", "ls", str(tmp_path / "datasets")])
    assert listing.exit_code == 0 and "v100-sxm2-32gb" in listing.output
    shown = runner.invoke(app, ["data", "show", str(out)])
    assert shown.exit_code == 0 and '"rows": 2' in shown.output
    valid = runner.invoke(app, ["data", "validate", str(out)])
    assert valid.exit_code == 0 and "valid (2 op records" in valid.output


def test_validate_reports_bad_rows_and_exits_2(tmp_path: Path) -> None:
    table = tmp_path / "ops.csv"
    pd.DataFrame(
        {
            "op": ["matmul", "matmul"],
            "batch": 1,
            "m": [64, -1],
            "n": 64,
            "k": 64,
            "dtype": "bf16",
            "gpu": "h100",
            "measured_ms": [0.01, 0.01],
            "source": "me",
        }
    ).to_csv(table, index=False)
    result = runner.invoke(app, ["data", "validate", str(table)])
    assert result.exit_code == 2
    assert "row 1: m must be a positive integer for op=matmul" in result.output
    assert "1 of 2 ops records are invalid" in result.output


def test_import_all_and_readers(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    _deepbench(folder / "deepbench_gemm.csv")
    (folder / "notes.txt").write_text("not a source")
    result = runner.invoke(
        app, ["data", "import-all", str(folder), "-o", str(tmp_path / "out")], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "deepbench-gemm" / "card.json").is_file()
    assert "deepbench-gemm" in runner.invoke(app, ["data", "readers"], env={"COLUMNS": "200"}).output


def test_missing_source_is_one_line_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["data", "import", str(tmp_path / "deepbench_gemm.csv"), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert result.output.strip().startswith("error:")
