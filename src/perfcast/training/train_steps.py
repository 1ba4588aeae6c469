"""Measured runs -> composed steps -> run features, the evaluation splits and their metrics.

The measured run tables (``../shared/data``): vTrain's Megatron iterations (GPT models on
2-8 A100s), NeuSight's end-to-end latencies (one GPU; forward-only inference and
forward+backward training) and MLPerf's GPT-3 175B step times (H100/B200 systems of
64-10,752 GPUs; most MLPerf rows only have a time to train and are left out) and the step
times that framework authors publish (llm-foundry, torchtitan, NeMo, NeMo AutoModel; A100 and
H100/H200, 1-1,024 GPUs; MaxText rows give no step time and are left out).

* :func:`load_runs` reads them into one run table with a ``source`` column
  (``vtrain | neusight | mlperf``, and one ``published:<table>`` per publishing table),
  keeping rows with a measured step time.
* :func:`build_step_table` parses every row into a checked config (rows that fail are
  returned with their reason, not dropped silently), composes them with a
  :class:`~perfcast.models.composer.StepComposer` and featurises them.
* Split functions return boolean train/test masks over a step table's rows.
* :func:`evaluate_steps` gives MAPE, median and p90 APE, interval coverage and width
  (:mod:`perfcast.training.metrics`) and Spearman rank correlation within every
  (model, cluster) group.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast._optional import require
from perfcast.data.sources import read_source
from perfcast.errors import SpecError
from perfcast.features.model import TransformerSpec
from perfcast.features.run_config import RunConfig, parse_run_row
from perfcast.models.composer import TIMING_SCOPES, StepComposer, composed_frame
from perfcast.models.physics_bounds import MFUCeiling, apply_floor
from perfcast.models.step_model import StepTimeRegressor
from perfcast.models.step_predictor import step_features
from perfcast.training.defaults import DEFAULT_CORRECTION_SCALE
from perfcast.training.metrics import spearman, summarize

__all__ = [
    "RUN_FILES",
    "SOURCE_FRAMEWORKS",
    "TABLE_SOURCES",
    "StepTable",
    "build_step_table",
    "domain_groups",
    "fit_step_model",
    "evaluate_steps",
    "group_spearman",
    "load_runs",
    "parse_runs",
    "run_groups",
    "split_mlperf_old_to_new",
    "split_mlperf_small_to_large",
    "split_vtrain_small_to_large",
]

logger = logging.getLogger(__name__)

RUN_FILES: Mapping[str, str] = {
    "vtrain": "vtrain_megatron_iteration_time.csv",
    "neusight": "neusight_e2e_latency.csv",
    "mlperf": "mlperf_training_llm_runs.csv",
    "published": "published_llm_training_steps.csv",
}
"""Source name -> measured run table in the shared data folder."""
TABLE_SOURCES: frozenset[str] = frozenset({"published"})
"""Sources whose reader names each row's publishing table in ``source`` (``published:torchtitan`` ...):
that id stays the row's ``source``, so splits and source balancing see every table on its own."""
SOURCE_FRAMEWORKS: Mapping[str, str] = {
    "vtrain": "megatron-deepspeed",
    "mlperf": "megatron-core",
    "neusight": "pytorch-eager",
}
"""``framework_group`` of a source's rows that state no ``framework``: vTrain profiled
Megatron-DeepSpeed, MLPerf's GPT-3 submissions run NVIDIA NeMo (Megatron-Core), NeuSight ran
Hugging Face models in eager PyTorch on one GPU. Only a split label: the parser never reads it."""
REQUIRED_MODEL_FIELDS = ("num_layers", "hidden_size", "num_heads", "vocab_size")
"""Fields a run row needs to name its model without a preset."""
ENCODER_DECODER_ARCHITECTURES: frozenset[str] = frozenset(
    {
        "SwitchTransformersForConditionalGeneration",
        "T5ForConditionalGeneration",
        "MT5ForConditionalGeneration",
        "BartForConditionalGeneration",
    }
)
"""Hugging Face classes of encoder-decoder models (a row's ``architecture``): an encoder stack,
a decoder stack and cross-attention, which the decoder-only workload graph does not describe,
so a measured step of one is not a measurement of the config it would parse as. Their runs
are left out of the step set (and logged)."""
MIN_GROUP_ROWS = 3
"""Smallest (model, cluster) group whose Spearman correlation counts."""


