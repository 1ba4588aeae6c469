"""``perfcast search``: rank the layouts of a model on a cluster by predicted step time (or cost)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from perfcast.serve.cli._guard import user_errors
from perfcast.serve.output import OutputFormat, echo_table
from perfcast.serve.search import DEFAULT_MAX_LAYOUTS

_err = Console(stderr=True, soft_wrap=True)
_SHOWN = ("rank", "gpu", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "recompute", "zero_stage", "dp_replicate",
          "step_ms", "step_lo_ms", "step_hi_ms", "peak_mem_gib", "mfu", "at_mfu_ceiling", "tokens_per_s",
          "usd_per_million_tokens")  # fmt: skip


def search_command(
    model: str = typer.Argument(..., help="Model preset id (`perfcast models list`) or a Hugging Face config.json."),
    gpu: list[str] = typer.Option(..., "--gpu", help="GPU type to consider (repeatable: compares types)."),
    num_gpus: int = typer.Option(..., "--num-gpus", min=1, help="GPUs in the cluster."),
    global_batch: int = typer.Option(..., "--global-batch", min=1, help="Sequences per training step."),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1, help="Sequence length (default: the model's)."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", min=1, help="Default: the GPU's usual node."),
    inter_node: str | None = typer.Option(None, "--inter-node", help="Fabric between nodes (catalog id)."),
    dtype: str = typer.Option("bf16", "--dtype", help="fp32, tf32, fp16, bf16 or fp8."),
    finetune: str = typer.Option("full", "--finetune", help="full (pre-training), sft or lora."),
    lora_rank: int = typer.Option(0, "--lora-rank", min=0, help="LoRA adapter rank (default 16 with --finetune lora)."),
    document_tokens: int | None = typer.Option(
        None, "--document-tokens", min=1, help="Attention length of sequences packed from several documents."
    ),
    framework: str | None = typer.Option(
        None, "--framework", help="Training framework (megatron-core, torchtitan, pytorch-fsdp, megatron-deepspeed, "
        "deepspeed; or nemo, fsdp2 ...): its overlaps and ZeRO stages (torchtitan and FSDP also try one replica "
        "per NVLink domain, dp_replicate). Default: none stated (nothing overlapped)."
    ),
    price: list[float] | None = typer.Option(
        None, "--price", help="USD per GPU-hour: rank by cost per step. One for every --gpu, or one per --gpu in order."
    ),
    predictor: str | None = typer.Option(
        None, "--predictor", help="Step predictor: 'analytic', 'composed', a bundle or an MLflow URI (default shipped)."
    ),
    calibration: bool = typer.Option(
        True, "--calibration/--no-calibration", help="Apply stored per-cluster corrections (perfcast calibrate steps)."
    ),
    max_layouts: int = typer.Option(
        DEFAULT_MAX_LAYOUTS, "--max-layouts", min=1, help="Most layouts enumerated (all GPU types together)."
    ),
    top: int = typer.Option(10, "--top", min=0, help="Layouts to print."),
    fmt: OutputFormat = typer.Option(
        OutputFormat.TABLE, "--format", "-f", help="table (the best --top), or csv, json, jsonl (every layout)"
    ),
    plot: Path | None = typer.Option(
        None, "--plot", help="Save a PNG of time (or cost) against memory of every ranked layout, Pareto front drawn."
    ),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write every ranked layout (.csv/.parquet)."),
) -> None:
    """Enumerate valid layouts, drop those that do not fit in memory, rank the rest by predicted step time."""
    from perfcast.data.schema import DType
    from perfcast.data.tables import check_output_path, table_format, write_table
    from perfcast.serve.predictors import load_calibrated_predictor
    from perfcast.serve.search import search_layouts

    with user_errors():
        if output is not None:  # a bad output name fails before the search, not after it
            table_format(output)
            check_output_path(output)
        step_predictor = load_calibrated_predictor("steps", predictor, calibration)
        with Progress(console=_err, transient=True) as bar:
            task = bar.add_task("predicting layouts", total=None)
            result = search_layouts(
                model, gpu, num_gpus, global_batch, predictor=step_predictor, gpus_per_node=gpus_per_node,
                inter_node=inter_node, seq_len=seq_len, dtype=DType.parse(dtype), finetune=finetune,
                lora_rank=lora_rank, document_tokens=document_tokens, framework=framework,
                price_per_gpu_hour=price or None, progress=lambda n: bar.advance(task, n), max_layouts=max_layouts,
            )  # fmt: skip
    ranked = result.ranked
    if output is not None:
        with user_errors():
            write_table(ranked, output)
    if plot is not None:
        from perfcast.training.plots import search_plot

        plot.parent.mkdir(parents=True, exist_ok=True)
        search_plot(ranked, key="usd_per_step" if price else "step_ms").savefig(plot, dpi=120)
        _err.print(f"plot: {plot}")
    for reason in result.skipped_gpus:
        _err.print(f"[yellow]left out:[/yellow] {reason}", highlight=False)
    written = f"; all written to {output}" if output else ""
    _err.print(f"{result.n_layouts} layouts, {result.n_out_of_memory} do not fit in memory, "
               f"{len(ranked)} ranked with {step_predictor.name}{written}")  # fmt: skip
    if fmt is not OutputFormat.TABLE:
        echo_table(ranked, fmt)
    elif top:
        columns = [c for c in _SHOWN if c in ranked.columns]
        best = ranked.iloc[0]
        training = "" if best["finetune"] == "full" else f", {best['finetune']}"
        training += f" rank {best['lora_rank']}" if best["finetune"] == "lora" else ""
        training += f", documents of {document_tokens} tokens" if document_tokens else ""
        training += f", {best['framework']}" if "framework" in ranked.columns else ""
        title = f"best layouts of {model} on {num_gpus} GPUs, global batch {global_batch}{training}"
        table = Table(*columns, title=title)
        for row in ranked.head(top).to_dict("records"):
            table.add_row(*[_cell(row[c]) for c in columns])
        Console(width=200).print(table)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if value == value else ""
    return str(value)
