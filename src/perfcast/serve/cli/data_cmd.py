"""``perfcast data``: import sources into datasets, list, show and validate them.

``import`` turns source files (public sets, torch.profiler traces, Nsight Systems
exports, Megatron/NeMo logs) into one checked dataset folder; ``import-all`` does that
for every recognised file of a folder such as ``../shared/data``, one dataset per file.
Device names resolve to hardware-catalog ids; records of devices the catalog does not
know are rejected with the reason, never dropped silently. ``-o`` may name a new or
empty folder, or (with ``--force``) an existing dataset; a folder with anything else in
it is refused, never overwritten.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from perfcast.data.dataset import check_dataset_target, list_datasets, load_dataset, read_card, write_dataset
from perfcast.data.records import REASON_COLUMN
from perfcast.data.sources import READERS, LoadedSource, detect_reader, read_source
from perfcast.data.tables import read_table
from perfcast.data.validate import check_op_records, check_run_records
from perfcast.errors import DatasetError
from perfcast.features.hardware_spec import resolve_gpu_name
from perfcast.serve.cli._guard import user_errors

data_app = typer.Typer(help="Import measured data into datasets; list, show and validate datasets.",
                       no_args_is_help=True)  # fmt: skip
_out = Console(width=None, soft_wrap=False)
_err = Console(stderr=True, soft_wrap=True)


def _how_measured(loaded: list[LoadedSource]) -> str:
    descriptions = sorted({src.reader.description for src in loaded})
    return "; ".join(descriptions) + " (see the reader's module docstring for the statistic and units)"


def _import(
    paths: list[Path], output: Path, reader: str | None, name: str | None, force: bool, **options: object
) -> None:
    check_dataset_target(output, replace=force)  # before reading: a refusal should not wait for the parse
    loaded = [read_source(p, reader=reader, resolve_gpu=resolve_gpu_name, **options) for p in paths]
    kinds = {src.kind for src in loaded}
    tables = {kind: pd.concat([s.records for s in loaded if s.kind == kind], ignore_index=True) for kind in kinds}
    rejected = pd.concat([s.rejected for s in loaded], ignore_index=True)
    write_dataset(
        output,
        name=name or output.name,
        source=", ".join(f"{s.reader.name}:{p.name}" for s, p in zip(loaded, paths, strict=True)),
        how_measured=_how_measured(loaded),
        ops=tables.get("ops"),
        runs=tables.get("runs"),
        rejected=rejected,
        extra={"files": [str(p) for p in paths], "read_rows": sum(s.n_read for s in loaded)},
        replace=force,
    )
    n_records = sum(len(t) for t in tables.values())
    _err.print(f"wrote {output}: {n_records} records, {len(rejected)} rejected rows (reasons in rejected.parquet)")


@data_app.command("import")
def import_command(
    paths: list[Path] = typer.Argument(..., help="Source files (CSV, .csv.gz, trace JSON, .sqlite, .log)."),
    output: Path = typer.Option(..., "-o", "--output", help="Dataset folder to write (new or empty; see --force)."),
    reader: str | None = typer.Option(None, "--reader", help="Reader name (default: from the file name)."),
    name: str | None = typer.Option(None, "--name", help="Dataset name (default: the folder name)."),
    device: str | None = typer.Option(None, "--device", help="Device of a torch trace, as torch prints it."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU of a Megatron/NeMo log run."),
    dtype: str | None = typer.Option(None, "--dtype", help="Compute dtype of an Nsight Systems export."),
    force: bool = typer.Option(False, "--force", help="Replace an existing dataset at -o (atomically)."),
) -> None:
    """Read source files into one checked dataset folder."""
    with user_errors():
        _import(paths, output, reader, name, force, device=device, gpu=gpu, dtype=dtype)


@data_app.command("import-all")
def import_all_command(
    folder: Path = typer.Argument(..., help="A folder of public source files, e.g. ../shared/data."),
    output: Path = typer.Option(..., "-o", "--output", help="Folder to hold one dataset per source file."),
    force: bool = typer.Option(False, "--force", help="Replace datasets that already exist under -o."),
) -> None:
    """Import every recognised file of FOLDER, one dataset each, and print the counts."""

    def run() -> None:
        if not folder.is_dir():
            raise DatasetError(f"no such folder: {folder}")
        table = Table(title=f"sources in {folder}")
        for col in ("file", "reader", "rows read", "records", "rejected", "top rejection reason"):
            table.add_column(col)
        sources = []
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            try:
                sources.append((path, detect_reader(path)))
            except DatasetError:
                continue
        for _, reader in sources:  # refuse before writing anything
            check_dataset_target(output / reader.name, replace=force)
        for path, reader in sources:
            loaded = read_source(path, reader=reader.name, resolve_gpu=resolve_gpu_name)
            top = ""
            if len(loaded.rejected):
                counts = loaded.rejected[REASON_COLUMN].astype(str).value_counts()
                top = f"{counts.index[0]} ({counts.iloc[0]})"
            if loaded.records.empty:  # nothing to write: say so in the table, go on with the next file
                table.add_row(path.name, reader.name, str(loaded.n_read), "0 (not written)",
                              str(len(loaded.rejected)), top)  # fmt: skip
                continue
            write_dataset(
                output / reader.name,
                source=f"{reader.name}:{path.name}",
                how_measured=_how_measured([loaded]),
                ops=loaded.records if loaded.kind == "ops" else None,
                runs=loaded.records if loaded.kind == "runs" else None,
                rejected=loaded.rejected,
                extra={"files": [str(path)], "read_rows": loaded.n_read},
                replace=force,
            )
            table.add_row(path.name, reader.name, str(loaded.n_read), str(len(loaded.records)),
                          str(len(loaded.rejected)), top)  # fmt: skip
        _out.print(table)

    with user_errors():
        run()


@data_app.command("ls")
def ls_command(root: Path = typer.Argument(Path("datasets"), help="Folder to search for datasets.")) -> None:
    """List the datasets under ROOT with their sizes and sources."""

    def run() -> None:
        table = Table(title=f"datasets under {root}")
        for col in ("path", "name", "records", "rejected", "hardware", "source"):
            table.add_column(col, overflow="fold")
        for path in list_datasets(root):
            try:
                card = read_card(path)
            except DatasetError as exc:  # one broken card does not hide the others
                table.add_row(str(path), "(invalid)", "", "", "", str(exc))
                continue
            tables = card["tables"]
            records = ", ".join(f"{k}: {v['rows']}" for k, v in tables.items())
            gpus = sorted({g for t in tables.values() for g in t.get("gpu_counts", {})})
            table.add_row(str(path), card.get("name", ""), records, str(card["rejected"]["rows"]),
                          ", ".join(gpus), str(card.get("source", "")))  # fmt: skip
        _out.print(table)

    with user_errors():
        run()


@data_app.command("show")
def show_command(path: Path = typer.Argument(..., help="A dataset folder.")) -> None:
    """Print a dataset's card (JSON)."""
    with user_errors():
        _out.print_json(json.dumps(read_card(path)))


