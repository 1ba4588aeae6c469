"""Step predictions on runs unlike the training runs: leave-one-source/generation/framework-out, scale-out.

Issue 14. A user compares perfcast with "assume 40% MFU" on configs perfcast never saw.
Every measured step source of ``--data`` (default ``../shared/data``, read by
:func:`~perfcast.training.train_steps.load_runs`): vTrain Megatron iterations, NeuSight
end-to-end latencies, MLPerf GPT-3 steps and each table of the published steps
(``published:llm-foundry``, ``published:torchtitan``, ``published:nemo-24.07``,
``published:nemo-automodel``, ``published:nemo-24.03-long-seq``). Rows perfcast cannot parse
are counted per source and left out.

Every run is composed once with the op bundle (``--op-model``, default the shipped bundle);
each split then fits only the step GBDT (:func:`~perfcast.training.train_steps.fit_step_model`,
sources weighted equally, interval calibrated on held-out cluster sizes and domains) on its
training rows. Test rows are queried as a user would: no software release stated.

Splits (train -> test; each test group scored on its own):

* ``loso``: leave one source out, for every source;
* ``generation``: train without Hopper and Blackwell, test Hopper; train without
  Blackwell, test Blackwell (only if a Blackwell row parses);
* ``framework``: leave one ``framework_group`` out (the row's stated framework, else its
  source's stack: vTrain megatron-deepspeed, MLPerf megatron-core, NeuSight pytorch-eager);
* ``scale``: train on runs of at most 64 GPUs, test on larger ones (grouped by source).

Predictors:

* ``gbdt``: the step GBDT as shipped (composed step times its physical factors,
  :mod:`perfcast.models.component_factors`, times its learned correction);
* ``factors``: the composed step times the physical factors alone (``correction_scale=0``);
* ``gbdt+bound``: the same, median and interval raised to the MFU-ceiling floor
  (:mod:`perfcast.models.physics_bounds`; ceiling = best measured MFU of the split's training
  runs per GPU generation and dtype, +10%);
* ``gbdt(scale=S)+bound``: the shipped model, fitted with ``correction_scale=S``
  (:data:`~perfcast.training.defaults.DEFAULT_CORRECTION_SCALE`, the share of the log
  correction that leave-one-source-out picks among 0, 0.25, 0.5, 0.75, 1), bounded;
* ``composed``: the composed step alone (op predictions through the schedule; its interval
  from the op intervals);
* ``mfu_fit``: a constant MFU fitted on the training rows, the median of their measured MFU
  with each source weighed equally (as a user who reads several published tables would),
  ``step = F / (mfu * N * peak)``; interval from the 5th and 95th percentiles of the training
  MFU, weighed the same way;
* ``mfu_40``: the user's rule of thumb, MFU = 0.40, no interval.

MFU and model FLOPs ``F`` are perfcast's (:func:`perfcast.models.analytic.model_flops_per_step`:
6 FLOPs per parameter and token plus causal attention, no recomputation, LoRA without frozen
weight gradients; a third of it for forward-only times), ``peak`` the GPU's dense peak at the
run's dtype, ``N`` the GPU count.

Metrics per (split, test group, predictor): n, MAPE, median APE, p90 APE (percent), coverage
of the 90% interval and its mean relative width ``(hi - lo) / pred``. The worst
(split, test group, source, GPU) cells by GBDT MAPE are listed, and the leave-one-source-out
runs are broken down by workload trait and GPU generation (:func:`trait_table`): where the
model still transfers badly.

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/step_transfer_eval.py
[--data DIR] [--op-model BUNDLE] [--out PREFIX] [--before EARLIER.json]
Writes ``benchmarks/results/step_transfer_eval.md`` and ``.json``, and
``step_transfer_eval_loso_runs.csv``: every run with its held-out (leave-one-source-out)
prediction by the shipped step model, the composed step and the constant MFU, in ms.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast.models.composer import StepComposer
from perfcast.models.physics_bounds import apply_floor, gpu_generation, model_flops, peak_flops
from perfcast.serve.predictors import load_op_predictor
from perfcast.training.defaults import DEFAULT_CORRECTION_SCALE
from perfcast.training.metrics import summarize
from perfcast.training.train_steps import StepTable, build_step_table, fit_step_model, load_runs, predict_rows

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "results" / "step_transfer_eval"
MAX_TRAIN_GPUS = 64
RULE_OF_THUMB_MFU = 0.40
"""The constant MFU users assume (issue 14), not a measured figure."""
COVERAGE = 0.9
SHRINK_GRID = (0.0, 0.25, 0.5, 0.75)
"""Scales of the learned log correction tried (1 = as fitted, 0 = the composed step)."""
METRIC_KEYS = ("n", "mape", "median_ape", "p90_ape", "coverage", "rel_width")

Split = tuple[str, np.ndarray, dict[str, np.ndarray]]
"""(split name, training mask, {test group: test mask})."""


def splits(table: StepTable) -> Iterator[Split]:
    """The splits of the module docstring over ``table``'s rows."""
    runs = table.runs
    source = runs["source"].to_numpy()
    for name in sorted(set(source)):
        yield "loso", source != name, {name: source == name}
    gen = np.array([gpu_generation(c.cluster.gpu) for c in table.configs])
    yield "generation", ~np.isin(gen, ["hopper", "blackwell"]), {"hopper": gen == "hopper"}
    if (gen == "blackwell").any():
        yield "generation", gen != "blackwell", {"blackwell": gen == "blackwell"}
    framework = runs["framework_group"].astype(str).to_numpy()
    for name in sorted(set(framework)):
        yield "framework", framework != name, {name: framework == name}
    gpus = runs["num_gpus"].to_numpy()
    small = gpus <= MAX_TRAIN_GPUS
    yield "scale", small, {f">{MAX_TRAIN_GPUS} GPUs: {s}": ~small & (source == s) for s in sorted(set(source[~small]))}