def load_runs(data_dir: str | Path, sources: Sequence[str] = tuple(RUN_FILES)) -> pd.DataFrame:
    """Measured runs of ``sources`` as one run table with ``source`` and ``timing_scope``.

    The readers' own ``source`` (file and row provenance) moves to ``source_detail``.
    ``source`` is the file's name in :data:`RUN_FILES`, except for :data:`TABLE_SOURCES`
    (the published-steps file), whose rows keep their reader's per-table id
    (``published:llm-foundry``, ``published:torchtitan``, ``published:nemo-24.07`` ...).
    ``framework_group`` labels the training stack for splits: the row's ``framework`` where
    stated, else :data:`SOURCE_FRAMEWORKS` of its source.

    Layout fields a source leaves unstated are the readers' to fill, and they list them in
    ``defaulted_fields`` (MLPerf: the interleaving depth from the file's stated configs,
    NeMo's ZeRO-1 with an overlapped gradient sync; see
    :mod:`perfcast.data.readers.mlperf`). Rows without a measured step time (MLPerf
    time-to-train only) are left out. A
    ``model`` name that is not a preset (NeuSight's ``bert_large``, ``gpt3_xl`` ...) moves
    to ``model_name`` when the row spells out the model fields itself. Runs of
    :data:`ENCODER_DECODER_ARCHITECTURES` are left out, with a warning that counts them.

    Raises:
        SpecError: an unknown source name.
    """
    unknown = sorted(set(sources) - set(RUN_FILES))
    if unknown:
        raise SpecError(f"unknown run sources {unknown}; allowed: {', '.join(RUN_FILES)}")
    frames = []
    for name in sources:
        records = read_source(Path(data_dir) / RUN_FILES[name]).records
        if name in TABLE_SOURCES:
            records = records.assign(source_detail=records["source"])
        else:
            records = records.rename(columns={"source": "source_detail"}).assign(source=name)
        stated = records["framework"] if "framework" in records else pd.Series(None, index=records.index)
        records = records.assign(framework_group=stated.where(stated.notna(), SOURCE_FRAMEWORKS.get(name, name)))
        records = _unname_unknown_models(records)
        records = _drop_encoder_decoders(records, name)
        frames.append(records[records["measured_step_ms"].notna() & records["timing_scope"].isin(TIMING_SCOPES)])
    return pd.concat(frames, ignore_index=True)


def _drop_encoder_decoders(records: pd.DataFrame, source: str) -> pd.DataFrame:
    """``records`` without the runs of :data:`ENCODER_DECODER_ARCHITECTURES`, counted in a warning."""
    if "architecture" not in records:
        return records
    seq2seq = records["architecture"].isin(ENCODER_DECODER_ARCHITECTURES).to_numpy()
    if seq2seq.any():
        names = ", ".join(sorted(records.loc[seq2seq, "architecture"].astype(str).unique()))
        logger.warning("left out %d %s runs of encoder-decoder models (%s): not a decoder-only stack",
                       int(seq2seq.sum()), source, names)  # fmt: skip
    return records[~seq2seq]


def _unname_unknown_models(records: pd.DataFrame) -> pd.DataFrame:
    if "model" not in records:
        return records
    names = records["model"].dropna().astype(str).unique()
    unknown = set()
    for name in names:
        try:
            TransformerSpec.load(name)
        except SpecError:
            unknown.add(name)
    spelled = records.reindex(columns=list(REQUIRED_MODEL_FIELDS)).notna().all(axis=1)
    move = records["model"].isin(unknown) & spelled
    named = (
        records["model_name"].where(records["model_name"].notna(), records["model"])
        if "model_name" in records
        else records["model"]
    )
    out = records.assign(model_name=named)
    out["model"] = out["model"].where(~move)
    return out


@dataclass(frozen=True)
class StepTable:
    """Parsed, composed and featurised measured runs.

    Attributes:
        runs: the parsed rows of the run table (index reset), with ``step_ms``,
            ``step_lo_ms``, ``step_hi_ms`` and the breakdown of the composed step added,
            plus ``group`` (model and cluster, for ranking) .
        features: run features, aligned with ``runs``.
        configs: the checked configs, aligned with ``runs``.
        steps: the composer's output per row (node times for graph models).
        errors: rows that did not parse: original index, ``source`` and ``error``.
    """

    runs: pd.DataFrame
    features: pd.DataFrame
    configs: list[RunConfig]
    steps: list[Any]
    errors: pd.DataFrame


