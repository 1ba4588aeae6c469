"""``perfcast profile``: measure op times on this machine and write a profiling dataset.

The plan comes from :func:`perfcast.features.sweeps.profile_plan` (shapes of real model
presets under tensor-parallel splits), the measuring from
:func:`perfcast.data.profiler.run_profile`. Progress shows on stderr; the dataset
(``ops.parquet``, ``card.json``) goes to ``-o DIR``. An interrupted or budget-limited
sweep resumes where it stopped when run again with the same ``-o`` (``--resume``, the
default). Registered by ``cli.py`` as ``app.command("profile")(profile_command)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from perfcast.errors import PerfcastError
from perfcast.serve.cli._guard import user_errors

if TYPE_CHECKING:
    from perfcast.data.profiler import ProfileProgress, ProfileResult

DEFAULT_BUDGET_S = 90.0
ALL_FAMILIES = "gemm,attention,norm,softmax,elementwise,collective"

logger = logging.getLogger(__name__)


class Device(str, Enum):
    """Where ``perfcast profile`` runs the ops."""

    CPU = "cpu"
    CUDA = "cuda"


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def profile_command(
    output: Path = typer.Option(..., "-o", "--output", help="Dataset directory (ops.parquet, card.json)."),
    device: Device = typer.Option(Device.CPU, "--device", help="cpu or cuda."),
    ops: str = typer.Option(ALL_FAMILIES, "--ops", help="Comma-separated op families or op names."),
    dtypes: str | None = typer.Option(
        None,
        "--dtypes",
        help="Comma-separated dtypes (fp32, tf32, fp16, bf16, fp8); default fp32 on cpu, bf16 on cuda.",
    ),
    budget_s: float = typer.Option(DEFAULT_BUDGET_S, "--budget-s", help="Wall-clock budget, seconds.", min=1.0),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue an earlier sweep in the same directory."),
    seed: int = typer.Option(0, "--seed", help="Seeds the plan order and the random inputs."),
    presets: str | None = typer.Option(None, "--presets", help="Comma-separated model presets (default: a spread)."),
    backward: bool = typer.Option(False, "--backward/--no-backward", help="Also time backward of non-GEMM ops."),
    flush_l2: bool = typer.Option(False, "--flush-l2/--no-flush-l2", help="Flush the L2 before each CUDA repeat."),
    cpu_op_cap_s: float = typer.Option(0.5, "--cpu-op-cap-s", help="On cpu, skip ops estimated slower than this."),
) -> None:
    """Measure op times (GEMM, attention, norms, softmax, element-wise, collectives) on this machine."""
    err = Console(stderr=True, soft_wrap=True)
    try:
        with user_errors():
            result = _profile(
                err, output, device, ops, dtypes, budget_s, resume, seed, presets, backward, flush_l2, cpu_op_cap_s
            )
    except KeyboardInterrupt:
        err.print(f"[yellow]interrupted: measurements so far are kept in {output}/.partial; run again to resume[/]")
        raise typer.Exit(code=130) from None
    _summary(err, result)


def _profile(
    err: Console,
    output: Path,
    device: Device,
    ops: str,
    dtypes: str | None,
    budget_s: float,
    resume: bool,
    seed: int,
    presets: str | None,
    backward: bool,
    flush_l2: bool,
    cpu_op_cap_s: float,
) -> ProfileResult:
    from perfcast.data.profiler import detect_device, run_profile
    from perfcast.features.sweeps import parse_op_families, profile_plan

    info = detect_device(device.value)
    card_extra: dict[str, object] = {}
    if info.kind == "cuda":
        card_extra["catalog_id"] = _catalog_id(err, info.name)
    families = parse_op_families(_split(ops))
    ranks = [n for n in (2, 4, 8) if info.kind == "cuda" and n <= info.count]
    if "collective" in families and not ranks:
        err.print(f"[yellow]collectives need >= 2 CUDA devices ({info.count} {info.kind} here): none planned[/]")
    chosen_dtypes = _split(dtypes) if dtypes else (["bf16"] if info.kind == "cuda" else ["fp32"])
    plan = profile_plan(
        _split(ops),
        chosen_dtypes,
        presets=_split(presets) if presets else None,
        collective_ranks=ranks,
        backward=backward,
        seed=seed,
    )
    err.print(
        f"profiling on {info.kind} [bold]{info.name}[/] (torch {info.torch_version}): "
        f"{len(plan)} planned rows, budget {budget_s:g} s -> {output}"
    )
    with _ProgressBar(err, budget_s) as update:
        return run_profile(
            plan,
            info.kind,
            output,
            budget_s=budget_s,
            resume=resume,
            progress=update,
            flush_l2=flush_l2,
            cpu_op_cap_s=cpu_op_cap_s,
            seed=seed,
            card_extra=card_extra,
        )


def _catalog_id(err: Console, name: str) -> str | None:
    from perfcast.features.hardware_spec import resolve_gpu_name

    try:
        gpu_id = resolve_gpu_name(name)
    except PerfcastError as exc:
        err.print(f"[yellow]warning: {exc}; the records keep the printed name {name!r}[/]")
        return None
    err.print(f"device {name!r} is catalog entry [bold]{gpu_id}[/]")
    return gpu_id


class _ProgressBar:
    """A rich progress bar on stderr fed by :class:`~perfcast.data.profiler.ProfileProgress` events."""

    def __init__(self, console: Console, budget_s: float) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.budget_s = budget_s
        self.progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("rows"),
            TextColumn("{task.fields[clock]}"),
            TextColumn("[dim]{task.fields[current]}"),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("profiling", total=None, clock="", current="")

    def __enter__(self) -> Callable[[ProfileProgress], None]:
        self.progress.start()
        return self.update

    def update(self, event: ProfileProgress) -> None:
        clock = f"{event.elapsed_s:5.0f}/{event.budget_s:g} s"
        self.progress.update(
            self.task, total=event.total, completed=event.done, clock=clock, current=event.current[:60]
        )

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def _summary(err: Console, result: ProfileResult) -> None:
    plan = result.card.get("extra", {}).get("plan", {})
    err.print(
        f"measured {plan.get('measured', result.n_measured)} of {plan.get('rows', '?')} planned rows, "
        f"skipped {plan.get('skipped', result.n_skipped)}, not reached {result.n_not_reached} "
        f"in {result.elapsed_s:.1f} s"
    )
    for reason, count in sorted(result.skipped_by_reason.items()):
        err.print(f"  skipped {count:>5}  {reason}")
    state = "complete" if result.complete else "budget spent: run again with the same -o to continue"
    err.print(f"wrote {len(result.records)} records to {result.out_dir} ({state})")