@data_app.command("validate")
def validate_command(
    path: Path = typer.Argument(..., help="A dataset folder, or an op/run table file (CSV or Parquet)."),
    kind: str | None = typer.Option(None, "--kind", help="ops or runs, for a table file (default: guessed)."),
) -> None:
    """Check a dataset (card, hashes, every record) or a record table; exit 2 when invalid."""

    def run() -> None:
        if path.is_dir():
            ds = load_dataset(path, resolve_gpu=resolve_gpu_name)
            _err.print(f"{path}: valid ({len(ds.ops)} op records, {len(ds.runs)} run records)")
            return
        df = read_table(path)
        chosen = kind or ("ops" if "op" in df.columns else "runs")
        check = check_op_records if chosen == "ops" else check_run_records
        result = check(df, resolve_gpu=resolve_gpu_name)
        if result.n_rejected:
            for pos, reason in result.rejected[REASON_COLUMN].head(20).items():
                _err.print(f"row {pos}: {reason}")
            raise DatasetError(f"{path}: {result.n_rejected} of {len(df)} {chosen} records are invalid")
        _err.print(f"{path}: valid ({len(df)} {chosen} records)")

    with user_errors():
        run()


@data_app.command("readers")
def readers_command() -> None:
    """List the source readers and the file names they recognise."""
    table = Table(title="readers")
    for col in ("name", "records", "file names", "needs", "what"):
        table.add_column(col, overflow="fold")
    for r in READERS:
        table.add_row(r.name, r.kind, " ".join(r.patterns), " ".join(f"--{o}" for o in r.required), r.description)
    _out.print(table)
