"""Few-shot step calibration: error against k measured runs of a held-out cluster.

The use case: a user measures one to five training steps on their own cluster (a GPU
type and size nobody trained on), ``perfcast calibrate steps`` fits a per-cluster
correction (:mod:`perfcast.models.step_calibration`), and later configs on that cluster
are predicted with it. Here a held-out cluster is a (source, GPU, GPU count) group of the
test side of each small-to-large split (vTrain: the 8-GPU A100 runs; MLPerf: each system
of more than 1,024 GPUs). For each cluster and seed, ``k`` runs are drawn at random, the
correction is fitted on them, and the other runs of the cluster are scored. Predictors:
the composed step (default op bundle) and the step GBDT trained on the split's training
side. Reported: median over clusters of the mean over seeds of MAPE and of interval
coverage.

Leave one source out (issue 14, item 5): for every measured source (vTrain, NeuSight, MLPerf
and each published table), the step GBDT as shipped (``correction_scale`` as shipped, raised to the
MFU-ceiling floor) is fitted on the other sources; ``k`` runs of the held-out source (k = 0, 1,
3, 5, drawn at random, 20 seeds) fit one correction, and the source's other runs are scored.
Two corrections: ``shift`` (the robust shift alone) and ``factors`` (what ``perfcast calibrate
steps`` fits from the predictor's breakdown: a factor per component of the step, the shares
those of the composed breakdown, times the step model's physical factors for the GBDT, as
the step predictor reports them). Two poolings:
per source (its GPUs and cluster sizes under one correction, as a user calibrating a whole
software stack would) and per (source, GPU) cluster, as ``calibrate steps`` keys a correction,
for clusters with at least 8 runs. Reported per source (clusters: mean over its clusters)
and k: mean over seeds of MAPE and of coverage; where the screening refuses every shot
(measured/predicted beyond the calibration's bound) the prediction stays uncalibrated. A corrected
run is raised to its model FLOPs at the predictor's MFU ceiling, or at the best MFU of the k runs
where that is higher, as ``perfcast calibrate steps`` applies a correction.

The floor of any calibration that rescales the composed step's parts: per source and per
(source, GPU) cluster of at least 8 runs, the non-negative factor per breakdown part (every
part of :data:`~perfcast.models.component_factors.COMPONENT_PARTS`) that minimises the MAPE
of *all* its runs at once (a linear program, in sample), beside the one factor that does.
No correction that rescales those parts, fitted on any number of the runs, beats this floor
on the same runs. The same two floors for the shipped model as held out (the leave-one-source-out
GBDT's predictions, and their breakdown as ``calibrate steps`` reads it: the composed shares times
the model's physical factors, rescaled to its prediction): what a perfect few-shot correction of
that model could reach.

Writes ``benchmarks/results/step_calibration_eval.json`` and ``.md``.

Usage: .venv/bin/python benchmarks/step_calibration_eval.py [--data DIR] [--seeds 20]
"""

from __future__ import annotations