def _weighted_quantiles(values: np.ndarray, groups: np.ndarray, levels: tuple[float, ...]) -> np.ndarray:
    """Quantiles of ``values`` with each group's rows weighing 1 in all (the inverted weighted CDF)."""
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    order = np.argsort(values, kind="stable")
    cdf = np.cumsum((1.0 / counts[inverse])[order])
    return values[order][np.searchsorted(cdf, np.asarray(levels) * cdf[-1]).clip(0, len(values) - 1)]


def _take(values: np.ndarray | None, mask: np.ndarray) -> np.ndarray | None:
    return None if values is None else values[mask]


def _metrics(pred: np.ndarray, true: np.ndarray, lo: np.ndarray | None, hi: np.ndarray | None) -> dict[str, float]:
    has = lo is not None and hi is not None and np.isfinite(lo).all() and np.isfinite(hi).all()
    out = summarize(pred, true, lo, hi) if has else summarize(pred, true)
    return {k: out.get(k, float("nan")) for k in METRIC_KEYS}


def predictors(
    table: StepTable, flops: np.ndarray, peak: np.ndarray, scopes: list[str], variants: dict[str, dict[str, Any]]
) -> dict[str, Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]]:
    """Predictor name -> ``fit_predict(train, test) -> (pred, lo, hi)`` in ms on the test rows."""
    runs = table.runs
    measured = runs["measured_step_ms"].to_numpy(dtype=float)
    mfu = flops / (measured / 1e3 * peak)

    def composed(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(runs[c].to_numpy(dtype=float)[test] for c in ("step_ms", "step_lo_ms", "step_hi_ms"))  # type: ignore[return-value]

    source = runs["source"].to_numpy()

    def mfu_fit(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m, q05, q95 = _weighted_quantiles(mfu[train], source[train], (0.5, 0.05, 0.95))
        base = flops[test] / peak[test] * 1e3
        return base / m, base / q95, base / q05

    def mfu_40(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, None, None]:
        return flops[test] / peak[test] * 1e3 / RULE_OF_THUMB_MFU, None, None

    def gbdt(params: dict[str, Any], bound: bool, scale: float = 1.0) -> Callable[..., Any]:
        def fit_predict(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            key = (id(params), train.tobytes())
            if key not in fitted:  # the variants of one split share one fit
                fitted.clear()
                fitted[key] = fit_step_model(table, train, **params)
            pred, lo, hi = predict_rows(fitted[key], table, test, coverage=COVERAGE, bound=False)
            if scale != 1.0:  # the correction exp(f) shrunk to exp(scale * f); interval kept relative to it
                composed_ms = runs["step_ms"].to_numpy(dtype=float)[test]
                shrunk = composed_ms * (pred / composed_ms) ** scale
                pred, lo, hi = shrunk, lo * shrunk / pred, hi * shrunk / pred
            if bound:
                idx = np.flatnonzero(test)
                floor = fitted[key].mfu_ceiling_.floor_ms([table.configs[i] for i in idx], [scopes[i] for i in idx])
                pred, lo, hi, _ = apply_floor(pred, lo, hi, floor)
            return pred, lo, hi

        return fit_predict

    fitted: dict[Any, Any] = {}
    out: dict[str, Any] = {}
    for name, params in variants.items():
        out[name] = gbdt(params, bound=False)
        out[f"{name}+bound"] = gbdt(params, bound=True)
        for scale in SHRINK_GRID if name == "gbdt" else ():
            out[f"{name}+bound x{scale:g}"] = gbdt(params, bound=True, scale=scale)
    out.update(composed=composed, mfu_fit=mfu_fit, mfu_40=mfu_40)
    return out


RUN_COLUMNS_SHOWN = ("source", "model_name", "num_layers", "hidden_size", "num_experts", "seq_len", "tp", "pp", "dp",
                     "cp", "ep", "micro_batch", "global_batch", "recompute", "finetune", "dtype", "num_gpus",
                     "framework_group", "defaulted_fields", "measured_step_ms")  # fmt: skip
"""Run-table columns of the per-run leave-one-source-out file (``<out>_loso_runs.csv``); its model
shape columns (:data:`PARSED_SHAPE`) are the parsed config's, a preset's where the row names one."""
PARSED_SHAPE = ("num_layers", "hidden_size", "num_experts", "seq_len")
"""Columns of the per-run file that show the parsed model's field of the same name
(:class:`~perfcast.features.model.TransformerSpec`)."""
SHIPPED = f"gbdt(scale={DEFAULT_CORRECTION_SCALE:g})"
"""Name of the shipped step model's variant (fitted with the default ``correction_scale``)."""
RUN_PREDICTORS_SHOWN = (f"{SHIPPED}+bound", "composed", "mfu_fit")
"""Predictors whose held-out predictions the per-run file keeps (ms; with the interval where there is one)."""
TRAITS: tuple[tuple[str, Callable[[pd.DataFrame], pd.Series]], ...] = (
    ("dense", lambda r: r["num_experts"].fillna(1) <= 1),
    ("MoE, at most 32 experts", lambda r: r["num_experts"].between(2, 32)),
    ("MoE, at least 64 experts", lambda r: r["num_experts"] >= 64),
    ("LoRA", lambda r: r["finetune"] == "lora"),
    ("tp > 1", lambda r: r["tp"] > 1),
    ("pp > 1", lambda r: r["pp"] > 1),
    ("cp > 1", lambda r: r["cp"] > 1),
    ("ep > 1", lambda r: r["ep"].fillna(1) > 1),
    ("sequence of at least 32K tokens", lambda r: r["seq_len"] >= 32768),
    ("fp8", lambda r: r["dtype"] == "fp8"),
    ("at most 8 GPUs", lambda r: r["num_gpus"] <= 8),
    ("more than 512 GPUs", lambda r: r["num_gpus"] > 512),
)
"""(name, rows of the per-run frame that have it): the workload traits the held-out error is broken down by,
each also by GPU generation (``generation`` column). Traits overlap; a run counts under each it has."""


def evaluate(
    table: StepTable, variants: dict[str, dict[str, Any]], log: Callable[[str], None]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per (split, test group, predictor) and per (…, source, gpu) cell: the metrics; and one row
    per run of the ``loso`` split: its run-table columns and each :data:`RUN_PREDICTORS_SHOWN` prediction."""
    runs = table.runs
    scopes = runs["timing_scope"].astype(str).tolist()
    flops, peak = model_flops(table.configs, scopes), peak_flops(table.configs)
    measured = runs["measured_step_ms"].to_numpy(dtype=float)
    cell = (runs["source"].astype(str) + " / " + [c.cluster.gpu.id for c in table.configs]).to_numpy()
    fits = predictors(table, flops, peak, scopes, variants)
    rows = []
    per_run = runs.loc[:, [c for c in RUN_COLUMNS_SHOWN if c in runs]].copy()
    per_run.insert(1, "gpu", [c.cluster.gpu.id for c in table.configs])
    per_run.insert(2, "generation", [gpu_generation(c.cluster.gpu) for c in table.configs])
    for column in PARSED_SHAPE:
        per_run[column] = [getattr(c.model, column) for c in table.configs]
    for split, train, tests in splits(table):
        test_all = np.logical_or.reduce(list(tests.values()))
        if not train.any() or not test_all.any():
            continue
        start = time.perf_counter()
        preds = {name: fit(train, test_all) for name, fit in fits.items()}
        log(f"{split}: train {int(train.sum())}, test {int(test_all.sum())} in {time.perf_counter() - start:.1f} s")
        if split == "loso":
            for name in RUN_PREDICTORS_SHOWN:
                for suffix, values in zip(("ms", "lo_ms", "hi_ms"), preds[name], strict=True):
                    if values is not None:
                        per_run.loc[test_all, f"{name}_{suffix}"] = values
        for group, mask in tests.items():
            if not mask.any():
                continue
            within = mask[test_all]
            true = measured[mask]
            for name, (pred, lo, hi) in preds.items():
                base = {"split": split, "test_group": group, "predictor": name, "n_train": int(train.sum())}
                p, lo_, hi_ = pred[within], _take(lo, within), _take(hi, within)
                rows.append({**base, "cell": "", **_metrics(p, true, lo_, hi_)})
                for c in sorted(set(cell[mask])):
                    sub = cell[mask] == c
                    rows.append({**base, "cell": c, **_metrics(p[sub], true[sub], _take(lo_, sub), _take(hi_, sub))})
    return pd.DataFrame(rows), per_run


def _fmt(value: float, pct: bool = False) -> str:
    if value is None or not np.isfinite(value):
        return "-"
    return f"{100 * value:.0f}%" if pct else f"{value:.1f}"


def markdown(result: pd.DataFrame, header: list[str], predictors_shown: list[str]) -> str:
    """The report: one table per split (test groups x predictors), then the worst cells."""
    lines = list(header)
    groups = result[result["cell"] == ""]
    for split in groups["split"].unique():
        part = groups[groups["split"] == split]
        lines += [f"\n## {split}\n", "| test group | n | n_train | predictor | MAPE | median APE | p90 APE | "
                  "coverage | rel. width |", "|---|---:|---:|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for row in part[part["predictor"].isin(predictors_shown)].to_dict("records"):
            lines.append(
                f"| {row['test_group']} | {int(row['n'])} | {row['n_train']} | {row['predictor']} | "
                f"{_fmt(row['mape'])} | {_fmt(row['median_ape'])} | {_fmt(row['p90_ape'])} | "
                f"{_fmt(row['coverage'], True)} | {_fmt(row['rel_width'])} |"
            )
    cells = result[(result["cell"] != "") & (result["n"] >= 3)]
    main = predictors_shown[0]
    worst = cells[cells["predictor"] == main].nlargest(12, "mape")
    lines += [f"\n## Worst cells (split, test group, source / GPU; n >= 3) by {main} MAPE\n",
              "| split | test group | cell | n | " + " | ".join(f"{p} MAPE" for p in predictors_shown)
              + f" | {main} coverage |", "|---|---|---|---:|" + "---:|" * (len(predictors_shown) + 1)]  # fmt: skip
    for row in worst.to_dict("records"):
        same = cells[(cells["split"] == row["split"]) & (cells["test_group"] == row["test_group"])
                     & (cells["cell"] == row["cell"])].set_index("predictor")  # fmt: skip
        values = " | ".join(_fmt(same["mape"].get(p, np.nan)) for p in predictors_shown)
        lines.append(f"| {row['split']} | {row['test_group']} | {row['cell']} | {int(row['n'])} | {values} | "
                     f"{_fmt(row['coverage'], True)} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def trait_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """Held-out (leave-one-source-out) error of the runs with each :data:`TRAITS` trait and each GPU generation.

    Per trait: runs, sources, and for each :data:`RUN_PREDICTORS_SHOWN` predictor the MAPE over the runs
    (%) and the median of predicted / measured step (below 1: predicted too fast); the shipped model's
    coverage of its 90% interval (%). Traits no run has are left out.
    """
    masks = [(name, rule(per_run)) for name, rule in TRAITS]
    masks += [(f"generation {g}", per_run["generation"] == g) for g in sorted(per_run["generation"].unique())]
    measured = per_run["measured_step_ms"].to_numpy(dtype=float)
    rows = []
    for name, mask in masks:
        mask = mask.fillna(False).to_numpy(dtype=bool)
        if not mask.any():
            continue
        row: dict[str, Any] = {"trait": name, "runs": int(mask.sum()), "sources": per_run["source"][mask].nunique()}
        for pred in RUN_PREDICTORS_SHOWN:
            ratio = per_run[f"{pred}_ms"].to_numpy(dtype=float)[mask] / measured[mask]
            row[f"{pred} MAPE"] = float(100 * np.mean(np.abs(ratio - 1)))
            row[f"{pred} pred/meas"] = float(np.median(ratio))
        shipped = RUN_PREDICTORS_SHOWN[0]
        lo, hi = (per_run[f"{shipped}_{s}"].to_numpy(dtype=float)[mask] for s in ("lo_ms", "hi_ms"))
        row[f"{shipped} coverage"] = float(100 * np.mean((lo <= measured[mask]) & (measured[mask] <= hi)))
        rows.append(row)
    return pd.DataFrame(rows)


def md_table(frame: pd.DataFrame) -> str:
    """A pipe table of ``frame`` (floats with two decimals)."""
    cells = [[f"{v:.2f}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    return "\n".join([head, "|" + "---|" * len(frame.columns), *("| " + " | ".join(r) + " |" for r in cells)])


def summary_table(result: pd.DataFrame, predictors_shown: list[str]) -> pd.DataFrame:
    """Per split and predictor: the n-weighted MAPE over test groups and the worst group's MAPE."""
    groups = result[(result["cell"] == "") & result["predictor"].isin(predictors_shown)]
    rows = []
    for (split, pred), part in groups.groupby(["split", "predictor"], sort=False):
        w = part["n"].to_numpy()
        rows.append({"split": split, "predictor": pred, "n": int(w.sum()),
                     "mape_weighted": float(np.average(part["mape"], weights=w)),
                     "mape_group_mean": float(part["mape"].mean()),
                     "worst_group": part.loc[part["mape"].idxmax(), "test_group"],
                     "worst_mape": float(part["mape"].max()),
                     "coverage_weighted": float(np.average(part["coverage"], weights=w))})  # fmt: skip
    return pd.DataFrame(rows)


def before_after(before_json: Path, result: pd.DataFrame, predictors_shown: list[str]) -> pd.DataFrame:
    """Per loso source: ``before -> after`` MAPE of every shown predictor, and the shipped model's coverage.

    The shipped variant is matched to the earlier run's shipped variant (``gbdt(scale=...)+bound``)
    even where the shipped ``correction_scale`` has changed since.
    """
    before = pd.DataFrame(json.loads(before_json.read_text())["rows"])

    def pick(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[(frame["cell"] == "") & (frame["split"] == "loso")].set_index(["test_group", "predictor"])

    old, new = pick(before), pick(result)
    earlier = sorted({p for p in old.index.get_level_values(1) if re.fullmatch(r"gbdt\(scale=[0-9.]+\)\+bound", p)})
    renamed = {f"{SHIPPED}+bound": earlier[0]} if len(earlier) == 1 else {}
    rows = []
    for group in new.index.get_level_values(0).unique():
        row: dict[str, Any] = {"source": group, "n": int(new.loc[(group, predictors_shown[0]), "n"])}
        for name in predictors_shown:
            was = old["mape"].get((group, renamed.get(name, name)), float("nan"))
            row[name] = f"{_fmt(was)} -> {_fmt(new.loc[(group, name), 'mape'])}"
        for name in (f"{SHIPPED}+bound", "composed"):
            was = old["coverage"].get((group, renamed.get(name, name)), float("nan"))
            row[f"coverage {name}"] = f"{_fmt(was, True)} -> {_fmt(new.loc[(group, name), 'coverage'], True)}"
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--op-model", default=None, help="op bundle to compose with (default: shipped)")
    parser.add_argument("--out", type=Path, default=OUT, help="output prefix (.md and .json are added)")
    parser.add_argument(
        "--before", type=Path, default=None, help="an earlier run's .json: its loso MAPE and coverage shown beside"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - start:6.1f} s] {msg}", flush=True)  # noqa: E731
    runs = load_runs(args.data)
    bundle = load_op_predictor(args.op_model)
    table = build_step_table(runs, StepComposer(bundle, bundle.collective_model))
    log(f"composed {len(table.runs)} of {len(runs)} runs ({len(table.errors)} not valid configs)")
    variants = {"gbdt": {}, SHIPPED: {"correction_scale": DEFAULT_CORRECTION_SCALE},
                "factors": {"correction_scale": 0.0}}  # fmt: skip
    result, per_run = evaluate(table, variants, log)
    shown = ["gbdt", "gbdt+bound", f"{SHIPPED}+bound", "factors+bound", "composed", "mfu_fit", "mfu_40"]
    grid = ["gbdt+bound", *(f"gbdt+bound x{g:g}" for g in SHRINK_GRID)]
    groups = result[(result["cell"] == "") & result["predictor"].isin(grid)]
    selection = groups.pivot_table(index="predictor", columns="split", values="mape", aggfunc="mean").reindex(grid)
    summary = summary_table(result, shown)
    counts = runs["source"].value_counts().rename("rows").to_frame()
    counts["parsed"] = table.runs["source"].value_counts()
    counts["left out"] = table.errors["source"].value_counts() if len(table.errors) else 0
    counts = counts.fillna(0).astype(int)
    header = [
        "# Step transfer evaluation (issue 14)\n",
        f"`benchmarks/step_transfer_eval.py`; {len(table.runs)} composed runs; op model: "
        f"{args.op_model or 'shipped default bundle'}; {time.perf_counter() - start:.0f} s total. "
        "APE in percent; coverage and mean relative width of the 90% interval. MFU = model FLOPs "
        "(perfcast.models.analytic.model_flops_per_step) / (step * GPUs * dense peak at the dtype).\n",
        "## Rows per source\n",
        md_table(counts.reset_index()),
        "\n## Summary (n-weighted MAPE over test groups; worst group)\n",
        md_table(summary),
        "\n## Shrinking the learned correction (mean MAPE over test groups, each group equal)\n",
        "`gbdt+bound xS`: the fitted GBDT's log correction times S (post hoc, interval moved with "
        "the median); S is picked on `loso` alone, the other splits are reported once with it. "
        f"`{SHIPPED}` is the model fitted with `correction_scale={DEFAULT_CORRECTION_SCALE:g}` "
        "(its interval calibrated on the scaled predictor).\n",
        md_table(selection.reset_index()),
    ]
    if args.before is not None:
        header += ["\n## loso before -> after (`--before`; MAPE, coverage of the 90% interval)\n",
                   md_table(before_after(args.before, result, shown))]  # fmt: skip
    traits = trait_table(per_run)
    text = markdown(result, header, shown) + "\n".join([
        "\n## Held-out error by workload trait (leave-one-source-out runs)\n",
        "Each run scored by the model fitted without its source, as in `loso`. MAPE in %; `pred/meas` is the "
        "median of predicted / measured step (below 1: predicted too fast); coverage of the shipped model's "
        "90% interval in %. A run counts under every trait it has; vTrain's 1,440 runs (dense, A100, "
        "recomputed, at most 8 GPUs) dominate the traits they share.\n",
        md_table(traits), ""])  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    payload = {"rows": result.to_dict("records"), "summary": summary.to_dict("records"),
               "sources": counts.reset_index().to_dict("records"), "traits": traits.to_dict("records"),
               "seconds": time.perf_counter() - start}  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=float))
    per_run.round(3).to_csv(args.out.with_name(f"{args.out.name}_loso_runs.csv"), index=False)
    log(f"wrote {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
