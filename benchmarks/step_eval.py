"""Whole-step accuracy on held-out splits: analytic, composed and step-GBDT predictors.

Reads the measured run tables of ``--data`` (default ``../shared/data``): vTrain Megatron
iterations, NeuSight end-to-end latencies and MLPerf GPT-3 step times
(:mod:`perfcast.training.train_steps`). Predictors:

* ``analytic``: roofline and alpha-beta op times through the schedule
  (:class:`AnalyticOpPredictor` in the composer; equal to ``perfcast predict steps
  --model analytic``);
* ``composed``: the shipped default op bundle through the composer (attention,
  embedding and optimizer fall back to the roofline; collectives alpha-beta);
* ``composed+coll``: as ``composed``, collectives timed by a
  :class:`CollectiveTimeRegressor` trained on the measured NCCL tables (vTrain nccl-tests
  A100/V100, Vidur collectives);
* ``gbdt(composed)`` and ``gbdt(composed+coll)``: :class:`StepTimeRegressor` (default
  features: no cluster-scale feature; correction shrunk off the training hardware/model
  range) on the run features of that composition, trained on the split's training rows
  (sources weighted equally), interval calibrated on held-out GPU-count groups with the
  same source weights and, for rows off the training hardware/model range or with no stated
  software release, also on held-out (source, GPU, MLPerf round) groups. Training rows carry
  their MLPerf round as the software release; test rows are queried as a user would, with
  none (the model then assumes the newest round it was fitted on).

A section compares the out-of-domain rules of :class:`StepTimeRegressor` (correction of
rows beyond the training range: scaled or none; interval: cluster, domain or wider) on
every split for gbdt(composed).

Measured runs are read by :func:`load_runs`, which fills what the MLPerf tables leave out:
the interleaving depth ``vpp`` of NVIDIA's v3.1 GPT-3 configs from the configs that state
it for the same layout, and NeMo's distributed optimizer (ZeRO-1, gradient reduce-scatter
overlapped with the last backward). For the MLPerf small-to-large split the result also
lists every test system with its config, each predictor and the composed breakdown.

The composers are also scored on every parsed row of each source (no learning involved).
For vTrain small-to-large the test rows are split by whether their per-GPU layout
(model, tp, pp, micro_batch, microbatches) also occurs in the training runs at another
GPU count, to show how much of the GBDT's accuracy is transfer of a seen layout.

Splits (DESIGN.md decision 6): vTrain small-to-large (2 and 4 GPUs -> 8), MLPerf
smaller-to-larger systems (<= 1024 GPUs -> larger, vTrain in training) and MLPerf
older-to-newer rounds (v3.x -> v4.x, vTrain in training). Metrics: MAPE, median and p90
APE, coverage and mean relative width of the 90% interval, Spearman within each
(model, cluster) group. Writes ``benchmarks/results/step_eval.json`` and ``.md``.

Usage: .venv/bin/python benchmarks/step_eval.py [--data DIR] [--coverage 0.9]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.sources import read_source
from perfcast.features.hardware import resolve_gpu_name
from perfcast.features.run_features import RELEASE_COLUMN
from perfcast.models.analytic import AnalyticOpPredictor
from perfcast.models.bundle import load_bundle
from perfcast.models.collective_model import CollectiveTimeRegressor
from perfcast.models.composer import StepComposer
from perfcast.models.step_model import OOD_CORRECTIONS, OOD_INTERVALS
from perfcast.training.train_steps import (
    SPLITS,
    build_step_table,
    evaluate_steps,
    fit_step_model,
    load_runs,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
DEFAULT_BUNDLE = ROOT / "src" / "perfcast" / "models" / "default_bundle"
OUT = ROOT / "benchmarks" / "results"
COLLECTIVE_FILES = ("vtrain_nccl_allreduce.csv.gz", "vidur_collectives.csv.gz")
COLLECTIVE_COLUMNS = ["op", "bytes", "n_ranks", "ranks_per_node", "nvlink_bridged", "dtype", "gpu", "measured_ms"]


def train_collective_model(data: Path) -> CollectiveTimeRegressor:
    """Collective model fitted on the measured NCCL tables."""
    frames = [
        read_source(data / f, resolve_gpu=resolve_gpu_name).records.reindex(columns=COLLECTIVE_COLUMNS)
        for f in COLLECTIVE_FILES
    ]
    table = pd.concat(frames, ignore_index=True)
    return CollectiveTimeRegressor(n_jobs=2).fit(table, table["measured_ms"])


def _score(runs: pd.DataFrame, test: np.ndarray, pred, lo=None, hi=None) -> dict[str, float]:
    part = runs[test]
    return evaluate_steps(
        np.asarray(pred)[test],
        part["measured_step_ms"].to_numpy(),
        part["group"].to_numpy(),
        None if lo is None else np.asarray(lo)[test],
        None if hi is None else np.asarray(hi)[test],
    )


def _layout_seen(runs: pd.DataFrame, train: np.ndarray) -> np.ndarray:
    """Rows whose per-GPU layout (model, tp, pp, micro_batch, microbatches) occurs in ``train``."""
    microbatches = runs["global_batch"] // (runs["dp"] * runs["micro_batch"])
    key = runs[["num_layers", "hidden_size", "seq_len", "tp", "pp", "micro_batch"]].astype(str).agg("|".join, axis=1)
    key = key + "|" + microbatches.astype(str)
    return key.isin(set(key[train])).to_numpy()


BREAKDOWN = ("compute_ms", "comm_tp_ms", "comm_pp_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms")


def _per_system_rows(tables: dict, test: np.ndarray, gbdt, gbdt_bounds) -> list[dict]:
    """Per MLPerf test system (mean of its runs): config, measured, each predictor and the composed breakdown."""
    runs = tables["composed"].runs
    frame = runs.loc[test, ["mlperf_version", "system", "num_gpus", "tp", "pp", "dp", "vpp", "micro_batch",
                            "global_batch", "dtype", "measured_step_ms"]].copy()  # fmt: skip
    frame["microbatches"] = runs["global_batch"] // (runs["dp"] * runs["micro_batch"])
    frame["defaulted"] = runs.get("defaulted_fields", pd.Series("", index=runs.index)).fillna("")
    frame["analytic_ms"] = tables["analytic"].runs.loc[test, "step_ms"]
    frame["composed_ms"] = runs.loc[test, "step_ms"]
    frame["composed_coll_ms"] = tables["composed+coll"].runs.loc[test, "step_ms"]
    frame["gbdt_ms"] = np.asarray(gbdt)[test]
    frame["gbdt_lo_ms"], frame["gbdt_hi_ms"] = np.asarray(gbdt_bounds[0])[test], np.asarray(gbdt_bounds[1])[test]
    host = np.array([s.breakdown.host_stall_ms for s in tables["composed"].steps])
    frame["host_stall_ms"] = host[test]
    for col in BREAKDOWN:
        frame[col] = runs.loc[test, col] if col in runs else 0.0
    keys = ["mlperf_version", "system", "num_gpus", "tp", "pp", "dp", "vpp", "micro_batch", "global_batch",
            "microbatches", "dtype", "defaulted"]  # fmt: skip
    grouped = frame.groupby(keys, dropna=False, sort=False).mean(numeric_only=True).reset_index()
    grouped = grouped.sort_values("num_gpus")
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in grouped.to_dict("records")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE)
    parser.add_argument("--coverage", type=float, default=0.9)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    warnings.simplefilter("ignore")
    start = time.perf_counter()

    runs = load_runs(args.data)
    bundle = load_bundle(args.bundle)
    collective = train_collective_model(args.data)
    composers = {
        "analytic": StepComposer(AnalyticOpPredictor(), coverage=args.coverage),
        "composed": StepComposer(bundle, coverage=args.coverage),
        "composed+coll": StepComposer(bundle, collective, coverage=args.coverage),
    }
    tables = {}
    for name, composer in composers.items():
        t0 = time.perf_counter()
        tables[name] = build_step_table(runs, composer)
        tables[name + ":seconds"] = time.perf_counter() - t0
    base = tables["composed+coll"]
    gbdt_bases = ("composed", "composed+coll")
    result: dict = {
        "data": str(args.data),
        "coverage": args.coverage,
        "rows_loaded": {k: int(v) for k, v in runs["source"].value_counts().items()},
        "rows_invalid_config": {k: int(v) for k, v in base.errors["source"].value_counts().items()},
        "invalid_config_reasons": base.errors["error"].value_counts().head(10).to_dict(),
        "compose_seconds": {k: round(tables[k + ":seconds"], 1) for k in composers},
        "splits": {},
        "ood_rules": {},
        "all_rows_by_source": {
            source: {
                name: _score(
                    tables[name].runs,
                    (tables[name].runs["source"] == source).to_numpy(),
                    tables[name].runs["step_ms"],
                    tables[name].runs["step_lo_ms"],
                    tables[name].runs["step_hi_ms"],
                )
                for name in composers
            }
            for source in sorted(base.runs["source"].unique())
        },
    }
    for split, fn in SPLITS.items():
        train, test = fn(base.runs)
        if not test.any() or not train.any():
            result["splits"][split] = {"skipped": "no rows on one side"}
            continue
        rows = {}
        for name in composers:
            r = tables[name].runs
            rows[name] = _score(r, test, r["step_ms"], r["step_lo_ms"], r["step_hi_ms"])
        preds, bounds = {}, {}
        for name in gbdt_bases:
            model = fit_step_model(tables[name], train)
            queries = _as_queries(tables[name].features)
            preds[name] = model.predict(queries)
            interval = model.predict_interval(queries, coverage=args.coverage)
            bounds[name] = (interval[:, 0], interval[:, 1])
            rows[f"gbdt({name})"] = _score(base.runs, test, preds[name], *bounds[name])
        result["ood_rules"][split] = _ood_rules(tables["composed"], train, test, args.coverage)
        test_runs = base.runs[test]
        if split == "mlperf_small_to_large":
            result["mlperf_large_rows"] = _per_system_rows(tables, test, preds["composed"], bounds["composed"])
        if split == "vtrain_small_to_large":
            seen = _layout_seen(base.runs, train)
            result["vtrain_test_by_tp"] = {
                int(tp): {
                    name: _score(base.runs, test & (base.runs["tp"] == tp).to_numpy(), preds[name], *bounds[name])
                    for name in gbdt_bases
                }
                for tp in sorted(test_runs["tp"].unique())
            }
            result["vtrain_layout_overlap"] = {
                f"{'seen' if flag else 'unseen'} layout": {
                    name: _score(base.runs, test & (seen == flag), preds[name]) for name in gbdt_bases
                }
                for flag in (True, False)
                if (test & (seen == flag)).sum() >= 2
            }
        result["splits"][split] = {
            "train_rows": int(train.sum()),
            "test_rows": int(test.sum()),
            "test_num_gpus": sorted(int(g) for g in test_runs["num_gpus"].unique()),
            "test_groups": int(test_runs["group"].nunique()),
            "metrics": rows,
        }
    result["seconds"] = round(time.perf_counter() - start, 1)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "step_eval.json").write_text(json.dumps(result, indent=2, default=float) + "\n")
    (OUT / "step_eval.md").write_text(to_markdown(result))
    print(to_markdown(result))


def _as_queries(features: pd.DataFrame) -> pd.DataFrame:
    """Run features as a user's query has them: no software release (the model assumes its newest)."""
    return features.assign(**{RELEASE_COLUMN: np.nan})


