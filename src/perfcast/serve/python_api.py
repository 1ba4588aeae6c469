"""perfcast from Python: the functions ``import perfcast`` exports, for notebooks and scripts.

Each takes a table as a DataFrame or a file path (CSV, gzip CSV, Parquet) and returns a
DataFrame, and loads its predictor exactly as the CLI does
(:func:`~perfcast.serve.predictors.load_calibrated_predictor`): the shipped default
predictor unless ``model`` names another, with the stored calibrations fitted for it
unless ``calibration=False``. So ``perfcast.predict_steps("runs.csv")`` gives the numbers
``perfcast predict steps runs.csv`` writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from perfcast.data.schema import DType
from perfcast.data.tables import read_table
from perfcast.models.predictor_protocol import OpPredictor, StepTimePredictor
from perfcast.serve.batch import DEFAULT_COVERAGE, predict_ops_table, predict_steps_table
from perfcast.serve.predictors import KINDS, load_calibrated_predictor

Table = pd.DataFrame | str | Path
"""A run or op table, or the path of one."""


def load_predictor(
    kind: str = "steps", model: str | None = None, *, calibration: bool = True
) -> OpPredictor | StepTimePredictor:
    """The ``steps`` or ``ops`` predictor named by ``model`` (``None``: the shipped default;
    ``analytic``; ``composed`` for steps; a bundle folder; an MLflow model URI), with its
    stored calibrations unless ``calibration=False``.

    Raises:
        SpecError: an unknown ``kind``.
        BundleError: a reference that cannot be loaded, or an invalid stored correction.
    """
    return load_calibrated_predictor(kind, model, calibration)


def _predictor(
    kind: str, model: str | OpPredictor | StepTimePredictor | None, calibration: bool
) -> OpPredictor | StepTimePredictor:
    """``model`` itself when it is a loaded predictor, else the one it names."""
    if model is None or isinstance(model, str):
        return load_predictor(kind, model, calibration=calibration)
    return model


def _table(table: Table) -> pd.DataFrame:
    return table if isinstance(table, pd.DataFrame) else read_table(table)


def predict_steps(
    runs: Table,
    model: str | StepTimePredictor | None = None,
    coverage: float = DEFAULT_COVERAGE,
    breakdown: bool = False,
    *,
    calibration: bool = True,
) -> pd.DataFrame:
    """Predict every row of a run table: the rows with ``step_ms`` and its interval, memory,
    MFU, tokens/s, ``defaulted_fields``, ``calibration`` and ``error`` (DESIGN.md "Interfaces").

    Args:
        runs: the run table, or its path.
        model: a predictor reference (see :func:`load_predictor`) or a loaded predictor.
        coverage: nominal coverage of ``step_lo_ms..step_hi_ms``, in (0, 1).
        breakdown: add where the step time goes (compute, exposed communication by group
            and the links it crosses, bubble, optimizer, memory parts).
        calibration: apply the stored corrections fitted for the predictor.

    Raises:
        DatasetError: an unreadable table file.
        SpecError: a coverage outside (0, 1).
    """
    predictor = _predictor("steps", model, calibration)
    return predict_steps_table(_table(runs), predictor=predictor, coverage=coverage, breakdown=breakdown)


def predict_ops(
    ops: Table, model: str | OpPredictor | None = None, coverage: float = DEFAULT_COVERAGE, *, calibration: bool = True
) -> pd.DataFrame:
    """Predict every row of an op table: the rows with ``pred_ms``, ``pred_lo_ms``,
    ``pred_hi_ms``, ``calibration`` and ``error`` (arguments as :func:`predict_steps`)."""
    predictor = _predictor("ops", model, calibration)
    return predict_ops_table(_table(ops), predictor=predictor, coverage=coverage)


def search(
    model: str | Mapping[str, Any],
    gpus: str | Sequence[str],
    num_gpus: int,
    global_batch: int,
    *,
    predictor: str | StepTimePredictor | None = None,
    calibration: bool = True,
    dtype: str = "bf16",
    **options: Any,
) -> pd.DataFrame:
    """Every layout of ``model`` on ``num_gpus`` GPUs of each type in ``gpus`` that fits in
    memory, ranked by predicted step time (by cost per step with ``price_per_gpu_hour``).

    Args:
        model: a preset id, a Hugging Face ``config.json`` path or a config mapping.
        gpus: one GPU type or several to compare.
        num_gpus, global_batch: cluster size and sequences per step.
        predictor: a step predictor reference or a loaded one (default: the shipped one).
        calibration: apply the stored corrections fitted for the predictor.
        dtype: the training precision.
        options: the other keywords of :func:`perfcast.serve.search.search_layouts`
            (``gpus_per_node``, ``inter_node``, ``seq_len``, ``finetune``, ``lora_rank``,
            ``document_tokens``, ``framework``, ``price_per_gpu_hour``, ``coverage``, ``max_layouts`` ...).

    Returns:
        The ranked layouts, best first, with ``rank``; ``attrs`` holds ``n_layouts``,
        ``n_out_of_memory`` and ``skipped_gpus`` (GPU types left out for lacking the dtype, with reasons).

    Raises:
        SpecError: as :func:`~perfcast.serve.search.search_layouts`.
    """
    from perfcast.serve.search import search_layouts

    types = [gpus] if isinstance(gpus, str) else list(gpus)
    steps = _predictor("steps", predictor, calibration)
    result = search_layouts(model, types, num_gpus, global_batch, predictor=steps, dtype=DType.parse(dtype), **options)
    ranked = result.ranked
    ranked.attrs.update(n_layouts=result.n_layouts, n_out_of_memory=result.n_out_of_memory,
                        skipped_gpus=list(result.skipped_gpus))  # fmt: skip
    return ranked


__all__ = ["KINDS", "load_predictor", "predict_ops", "predict_steps", "search"]