def parse_runs(runs: pd.DataFrame) -> tuple[list[RunConfig], np.ndarray, pd.DataFrame]:
    """Checked configs of the rows that parse, their positions, and the failures with reasons."""
    configs, ok, errors = [], [], []
    for pos, row in enumerate(runs.to_dict("records")):
        try:
            configs.append(parse_run_row(row))
            ok.append(pos)
        except SpecError as exc:
            errors.append({"row": runs.index[pos], "source": row.get("source", ""), "error": str(exc)})
    failed = pd.DataFrame(errors, columns=["row", "source", "error"])
    if len(failed):
        logger.warning("%d of %d runs are not valid configs: %s", len(failed), len(runs), failed["error"].unique()[:5])
    return configs, np.asarray(ok, dtype=int), failed


def run_groups(configs: Sequence[RunConfig]) -> list[str]:
    """``model|cluster`` label per config: layers, width, sequence; gpu and GPU count."""
    return [
        f"L{c.model.num_layers}-h{c.model.hidden_size}-s{c.model.seq_len}|{c.cluster.gpu.id}x{c.cluster.num_gpus}"
        for c in configs
    ]


def build_step_table(runs: pd.DataFrame, composer: StepComposer) -> StepTable:
    """Parse, compose and featurise measured runs (see :class:`StepTable`).

    An MLPerf row's round (``mlperf_version``) becomes its software release feature, and
    the framework a row states its training-stack label
    (:data:`~perfcast.models.component_factors.STACK_COLUMN`, read by the step model's
    per-stack factors), through the features a query gets
    (:func:`~perfcast.models.step_predictor.step_features`): a row that states none has
    no stack and fits the global factors, which a query that states none gets.

    A row's ``overlap_grad_reduce`` (MLPerf's NeMo runs) hides its data-parallel sync
    behind the last backward, whatever ``composer`` is set to.
    """
    configs, ok, errors = parse_runs(runs)
    kept = runs.iloc[ok].reset_index(drop=True)
    scopes = kept["timing_scope"].tolist() if "timing_scope" in kept else None
    steps = composer.compose_many(configs, timing_scopes=scopes)
    composed = composed_frame(steps)
    kept = pd.concat([kept, composed], axis=1)
    kept["group"] = run_groups(configs)
    releases = kept["mlperf_version"].tolist() if "mlperf_version" in kept else None
    features = step_features(configs, composed, releases)
    return StepTable(runs=kept, features=features, configs=configs, steps=steps, errors=errors)


# ----------------------------------------------------------------------------- splits