import argparse
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.errors import SpecError
from perfcast.models.bundle import load_bundle
from perfcast.models.component_factors import COMPONENT_PARTS
from perfcast.models.composer import StepComposer
from perfcast.models.physics_bounds import MFUCeiling, apply_floor, model_flops, peak_flops
from perfcast.models.step_calibration import fit_step_correction
from perfcast.training.defaults import DEFAULT_CORRECTION_SCALE
from perfcast.training.metrics import interval_coverage, mape
from perfcast.training.train_steps import (
    StepTable,
    build_step_table,
    fit_step_model,
    load_runs,
    predict_rows,
    split_mlperf_small_to_large,
    split_vtrain_small_to_large,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
DEFAULT_BUNDLE = ROOT / "src" / "perfcast" / "models" / "default_bundle"
OUT = ROOT / "benchmarks" / "results"
KS = (0, 1, 2, 3, 5)
LOSO_KS = (0, 1, 3, 5)
LOSO_SCALE = DEFAULT_CORRECTION_SCALE
"""The shipped step model's ``correction_scale``."""
SPLITS = {"vtrain_small_to_large": split_vtrain_small_to_large, "mlperf_small_to_large": split_mlperf_small_to_large}


def few_shot(
    pred: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    true: np.ndarray,
    k: int,
    seeds: int,
    breakdown: pd.DataFrame | None = None,
    *,
    at_peak: np.ndarray,
    ceiling: np.ndarray,
) -> dict:
    """Mean over seeds of MAPE and coverage on the runs not used to calibrate (with
    ``breakdown``, the prediction rows' breakdown columns: component factors fitted too).

    As ``perfcast calibrate steps`` stores them, a correction keeps its shots' best MFU and a
    corrected run is raised to its model FLOPs at the higher of the predictor's MFU ``ceiling``
    and that MFU (``at_peak``: each run's model FLOPs at the dense peak, ms).
    """
    if k >= len(true):
        return {"mape": float("nan"), "coverage": float("nan")}
    errors, covered = [], []
    for seed in range(seeds if k else 1):
        rng = np.random.default_rng(seed)
        shots = rng.choice(len(true), size=k, replace=False) if k else np.array([], dtype=int)
        rest = np.setdiff1d(np.arange(len(true)), shots)
        p, lo_, hi_ = pred[rest], lo[rest], hi[rest]
        try:
            if k:
                shot_rows = None if breakdown is None else breakdown.iloc[shots]
                correction = fit_step_correction("c", true[shots], pred[shots], breakdown=shot_rows,
                                                 mfu=at_peak[shots] / true[shots])  # fmt: skip
                factor = correction.row_factors(breakdown.iloc[rest]) if breakdown is not None else (
                    np.full(len(rest), correction.factor)
                )  # fmt: skip
                reach = np.fmax(ceiling[rest], np.nan if correction.best_mfu is None else correction.best_mfu)
                p, lo_, hi_, _ = apply_floor(p * factor, lo_ * factor, hi_ * factor, at_peak[rest] / reach)
        except SpecError:  # every shot screened out: the user keeps the uncalibrated prediction
            pass
        errors.append(mape(p, true[rest]))
        covered.append(interval_coverage(lo_, hi_, true[rest]))
    return {"mape": float(np.mean(errors)), "coverage": float(np.mean(covered))}


def _ceilings(model: object, configs: list) -> dict[str, np.ndarray]:
    """Per predictor (``composed``, ``gbdt``), each config's MFU ceiling: 100% of the dense peak for the
    composed step, the fitted step model's (as its predictions are bounded) for the GBDT."""
    fitted = getattr(model, "mfu_ceiling_", None) or MFUCeiling()
    return {"composed": MFUCeiling().ceiling(configs), "gbdt": fitted.ceiling(configs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warnings.simplefilter("ignore")
    bundle = load_bundle(DEFAULT_BUNDLE)
    table = build_step_table(load_runs(args.data), StepComposer(bundle, bundle.collective_model))
    runs = table.runs
    at_peak = model_flops(table.configs, runs["timing_scope"].tolist()) / peak_flops(table.configs) * 1e3
    cluster = runs["source"] + ":" + runs["gpu"].astype(str) + "x" + runs["num_gpus"].astype(str)
    rows = []
    for split, fn in SPLITS.items():
        train, test = fn(runs)
        model = fit_step_model(table, train)
        learned = predict_rows(model, table, test)
        composed = tuple(runs[c].to_numpy()[test] for c in ("step_ms", "step_lo_ms", "step_hi_ms"))
        true = runs["measured_step_ms"].to_numpy()[test]
        peak, configs = at_peak[test], [c for c, t in zip(table.configs, test, strict=True) if t]
        ceilings = _ceilings(model, configs)
        for name in sorted(set(cluster[test])):
            members = (cluster[test] == name).to_numpy()
            for predictor, (pred, lo, hi) in (("composed", composed), ("gbdt", learned)):
                for k in KS:
                    score = few_shot(pred[members], lo[members], hi[members], true[members], k, args.seeds,
                                     at_peak=peak[members], ceiling=ceilings[predictor][members])  # fmt: skip
                    rows.append({"split": split, "cluster": name, "n_runs": int(members.sum()),
                                 "predictor": predictor, "k": k, **score})  # fmt: skip
    frame = pd.DataFrame(rows)
    summary = frame.groupby(["split", "predictor", "k"])[["mape", "coverage"]].median().reset_index()
    loso, held_out = loso_rows(table, args.seeds, at_peak)
    floor = factor_floor(table, held_out)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "step_calibration_eval.json").write_text(
        json.dumps({"per_cluster": rows, "summary": summary.to_dict("records"), "loso": loso,
                    "floor": floor.to_dict("records")}, indent=1) + "\n"
    )
    text = to_markdown(summary, frame) + loso_markdown(pd.DataFrame(loso)) + floor_markdown(floor)
    (OUT / "step_calibration_eval.md").write_text(text)
    print(text)


MIN_CLUSTER_RUNS = 8
"""Smallest (source, GPU) cluster scored under per-cluster pooling."""


def loso_rows(table: StepTable, seeds: int, at_peak: np.ndarray) -> tuple[list[dict], np.ndarray]:
    """Per held-out source, predictor, correction, pooling and k: few-shot MAPE and coverage
    on the source's other runs (per cluster: averaged over the source's clusters); and the
    held-out model's breakdown of every run, ``(runs, parts)`` in ms (:data:`BREAKDOWN_PARTS`
    present in the runs), summing to its prediction. ``at_peak``: each run's model FLOPs at
    the dense peak, ms (:func:`few_shot`)."""
    runs = table.runs
    composed_all = tuple(runs[c].to_numpy() for c in ("step_ms", "step_lo_ms", "step_hi_ms"))
    true_all = runs["measured_step_ms"].to_numpy()
    gpu = runs["gpu"].astype(str).to_numpy()
    rows = []
    present = [f"{p}_ms" for p in BREAKDOWN_PARTS if f"{p}_ms" in runs]
    held_out = np.zeros((len(runs), len(present)))
    for source in runs["source"].value_counts().index:
        test = (runs["source"] == source).to_numpy()
        model = fit_step_model(table, ~test, correction_scale=LOSO_SCALE)
        learned = predict_rows(model, table, test)
        composed = tuple(v[test] for v in composed_all)
        composed_parts = runs.loc[test].reset_index(drop=True)
        # the learned predictor's breakdown: parts times its factors, as it applies them to each run
        learned_parts = model.scale_breakdown(composed_parts, table.features[test])
        shares = learned_parts[present].fillna(0.0).to_numpy(dtype=float)
        held_out[test] = shares / shares.sum(axis=1, keepdims=True) * learned[0][:, None]
        configs = [c for c, t in zip(table.configs, test, strict=True) if t]
        ceilings = _ceilings(model, configs)
        pools = {"source": [np.ones(int(test.sum()), dtype=bool)]}
        pools["cluster"] = [m for g in sorted(set(gpu[test])) if (m := gpu[test] == g).sum() >= MIN_CLUSTER_RUNS]
        for predictor, (pred, lo, hi), breakdown, ceiling in (
            ("composed", composed, composed_parts, ceilings["composed"]),
            (f"gbdt(scale={LOSO_SCALE:g})+bound", learned, learned_parts, ceilings["gbdt"]),
        ):
            for correction, parts in (("shift", None), ("factors", breakdown)):
                for pooling, members in pools.items():
                    for k in LOSO_KS if members else ():
                        scores = [few_shot(pred[m], lo[m], hi[m], true_all[test][m], k, seeds,
                                           None if parts is None else parts.loc[m].reset_index(drop=True),
                                           at_peak=at_peak[test][m], ceiling=ceiling[m])
                                  for m in members]  # fmt: skip
                        rows.append({"source": source, "n_runs": int(test.sum()), "predictor": predictor,
                                     "correction": correction, "pooling": pooling, "clusters": len(members), "k": k,
                                     "mape": float(np.nanmean([s["mape"] for s in scores])),
                                     "coverage": float(np.nanmean([s["coverage"] for s in scores]))})  # fmt: skip
    return rows, held_out


def loso_markdown(frame: pd.DataFrame) -> str:
    """MAPE % (coverage) per held-out source, predictor, correction and k; one table per pooling."""
    lines = []
    for pooling, title in (("source", "one correction per source (all its GPUs and sizes)"),
                           ("cluster", f"one correction per (source, GPU) cluster of >= {MIN_CLUSTER_RUNS} runs, "
                                       "averaged over the source's clusters")):  # fmt: skip
        part_frame = frame[frame["pooling"] == pooling]
        lines += [
            "",
            f"## Leave one source out, {title}: k runs calibrate, the other runs are scored",
            "",
            f"GBDT as shipped (`correction_scale={LOSO_SCALE}`, MFU-ceiling floor) fitted without the source. "
            "Cells: mean over 20 draws of MAPE % (coverage of the 90% interval).",
            "",
            "| source | runs | clusters | predictor | correction | " + " | ".join(f"k={k}" for k in LOSO_KS) + " |",
            "|---|---:|---:|---|---|" + "---:|" * len(LOSO_KS),
        ]
        keys = ["source", "predictor", "correction"]
        for (source, predictor, correction), part in part_frame.groupby(keys, sort=False):
            cells = [f"{r.mape:.1f} ({100 * r.coverage:.0f}%)" for r in part.sort_values("k").itertuples()]
            lines.append(f"| {source} | {part['n_runs'].iloc[0]} | {part['clusters'].iloc[0]} | {predictor} | "
                         f"{correction} | " + " | ".join(cells) + " |")  # fmt: skip
        means = part_frame.groupby(["predictor", "correction", "k"])["mape"].mean().unstack("k")
        for (predictor, correction), row in means.iterrows():
            lines.append(f"| mean over sources | | | {predictor} | {correction} | "
                         + " | ".join(f"{v:.1f}" for v in row) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


BREAKDOWN_PARTS: tuple[str, ...] = tuple(p for parts in COMPONENT_PARTS.values() for p in parts)
"""The composed breakdown parts (columns ``<part>_ms``) the floor fits a factor for: every part of
every component of the step (:data:`~perfcast.models.component_factors.COMPONENT_PARTS`)."""


def min_mape_factors(parts: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Non-negative factors ``f`` minimising the mean of ``|parts @ f / true - 1|`` (a linear program)."""
    from scipy.optimize import linprog
    from scipy.sparse import eye, hstack, vstack

    scaled = parts / true[:, None]
    n, p = scaled.shape
    slack = eye(n, format="csr")
    bounds_ub = vstack([hstack([scaled, -slack]), hstack([-scaled, -slack])])  # |scaled @ f - 1| <= u
    cost = np.concatenate([np.zeros(p), np.full(n, 1.0 / n)])
    result = linprog(cost, A_ub=bounds_ub, b_ub=np.concatenate([np.ones(n), -np.ones(n)]), bounds=(0, None),
                     method="highs")  # fmt: skip
    if not result.success:
        raise RuntimeError(f"minimum-MAPE fit failed: {result.message}")
    return result.x[:p]


def factor_floor(table: StepTable, held_out: np.ndarray) -> pd.DataFrame:
    """Per source and (source, GPU) cluster of >= MIN_CLUSTER_RUNS runs: in-sample MAPE of the composed step,
    of the one factor and of the non-negative per-part factors that minimise it, and the same two for the
    held-out model's breakdown ``held_out`` (:func:`loso_rows`; module docstring)."""
    runs = table.runs
    present = [p for p in BREAKDOWN_PARTS if f"{p}_ms" in runs]
    parts = np.column_stack([runs[f"{p}_ms"].fillna(0.0).to_numpy(dtype=float) for p in present])
    true = runs["measured_step_ms"].to_numpy(dtype=float)
    composed = runs["step_ms"].to_numpy(dtype=float)
    if not np.allclose(parts.sum(axis=1), composed, rtol=1e-6):
        raise ValueError(f"the breakdown parts {present} do not add up to step_ms")
    source, gpu = runs["source"].astype(str).to_numpy(), runs["gpu"].astype(str).to_numpy()
    groups = {("source", s): source == s for s in runs["source"].value_counts().index}
    for s, g in sorted(set(zip(source, gpu, strict=True))):
        if ((source == s) & (gpu == g)).sum() >= MIN_CLUSTER_RUNS:
            groups[("cluster", f"{s} / {g}")] = (source == s) & (gpu == g)
    rows = []
    for (pooling, name), mask in groups.items():
        one = min_mape_factors(composed[mask, None], true[mask])
        factors = min_mape_factors(parts[mask], true[mask])
        model = held_out[mask].sum(axis=1)
        model_one = min_mape_factors(model[:, None], true[mask])
        model_factors = min_mape_factors(held_out[mask], true[mask])
        rows.append({"pooling": pooling, "group": name, "n_runs": int(mask.sum()),
                     "composed": mape(composed[mask], true[mask]),
                     "one_factor": mape(one[0] * composed[mask], true[mask]),
                     "part_factors": mape(parts[mask] @ factors, true[mask]),
                     "model": mape(model, true[mask]),
                     "model_one_factor": mape(model_one[0] * model, true[mask]),
                     "model_part_factors": mape(held_out[mask] @ model_factors, true[mask]),
                     **{f"factor_{p}": float(f) for p, f in zip(present, factors, strict=True)}})  # fmt: skip
    return pd.DataFrame(rows)


def floor_markdown(floor: pd.DataFrame) -> str:
    """The factor floor as a Markdown table (MAPE %, in sample)."""
    lines = [
        "",
        "## Floor of part-rescaling calibration (factors fitted on all of a group's runs, in sample)",
        "",
        "MAPE % of the composed step; of the one factor, and of the non-negative factor per breakdown part, "
        "that minimise the group's MAPE with every run of the group known: no calibration that rescales the "
        "composed step's parts does better on these runs, from any number of them. The last three columns: "
        "the same for the shipped model held out (leave one source out) and its breakdown.",
        "",
        "| pooling | group | runs | composed | one factor | per-part factors | model held out | one factor "
        "| per-part factors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in floor.itertuples():
        lines.append(f"| {r.pooling} | {r.group} | {r.n_runs} | {r.composed:.1f} | {r.one_factor:.1f} | "
                     f"{r.part_factors:.1f} | {r.model:.1f} | {r.model_one_factor:.1f} | "
                     f"{r.model_part_factors:.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def to_markdown(summary: pd.DataFrame, frame: pd.DataFrame) -> str:
    """Median MAPE (and coverage) over held-out clusters against k."""
    lines = [
        "# Few-shot step calibration on held-out clusters",
        "",
        "Command: `.venv/bin/python benchmarks/step_calibration_eval.py`. A cluster is a (source, GPU, GPU count) "
        "group on the test side of a small-to-large split; k runs of it calibrate, the others are scored "
        "(mean over 20 random draws). Cells: median over clusters of MAPE % (coverage of the 90% interval).",
        "",
        "| split | clusters | predictor | " + " | ".join(f"k={k}" for k in KS) + " |",
        "|---|---:|---|" + "---:|" * len(KS),
    ]
    for (split, predictor), part in summary.groupby(["split", "predictor"], sort=False):
        n = frame[(frame["split"] == split) & (frame["predictor"] == predictor)]["cluster"].nunique()
        cells = []
        for k in KS:
            row = part[part["k"] == k]
            if row.empty or not np.isfinite(row["mape"].iloc[0]):
                cells.append("-")
            else:
                cells.append(f"{row['mape'].iloc[0]:.1f} ({100 * row['coverage'].iloc[0]:.0f}%)")
        lines.append(f"| {split} | {n} | {predictor} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
