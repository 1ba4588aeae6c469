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


def test_import_never_deletes_a_folder_it_did_not_write(tmp_path: Path) -> None:
    src = _deepbench(tmp_path / "deepbench_gemm.csv")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for extra in ([], ["--force"]):
        result = runner.invoke(app, ["data", "import", str(src), "-o", str(mine), *extra])
        assert result.exit_code == 2
        assert result.output.strip().splitlines() == [result.output.strip()]  # one line
        assert "not a perfcast dataset" in result.output and "notes.txt" in result.output
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_import_replaces_an_existing_dataset_only_with_force(tmp_path: Path) -> None:
    src = _deepbench(tmp_path / "deepbench_gemm.csv")
    out = tmp_path / "db"
    assert runner.invoke(app, ["data", "import", str(src), "-o", str(out)]).exit_code == 0
    again = runner.invoke(app, ["data", "import", str(src), "-o", str(out), "--name", "v2"])
    assert again.exit_code == 2 and "--force" in again.output
    forced = runner.invoke(app, ["data", "import", str(src), "-o", str(out), "--name", "v2", "--force"])
    assert forced.exit_code == 0, forced.output
    assert json.loads((out / "card.json").read_text())["name"] == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db", "deepbench_gemm.csv"]  # no temporary left
    rerun = runner.invoke(app, ["data", "import-all", str(tmp_path), "-o", str(tmp_path / "all")])
    assert rerun.exit_code == 0
    refused = runner.invoke(app, ["data", "import-all", str(tmp_path), "-o", str(tmp_path / "all")])
    assert refused.exit_code == 2 and "--force" in refused.output
    assert (
        runner.invoke(app, ["data", "import-all", str(tmp_path), "-o", str(tmp_path / "all"), "--force"]).exit_code == 0
    )


def test_imported_shared_dataset_validates(tmp_path: Path) -> None:
    """The audit's reproduction: a freshly imported public set passes its own validation."""
    src = Path(__file__).resolve().parents[4] / "shared" / "data" / "deepbench_gemm.csv"
    if not src.is_file():
        src = _deepbench(tmp_path / "deepbench_gemm.csv")
    out = tmp_path / "x"
    assert runner.invoke(app, ["data", "import", str(src), "-o", str(out)]).exit_code == 0
    valid = runner.invoke(app, ["data", "validate", str(out)])
    assert valid.exit_code == 0, valid.output
    for name in ("ops.parquet", "rejected.parquet"):
        if (out / name).is_file():
            df = pd.read_parquet(out / name)
            assert not (df.astype(str) == "nan").to_numpy().any()


def test_truncated_gzip_source_is_one_line_exit_2(tmp_path: Path) -> None:
    import gzip

    src = _deepbench(tmp_path / "x.csv")
    gz = tmp_path / "deepbench_gemm.csv.gz"
    gz.write_bytes(gzip.compress(src.read_bytes() * 50)[:200])
    result = runner.invoke(app, ["data", "import", str(gz), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "truncated" in result.output and "Aborted" not in result.output
    validated = runner.invoke(app, ["data", "validate", str(gz)])
    assert validated.exit_code == 2 and validated.output.startswith("error:")


def test_validate_bad_cards_and_damaged_files_exit_2(tmp_path: Path) -> None:
    src = _deepbench(tmp_path / "deepbench_gemm.csv")
    out = tmp_path / "db"
    assert runner.invoke(app, ["data", "import", str(src), "-o", str(out)]).exit_code == 0
    card = json.loads((out / "card.json").read_text())
    for tables in (None, {}, {"ops": {**card["tables"]["ops"], "rows": 7}}):
        (out / "card.json").write_text(json.dumps({**card, "tables": tables}))
        result = runner.invoke(app, ["data", "validate", str(out)])
        assert result.exit_code == 2 and result.output.startswith("error:"), result.output
        assert len(result.output.strip().splitlines()) == 1
        if tables is None:  # a broken card is listed as such, the listing goes on
            listing = runner.invoke(app, ["data", "ls", str(tmp_path)], env={"COLUMNS": "300"})
            assert listing.exit_code == 0 and "(invalid)" in listing.output
    (out / "card.json").write_text(json.dumps(card))
    (out / "rejected.parquet").write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    result = runner.invoke(app, ["data", "validate", str(out)])
    assert result.exit_code == 2 and "rejected.parquet" in result.output
    (tmp_path / "t.parquet").write_bytes(b"PAR1 not really")
    result = runner.invoke(app, ["data", "validate", str(tmp_path / "t.parquet")])
    assert result.exit_code == 2 and result.output.startswith("error: cannot parse parquet table")