def split_vtrain_small_to_large(runs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """vTrain: train on 2- and 4-GPU runs, test on 8-GPU runs."""
    vtrain = (runs["source"] == "vtrain").to_numpy()
    gpus = runs["num_gpus"].to_numpy()
    return vtrain & np.isin(gpus, [2, 4]), vtrain & (gpus == 8)


def split_mlperf_small_to_large(runs: pd.DataFrame, max_train_gpus: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """MLPerf: train on systems of at most ``max_train_gpus`` GPUs (plus all vTrain), test on larger ones."""
    mlperf = (runs["source"] == "mlperf").to_numpy()
    gpus = runs["num_gpus"].to_numpy()
    train = (mlperf & (gpus <= max_train_gpus)) | (runs["source"] == "vtrain").to_numpy()
    return train, mlperf & (gpus > max_train_gpus)


def split_mlperf_old_to_new(runs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """MLPerf: train on v3.x rounds (plus all vTrain), test on v4.x rounds."""
    mlperf = (runs["source"] == "mlperf").to_numpy()
    version = runs.get("mlperf_version", pd.Series("", index=runs.index)).fillna("").astype(str)
    old = version.str.startswith("v3").to_numpy()
    new = version.str.startswith("v4").to_numpy()
    return (mlperf & old) | (runs["source"] == "vtrain").to_numpy(), mlperf & new


# ----------------------------------------------------------------------------- metrics


def group_spearman(pred: Any, true: Any, groups: Any, *, min_rows: int = MIN_GROUP_ROWS) -> dict[str, float]:
    """Spearman correlation within each group of at least ``min_rows`` rows.

    Returns:
        ``spearman_mean`` and ``spearman_median`` over groups (rows-weighted mean as
        ``spearman_weighted``), ``spearman_groups`` (groups counted) and ``spearman_pooled``
        (all rows at once). Constant groups (undefined correlation) are skipped; NaN
        when no group counts.
    """
    frame = pd.DataFrame({"pred": np.asarray(pred, float), "true": np.asarray(true, float), "g": np.asarray(groups)})
    rhos, sizes = [], []
    for _, part in frame.groupby("g"):
        if len(part) >= min_rows:
            rho = spearman(part["pred"], part["true"])
            if np.isfinite(rho):
                rhos.append(rho)
                sizes.append(len(part))
    out = {
        "spearman_groups": float(len(rhos)),
        "spearman_mean": float(np.mean(rhos)) if rhos else float("nan"),
        "spearman_median": float(np.median(rhos)) if rhos else float("nan"),
        "spearman_weighted": float(np.average(rhos, weights=sizes)) if rhos else float("nan"),
        "spearman_pooled": spearman(frame["pred"], frame["true"]) if len(frame) >= 2 else float("nan"),
    }
    return out


def evaluate_steps(pred: Any, true: Any, groups: Any, lo: Any = None, hi: Any = None) -> dict[str, float]:
    """Step-time metrics: :func:`~perfcast.training.metrics.summarize` plus :func:`group_spearman`.

    ``lo``/``hi`` that are all equal to ``pred`` (a predictor with no interval) are ignored.
    """
    pred_a = np.asarray(pred, dtype=float)
    has_interval = lo is not None and hi is not None and not (np.allclose(lo, pred_a) and np.allclose(hi, pred_a))
    out = summarize(pred_a, true, lo, hi) if has_interval else summarize(pred_a, true)
    out.update(group_spearman(pred_a, true, groups))
    out["median_ratio_measured_over_pred"] = float(np.median(np.asarray(true, dtype=float) / pred_a))
    return out


def domain_groups(table: StepTable) -> np.ndarray:
    """``source:gpu:release`` label per row of ``table``: GPU id and, for MLPerf, the round (``mlperf_version``).

    A new GPU or a new software release is what a query from a later MLPerf round faces;
    :func:`fit_step_model` holds out each such group for the domain residuals.
    """
    runs = table.runs
    release = runs.get("mlperf_version", pd.Series("", index=runs.index)).fillna("").astype(str)
    gpus = pd.Series([c.cluster.gpu.id for c in table.configs], index=runs.index)
    return (runs["source"].astype(str) + ":" + gpus + ":" + release).to_numpy()


def fit_step_model(
    table: StepTable,
    train: np.ndarray,
    *,
    group_by: str = "num_gpus",
    balance_sources: bool = True,
    hold_out_domains: bool = True,
    **params: Any,
) -> StepTimeRegressor:
    """Fit a :class:`StepTimeRegressor` on the ``train`` rows of ``table``.

    The conformal residuals come from held-out ``(source, group_by)`` groups (by default
    the cluster size, as the model is used to extrapolate to other cluster sizes) and,
    with ``hold_out_domains``, from held-out :func:`domain_groups` (GPU type and release).
    With ``balance_sources`` each source's rows weigh the same in total, so a large table
    (vTrain's 1,440 runs) does not drown a small one (MLPerf's 48). Each row's source is its
    calibration group (read under ``interval_level="group_median"``). The model keeps an
    :class:`~perfcast.models.physics_bounds.MFUCeiling` fitted on the same rows (the step
    predictor's physics floor).
    """
    runs = table.runs[train]
    groups = runs["source"].astype(str) + ":" + runs[group_by].astype(str)
    weights = None
    if balance_sources:
        counts = runs["source"].map(runs["source"].value_counts()).to_numpy(dtype=float)
        weights = len(runs) / (counts * runs["source"].nunique())
    domains = domain_groups(table)[train] if hold_out_domains else None
    idx = np.flatnonzero(train)
    scopes = runs["timing_scope"].astype(str).tolist() if "timing_scope" in runs else None
    ceiling = MFUCeiling().fit([table.configs[i] for i in idx], runs["measured_step_ms"].to_numpy(), scopes)
    model = StepTimeRegressor(**params)
    return model.fit(
        table.features[train],
        runs["measured_step_ms"].to_numpy(),
        groups=groups.to_numpy(),
        domain_groups=domains,
        sample_weight=weights,
        mfu_ceiling=ceiling,
        calibration_groups=runs["source"].astype(str).to_numpy(),
    )


# ----------------------------------------------------------------------------- training

MODEL_TYPES = ("gbdt", "gnn")
SPLITS: Mapping[str, Any] = {
    "vtrain_small_to_large": split_vtrain_small_to_large,
    "mlperf_small_to_large": split_mlperf_small_to_large,
    "mlperf_old_to_new": split_mlperf_old_to_new,
}
"""The held-out splits every trained step model is evaluated on (train mask, test mask)."""


def fit_step_estimator(table: StepTable, train: np.ndarray, model_type: str, **params: Any) -> Any:
    """Fit a step model of ``model_type`` (``gbdt`` or ``gnn``) on the ``train`` rows of ``table``.

    Raises:
        SpecError: an unknown model type.
    """
    if model_type == "gbdt":
        return fit_step_model(table, train, **params)
    if model_type == "gnn":
        require("torch", "torch_geometric", purpose="training a GNN step model")
        from perfcast.models.gnn import StepGNNRegressor, step_graphs

        rows = np.flatnonzero(train)
        graphs = step_graphs([table.configs[i] for i in rows], [table.steps[i] for i in rows])
        return StepGNNRegressor(**params).fit(graphs, table.runs["measured_step_ms"].to_numpy()[rows])
    raise SpecError(f"model_type={model_type!r} unknown; allowed: {', '.join(MODEL_TYPES)}")


def predict_rows(
    model: Any, table: StepTable, rows: np.ndarray, coverage: float = 0.9, *, bound: bool = True
) -> tuple[np.ndarray, ...]:
    """``(pred, lo, hi)`` in ms of a fitted step model on the ``rows`` (boolean mask) of ``table``.

    With ``bound``, raised to the model's MFU-ceiling floor as the step predictor does
    (:mod:`perfcast.models.physics_bounds`; MFU 1 for a model without a ceiling), each row's
    model FLOPs counted for its ``timing_scope``.
    """
    from perfcast.models.step_predictor import step_model_inputs

    idx = np.flatnonzero(rows)
    configs = [table.configs[i] for i in idx]
    X = step_model_inputs(model, configs, [table.steps[i] for i in idx])
    interval = np.asarray(model.predict_interval(X, coverage=coverage), dtype=float)
    pred, lo, hi = np.asarray(model.predict(X), dtype=float), interval[:, 0], interval[:, 1]
    if bound:
        scopes = (
            table.runs["timing_scope"].astype(str).to_numpy()[idx].tolist() if "timing_scope" in table.runs else None
        )
        ceiling = getattr(model, "mfu_ceiling_", None) or MFUCeiling()
        pred, lo, hi, _ = apply_floor(pred, lo, hi, ceiling.floor_ms(configs, scopes))
    return pred, lo, hi


def evaluate_splits(table: StepTable, model_type: str, *, progress: Any = None, **params: Any) -> pd.DataFrame:
    """Composed and learned step metrics on every split of :data:`SPLITS` with rows on both sides.

    Returns:
        One row per (split, predictor): ``n_train, n_test`` and the metrics of
        :func:`evaluate_steps`; ``attrs["predictions"]`` holds every held-out run's
        ``split``, ``source``, ``gpu``, ``measured_ms`` and learned ``step_ms``,
        ``step_lo_ms``, ``step_hi_ms``.
    """
    runs = table.runs
    rows, held_out = [], []
    for name, split in SPLITS.items():
        train, test = split(runs)
        if not train.any() or not test.any():
            continue
        if progress is not None:
            progress(f"split {name}: fit {model_type} on {int(train.sum())} runs, test on {int(test.sum())}")
        true = runs["measured_step_ms"].to_numpy()[test]
        groups = runs["group"].to_numpy()[test]
        composed = evaluate_steps(
            runs["step_ms"].to_numpy()[test], true, groups, runs["step_lo_ms"].to_numpy()[test],
            runs["step_hi_ms"].to_numpy()[test],
        )  # fmt: skip
        model = fit_step_estimator(table, train, model_type, **params)
        pred, lo, hi = predict_rows(model, table, test)
        learned = evaluate_steps(pred, true, groups, lo, hi)
        held_out.append(pd.DataFrame({
            "split": name, "source": runs["source"].to_numpy()[test], "gpu": runs["gpu"].to_numpy()[test],
            "measured_ms": true, "step_ms": pred, "step_lo_ms": lo, "step_hi_ms": hi,
        }))  # fmt: skip
        for predictor, metrics in (("composed", composed), (model_type, learned)):
            rows.append({"split": name, "predictor": predictor, "n_train": int(train.sum()),
                         "n_test": int(test.sum()), **metrics})  # fmt: skip
    result = pd.DataFrame(rows)
    result.attrs["predictions"] = pd.concat(held_out, ignore_index=True) if held_out else pd.DataFrame()
    return result


@dataclass
class TrainStepsResult:
    """What a step-training run produced."""

    bundle_path: Path
    n_runs: int
    n_invalid: int
    fit_seconds: float
    evaluation: pd.DataFrame | None = None


def train_step_predictor(
    runs: pd.DataFrame,
    op_bundle: Any,
    *,
    output: str | Path,
    model_type: str = "gbdt",
    evaluate: bool = True,
    params: Mapping[str, Any] | None = None,
    progress: Any = None,
) -> TrainStepsResult:
    """Compose measured runs with ``op_bundle``, evaluate on :data:`SPLITS`, fit on all runs, save.

    A GBDT's ``correction_scale`` defaults to
    :data:`~perfcast.training.defaults.DEFAULT_CORRECTION_SCALE`, as in ``perfcast train steps``.
    The saved bundle holds ``op_bundle``'s op and collective models and the step model,
    so its steps are composed exactly as in training. Every step is logged to the active
    MLflow run, if there is one.

    Raises:
        SpecError: an unknown model type, or no valid measured run.
    """
    import time

    from perfcast.models.bundle import save_bundle
    from perfcast.training import tracking

    if model_type not in MODEL_TYPES:
        raise SpecError(f"model_type={model_type!r} unknown; allowed: {', '.join(MODEL_TYPES)}")
    params = dict(params or {})
    if model_type == "gbdt":
        params.setdefault("correction_scale", DEFAULT_CORRECTION_SCALE)
    say = progress or (lambda msg: None)
    composer = StepComposer(op_bundle, getattr(op_bundle, "collective_model", None))
    say(f"composing {len(runs)} measured runs with {getattr(op_bundle, 'name', 'the op predictor')}")
    table = build_step_table(runs, composer)
    if not len(table.runs):
        raise SpecError(f"none of the {len(runs)} runs is a valid config; first errors: {table.errors.head(3)}")
    evaluation = evaluate_splits(table, model_type, progress=say, **params) if evaluate else None
    say(f"fitting the {model_type} step model on all {len(table.runs)} runs")
    start = time.perf_counter()
    model = fit_step_estimator(table, np.ones(len(table.runs), dtype=bool), model_type, **params)
    fit_seconds = time.perf_counter() - start
    factors = model.factors_.to_dict() if hasattr(model, "factors_") else {}
    by_stack = factors.pop("by_stack", {})
    factors.update({f"{name}:{stack}": v for stack, per in by_stack.items() for name, v in per.items()})
    if factors:
        say("physical factors of the composed step: " + ", ".join(f"{k} x{v:.2f}" for k, v in factors.items()))
    metrics = _split_metrics(evaluation) if evaluation is not None else {}
    path = save_bundle(
        output,
        op_model=getattr(op_bundle, "op_model", None),
        collective_model=getattr(op_bundle, "collective_model", None),
        step_model=model,
        metrics={**dict(getattr(op_bundle, "metrics", {}) or {}), **metrics},
        datasets=dict(getattr(op_bundle, "manifest", {}).get("datasets", {})),
    )
    if tracking.active():
        sources = table.runs["source"].value_counts().to_dict()
        tracking.log_params({"model_type": model_type, "n_runs": len(table.runs), "n_invalid": len(table.errors),
                             **{f"runs.{k}": v for k, v in sources.items()}, **params,
                             **{f"factor.{k}": v for k, v in factors.items()}})  # fmt: skip
        tracking.log_metrics({**metrics, "fit_seconds": fit_seconds})
        tracking.log_training_data(table.runs, name="run-records")
        if evaluation is not None:
            tracking.log_table(evaluation, "evaluation/steps.csv")
            held_out = evaluation.attrs.get("predictions")
            if held_out is not None and not held_out.empty:
                from perfcast.training.plots import measured_parity_plot

                parity = measured_parity_plot(held_out, "step_ms", "step_lo_ms", "step_hi_ms", "split",
                                              f"held-out steps: {model_type}")  # fmt: skip
                tracking.log_figures({"step_parity": parity})
        tracking.log_bundle_dir(path)
    return TrainStepsResult(path, len(table.runs), len(table.errors), fit_seconds, evaluation)


def _split_metrics(evaluation: pd.DataFrame) -> dict[str, float]:
    """``<split>/<predictor>/<metric>`` for the headline metrics of an evaluation table."""
    keys = ("mape", "median_ape", "p90_ape", "coverage", "rel_width", "spearman_mean")
    out = {}
    for row in evaluation.to_dict("records"):
        for key in keys:
            value = row.get(key)
            if value is not None and np.isfinite(value):
                out[f"{row['split']}/{row['predictor']}/{key}"] = float(value)
    return out