def _ood_rules(table, train: np.ndarray, test: np.ndarray, coverage: float) -> dict[str, dict]:
    """gbdt(composed) on ``test`` under each out-of-domain correction and interval rule (plus no domain hold-out)."""
    out = {}
    X = _as_queries(table.features)
    for correction in OOD_CORRECTIONS:
        model = fit_step_model(table, train, ood_correction=correction)
        pred = model.predict(X)
        for rule in OOD_INTERVALS:
            interval = model.set_params(ood_interval=rule).predict_interval(X, coverage=coverage)
            out[f"{correction} / {rule}"] = _score(table.runs, test, pred, interval[:, 0], interval[:, 1])
        out[f"{correction} / rows out of domain"] = {"n": float((model.extrapolation_distance(X[test]) > 0).sum())}
    return out


def _fmt(m: dict, key: str, spec: str = ".1f", scale: float = 1.0) -> str:
    value = m.get(key)
    return "-" if value is None or not np.isfinite(value) else format(scale * value, spec)


def to_markdown(result: dict) -> str:
    lines = [
        "# Step-time prediction on held-out splits",
        "",
        "Command: `.venv/bin/python benchmarks/step_eval.py`. Rows per source: "
        + ", ".join(f"{k} {v}" for k, v in result["rows_loaded"].items())
        + f"; invalid configs: {result['rows_invalid_config'] or 'none'}.",
        f"Interval: {result['coverage']:.0%}. APE in percent; cov = coverage, width = mean (hi-lo)/pred; "
        "Spearman = mean over (model, cluster) groups of >= 3 runs (pooled: all test rows); each MLPerf "
        "(model, cluster) group is one config run 3 times, so its within-group Spearman is undefined (-).",
        "",
    ]
    for split, info in result["splits"].items():
        lines.append(f"## {split}")
        lines.append("")
        if "skipped" in info:
            lines += [f"Skipped: {info['skipped']}.", ""]
            continue
        lines += [
            f"Train {info['train_rows']} runs, test {info['test_rows']} runs on {info['test_num_gpus']} GPUs "
            f"({info['test_groups']} groups).",
            "",
            "| predictor | MAPE | median APE | p90 APE | cov | width | Spearman (groups) | Spearman pooled "
            "| measured/pred |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, m in info["metrics"].items():
            lines.append(
                f"| {name} | {_fmt(m, 'mape')} | {_fmt(m, 'median_ape')} | {_fmt(m, 'p90_ape')} "
                f"| {_fmt(m, 'coverage', '.0%')} | {_fmt(m, 'rel_width', '.2f')} "
                f"| {_fmt(m, 'spearman_mean', '.3f')} ({int(m['spearman_groups'])}) "
                f"| {_fmt(m, 'spearman_pooled', '.3f')} | {_fmt(m, 'median_ratio_measured_over_pred', '.2f')} |"
            )
        lines.append("")
    lines += ["## Composers on all parsed rows, per source (no learning)", ""]
    lines += [
        "| source | predictor | n | MAPE | median APE | p90 APE | cov | width | Spearman (groups) | measured/pred |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for source, metrics in result["all_rows_by_source"].items():
        for name, m in metrics.items():
            lines.append(
                f"| {source} | {name} | {int(m['n'])} | {_fmt(m, 'mape')} | {_fmt(m, 'median_ape')} "
                f"| {_fmt(m, 'p90_ape')} | {_fmt(m, 'coverage', '.0%')} | {_fmt(m, 'rel_width', '.2f')} "
                f"| {_fmt(m, 'spearman_mean', '.3f')} ({int(m['spearman_groups'])}) "
                f"| {_fmt(m, 'median_ratio_measured_over_pred', '.2f')} |"
            )
    if result.get("ood_rules"):
        lines += [
            "",
            "## Out-of-domain rules: gbdt(composed) per correction / interval rule",
            "",
            "Correction of rows beyond the training range (extrapolation distance d > 0): `scaled` = f/(1+d), "
            "`none` = the composed step. Interval: `cluster` = residuals of held-out cluster sizes only; "
            "`domain` = the wider of those and the residuals of held-out (source, GPU, MLPerf round) groups for "
            "rows with d > 0 or no stated release (every test row here: queries state none); `wider` = that for "
            "every row. Default: scaled / domain.",
            "",
            "| split | correction / interval | rows d>0 | MAPE | median APE | p90 APE | cov | width |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for split, rules in result["ood_rules"].items():
            for name, m in rules.items():
                if "rows out of domain" in name:
                    continue
                n_out = int(rules[name.split(" / ")[0] + " / rows out of domain"]["n"])
                lines.append(
                    f"| {split} | {name} | {n_out} | {_fmt(m, 'mape')} | {_fmt(m, 'median_ape')} "
                    f"| {_fmt(m, 'p90_ape')} | {_fmt(m, 'coverage', '.0%')} | {_fmt(m, 'rel_width', '.2f')} |"
                )
    if "mlperf_large_rows" in result:
        lines += [
            "",
            "## MLPerf small-to-large: each test system (mean of its runs), ms",
            "",
            "GPT-3 175B, tp 4, pp 8. `imp` = fields not in the row's config, set by the MLPerf reader "
            "(v = vpp from the file's stated configs of the same layout, z = NeMo's ZeRO-1 + "
            "overlapped gradient reduce-scatter). Breakdown of the composed step: compute (incl. host stall), "
            "exposed tp and pp transfers, pipeline bubble, exposed dp sync, optimizer.",
            "",
            "| round | system | GPUs | dp | vpp | m | imp | measured | analytic | composed | comp+coll | GBDT [90%] "
            "| compute | tp | pp | bubble | dp sync | optim |",
            "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in result["mlperf_large_rows"]:
            given = str(r["defaulted"]).split(";")
            imp = ("v" if "vpp" in given and r["vpp"] > 1 else "") + ("z" if "zero_stage" in given else "")
            lines.append(
                f"| {r['mlperf_version']} | {r['system']} | {r['num_gpus']} | {r['dp']} | {r['vpp']} "
                f"| {r['microbatches']} | {imp} | {r['measured_step_ms']:.0f} | {r['analytic_ms']:.0f} "
                f"| {r['composed_ms']:.0f} | {r['composed_coll_ms']:.0f} | {r['gbdt_ms']:.0f} "
                f"[{r['gbdt_lo_ms']:.0f}, {r['gbdt_hi_ms']:.0f}] " + " ".join(f"| {r[c]:.0f}" for c in BREAKDOWN) + " |"
            )
    if "vtrain_layout_overlap" in result:
        lines += [
            "",
            "## vTrain small-to-large: test rows whose per-GPU layout was seen in training",
            "",
            "| test rows | predictor | n | MAPE | median APE | p90 APE |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for subset, metrics in result["vtrain_layout_overlap"].items():
            for name, m in metrics.items():
                lines.append(
                    f"| {subset} | gbdt({name}) | {int(m['n'])} | {_fmt(m, 'mape')} | {_fmt(m, 'median_ape')} "
                    f"| {_fmt(m, 'p90_ape')} |"
                )
    if "vtrain_test_by_tp" in result:
        lines += [
            "",
            "## vTrain small-to-large: GBDT on the 8-GPU test rows by tensor-parallel degree (tp=8 unseen in training)",
            "",
            "| tp | predictor | n | MAPE | median APE | p90 APE | cov | width |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for tp, metrics in result["vtrain_test_by_tp"].items():
            for name, m in metrics.items():
                lines.append(
                    f"| {tp} | gbdt({name}) | {int(m['n'])} | {_fmt(m, 'mape')} | {_fmt(m, 'median_ape')} "
                    f"| {_fmt(m, 'p90_ape')} | {_fmt(m, 'coverage', '.0%')} | {_fmt(m, 'rel_width', '.2f')} |"
                )
    lines += ["", f"Compose seconds (all rows): {result['compose_seconds']}; total {result['seconds']} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
