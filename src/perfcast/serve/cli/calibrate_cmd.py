"""``perfcast calibrate``: fit a per-GPU correction from a minute of measurements on this machine.

It profiles a short sweep of GEMMs and vector ops on the device, predicts the same ops
with the op predictor, and stores the per-class correction
(:mod:`perfcast.models.calibration`) under the calibration folder
(:mod:`perfcast.serve.calibration_store`), where later ``perfcast predict ops`` runs with
the same predictor pick it up for that GPU. Measured ops that are implausible or outliers
are named and left out of the fit. On a CPU the host becomes a user hardware entry built
from the measured GEMM rate and copy bandwidth.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from perfcast.errors import PerfcastError
from perfcast.serve.calibration_store import FOLDER_HELP, calibration_dir
from perfcast.serve.cli._guard import user_errors

CALIBRATION_FAMILIES = ("gemm", "elementwise", "norm", "softmax")
LABEL_COLUMNS = ("batch", "m", "n", "k", "rows", "cols", "heads", "seq_q", "seq_kv", "head_dim", "bytes")
"""Shape columns that name a measured op in the report of rows left out."""
_err = Console(stderr=True, soft_wrap=True)


def _host_gpu_id(name: str, card: dict) -> str:
    """Save the host as a user hardware entry from the profile's measured rates; return its id."""
    from perfcast.features.hardware_spec import add_user_hardware
    from perfcast.features.host_hardware import host_hardware_spec

    rates = card["extra"]["method"]["calibration"]
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    spec = host_hardware_spec(
        name,
        cores=os.cpu_count() or 1,
        mem_gib=round(mem_gib, 1),
        gemm_tflops={k: v for k, v in rates["gemm_tflops"].items() if v},
        copy_gbps=float(rates["copy_gbps"]),
    )
    path = add_user_hardware(spec)
    _err.print(f"host entry {spec.id} saved to {path}")
    return spec.id


def calibrate_command(
    ctx: typer.Context,
    device: str = typer.Option("cuda", "--device", help="cuda or cpu: the device to measure."),
    budget_s: float = typer.Option(60.0, "--budget-s", help="Measurement budget, seconds."),
    model: str | None = typer.Option(None, "--model", help="Op predictor: 'analytic', a bundle or an MLflow URI."),
    dtype: str | None = typer.Option(None, "--dtype", help="Dtype to measure (default: bf16 on cuda, fp32 on cpu)."),
    store: Path | None = typer.Option(
        None,
        "--store",
        help=f"Folder to store the correction in (default: {FOLDER_HELP}; perfcast predict reads only that one).",
    ),
) -> None:
    """Measure a short sweep of ops on this device and store its per-GPU correction.

    The correction is stored in $PERFCAST_CALIBRATION_DIR if set, else
    ~/.config/perfcast/calibration, and applies to later predictions of the same
    predictor (--model) only; each prediction row names it in its calibration column.
    `perfcast calibrate steps RUNS` instead fits per-cluster step corrections from measured runs.
    """
    if ctx.invoked_subcommand is not None:
        return
    from perfcast.data.profiler import run_profile
    from perfcast.features.hardware_spec import resolve_gpu_name
    from perfcast.features.sweeps import profile_plan
    from perfcast.models.calibration import fit_correction, predictor_identity, save_correction
    from perfcast.serve.predictors import load_op_predictor

    def run() -> None:
        chosen = dtype or ("bf16" if device == "cuda" else "fp32")
        plan = profile_plan(CALIBRATION_FAMILIES, [chosen])
        with tempfile.TemporaryDirectory(prefix="perfcast-calibrate-") as tmp:
            _err.print(f"measuring up to {budget_s:.0f} s on {device} ({chosen})")
            result = run_profile(plan, device, Path(tmp) / "profile", budget_s=budget_s, resume=False)
        if result.records.empty:
            raise PerfcastError("no op could be measured within the budget; raise --budget-s")
        info = result.card["extra"]["device"]
        gpu = _host_gpu_id(info["name"], result.card) if device == "cpu" else resolve_gpu_name(info["name"])
        records = result.records.assign(gpu=gpu)
        predictor = load_op_predictor(model)
        pred, _, _ = predictor.predict_ops(records)
        measured = records["measured_ms"].to_numpy(dtype=float)
        identity = predictor_identity(predictor)
        correction = fit_correction(
            gpu,
            records,
            measured,
            np.asarray(pred),
            model=predictor.name,
            predictor=identity,
            labels=op_labels(records),
        )
        path = save_correction(correction, store or calibration_dir())
        _report(correction, records, measured, np.asarray(pred))
        for reason in correction.excluded:
            _err.print(f"left out of the fit: {reason}", markup=False)
        _err.print(
            f"correction for {gpu} saved to {path}; perfcast predict ops applies it to {gpu} rows "
            f"predicted by {identity}",
            markup=False,
        )

    with user_errors():
        run()


def op_labels(records: pd.DataFrame) -> Sequence[str]:
    """How the report names each measured op: ``row <i> (<op> <shape>)``."""
    labels = []
    for pos, (_, row) in enumerate(records.iterrows()):
        shape = " ".join(f"{c}={row[c]:g}" for c in LABEL_COLUMNS if c in row.index and _number(row[c]))
        labels.append(f"row {pos} ({row.get('op', '?')} {shape})".replace(" )", ")"))
    return labels


def _number(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and bool(np.isfinite(value))


def _report(correction, records: pd.DataFrame, measured: np.ndarray, pred: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    """Table of the correction per class: MAPE of the model, then of the corrected model.

    The corrected MAPE is out-of-sample where the class has a measured spread (leave-one-out
    or cross-fitted residuals, from ``MIN_OPS_FOR_SPREAD`` ops), in-sample otherwise.
    """
    from perfcast.features.ops import op_classes, op_kinds

    classes = op_classes(op_kinds(records))
    valid = np.isfinite(measured) & (measured > 0) & np.isfinite(pred) & (pred > 0)
    corrected = pred * np.exp(correction.log_factors(records))
    table = Table(title=f"calibration of {correction.gpu} (on the measured ops)")
    for col in ("class", "ops", "factor", "MAPE before %", "MAPE after %", "after is"):
        table.add_column(col)
    for cls, shift in correction.shifts.items():
        m = (classes == cls) & valid
        before = float(np.mean(np.abs(pred[m] / measured[m] - 1)) * 100)
        if cls in correction.spread:
            after = float(np.mean(np.abs(np.exp(-np.asarray(correction.spread[cls])) - 1)) * 100)
            kind = "held out"
        else:
            after = float(np.mean(np.abs(corrected[m] / measured[m] - 1)) * 100)
            kind = "in-sample"
        table.add_row(cls, str(correction.n_ops[cls]), f"{np.exp(shift):.3f}", f"{before:.1f}", f"{after:.1f}", kind)
    Console().print(table)
