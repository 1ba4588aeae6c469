"""Step GNN vs the analytic composition on vTrain's Megatron runs, small to large.

Test split: train on the runs with 2 and 4 GPUs, test on the 8-GPU runs (tp=8 appears
only in the test). The GNN setting is chosen first on a validation split inside the
training set that mimics it (train on 2 GPUs, validate on 4: tp=4 appears only in the
validation), by validation MAPE among ``CANDIDATES``; the 8-GPU runs are used only to
score the chosen setting. Writes ``benchmarks/results/step_gnn_eval.{md,json}``: MAPE,
median and p90 APE, coverage and mean relative width of the 90% interval, and the
Spearman rank correlation of predicted vs measured steps within each (model, cluster)
group, beside the analytic composition, on both splits.

Node times are the analytic ``op_time_ms``; graph features are ``basic_graph_features``.

Usage: .venv/bin/python benchmarks/step_gnn_eval.py [--data PATH] [--candidates NAME ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast.data.sources import read_source
from perfcast.features.run_config import parse_run_row
from perfcast.models.gnn import StepGNNRegressor, build_step_graph
from perfcast.training.metrics import summarize
from perfcast.training.train_steps import group_spearman, run_groups

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "vtrain_megatron_iteration_time.csv"
OUT = ROOT / "benchmarks" / "results"
COVERAGE = 0.9

CANDIDATES: dict[str, dict[str, Any]] = {
    "time-h32-l2": {"readout": "time", "hidden": 32, "num_layers": 2, "epochs": 40},
    "time-h64-l3": {"readout": "time", "hidden": 64, "num_layers": 3, "epochs": 40},
    "pool-h32-l2": {"readout": "pool", "hidden": 32, "num_layers": 2, "epochs": 40},
    "time-h32-l0": {"readout": "time", "hidden": 32, "num_layers": 0, "epochs": 40},
}
"""GNN settings compared on the validation split (``StepGNNRegressor`` keywords)."""


def load_samples(path: Path) -> tuple[pd.DataFrame, list]:
    """The runs (with ``composed_ms`` and their ``group``) and their step graphs (analytic node times)."""
    runs = read_source(path).records.reset_index(drop=True)
    configs = [parse_run_row(row) for row in runs.to_dict("records")]
    samples = [build_step_graph(config) for config in configs]
    runs["composed_ms"] = [s.composed_ms for s in samples]
    runs["group"] = run_groups(configs)
    return runs, samples


def evaluate(runs: pd.DataFrame, pred: np.ndarray, interval: np.ndarray | None) -> dict[str, Any]:
    """The summary metrics (Spearman within (model, cluster) groups as in ``step_eval.py``), overall and per tp."""
    true = runs["measured_step_ms"].to_numpy()
    lo, hi = (None, None) if interval is None else (interval[:, 0], interval[:, 1])
    out: dict[str, Any] = {**summarize(pred, true, lo, hi), **group_spearman(pred, true, runs["group"].to_numpy())}
    by_tp = {}
    for tp, idx in runs.groupby("tp").indices.items():
        part = summarize(pred[idx], true[idx], None if lo is None else lo[idx], None if hi is None else hi[idx])
        by_tp[int(tp)] = part
    out["by_tp"] = by_tp
    return out


def fit_and_score(
    params: dict[str, Any], train: np.ndarray, test: np.ndarray, runs: pd.DataFrame, samples: list
) -> tuple[dict[str, Any], float]:
    """Fit on ``train`` rows, score on ``test`` rows; the metrics and the fit seconds."""
    model = StepGNNRegressor(**params)
    start = time.perf_counter()
    model.fit([samples[i] for i in train], runs.loc[train, "measured_step_ms"].to_numpy())
    seconds = time.perf_counter() - start
    x_test = [samples[i] for i in test]
    pred = model.predict(x_test)
    interval = model.predict_interval(x_test, coverage=COVERAGE)
    return evaluate(runs.loc[test].reset_index(drop=True), pred, interval), seconds


def _row(name: str, m: dict[str, Any]) -> str:
    cov = f"{100 * m['coverage']:.1f}" if "coverage" in m else "-"
    width = f"{m['rel_width']:.2f}" if "rel_width" in m else "-"
    return (
        f"| {name} | {int(m['n'])} | {m['mape']:.1f} | {m['median_ape']:.1f} | {m['p90_ape']:.1f} | {cov} | {width} "
        f"| {m['spearman_mean']:.3f} / {m['spearman_pooled']:.3f} |"
    )


HEADER = [
    "| predictor | n | MAPE % | median APE % | p90 APE % | 90% coverage % | rel. width | Spearman groups / pooled |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
]


def _tp_table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| predictor | tp | n | MAPE % | median APE % | 90% coverage % |", "|---|---:|---:|---:|---:|---:|"]
    for name, m in results.items():
        for tp, part in m["by_tp"].items():
            cov = f"{100 * part['coverage']:.1f}" if "coverage" in part else "-"
            lines.append(
                f"| {name} | {tp} | {int(part['n'])} | {part['mape']:.1f} | {part['median_ape']:.1f} | {cov} |"
            )
    return lines


def run_split(
    label: str, train: np.ndarray, test: np.ndarray, runs: pd.DataFrame, samples: list, settings: dict[str, dict]
) -> dict[str, Any]:
    """Analytic composition and each GNN setting on one split."""
    test_runs = runs.loc[test].reset_index(drop=True)
    results = {"analytic composition": evaluate(test_runs, test_runs["composed_ms"].to_numpy(), None)}
    fit_seconds = {}
    for name, params in settings.items():
        results[name], fit_seconds[name] = fit_and_score(params, train, test, runs, samples)
        print(label, name, f"MAPE {results[name]['mape']:.1f}%, fit {fit_seconds[name]:.0f} s", flush=True)
    return {"n_train": int(len(train)), "n_test": int(len(test)), "results": results, "fit_seconds": fit_seconds}


def _section(title: str, split: str, part: dict[str, Any], settings: dict[str, dict]) -> list[str]:
    return [
        f"## {title}",
        "",
        f"{split}: {part['n_train']} train / {part['n_test']} evaluated runs.",
        "",
        *HEADER,
        *(_row(name, m) for name, m in part["results"].items()),
        "",
        "By tensor-parallel size:",
        "",
        *_tp_table(part["results"]),
        "",
        "Settings: " + "; ".join(f"{k}: {v}" for k, v in settings.items()) + ".",
        "Fit seconds (1 torch thread, shared 2-core machine): "
        + ", ".join(f"{k} {v:.0f}" for k, v in part["fit_seconds"].items())
        + ".",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--candidates", nargs="*", default=list(CANDIDATES), help="names from CANDIDATES")
    args = parser.parse_args()
    candidates = {name: CANDIDATES[name] for name in args.candidates}

    runs, samples = load_samples(args.data)
    gpus = runs["num_gpus"].to_numpy()
    train = np.flatnonzero(gpus <= 4)
    inner_train, inner_val = np.flatnonzero(gpus == 2), np.flatnonzero(gpus == 4)
    validation = run_split("validation", inner_train, inner_val, runs, samples, candidates)
    chosen = min(candidates, key=lambda name: validation["results"][name]["mape"])
    test = run_split("test", train, np.flatnonzero(gpus == 8), runs, samples, {chosen: candidates[chosen]})

    payload = {
        "data": args.data.name,
        "coverage_target": COVERAGE,
        "candidates": candidates,
        "chosen": chosen,
        "validation": {"split": "train num_gpus=2, validate num_gpus=4", **validation},
        "test": {"split": "train num_gpus in {2, 4}, test num_gpus=8", **test},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "step_gnn_eval.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [
        "# Step GNN vs analytic composition, vTrain Megatron runs (small to large)",
        "",
        f"Data: {args.data.name}. Command: `.venv/bin/python benchmarks/step_gnn_eval.py`.",
        "Spearman: rank correlation of predicted vs measured steps, mean over (model, cluster) groups",
        "(`training.train_steps.group_spearman`, as in `step_eval.md`) and pooled over all evaluated runs.",
        "Interval: 90% (ensemble spread, split-conformal scaled on the largest cluster size of the",
        "training runs). Node times: analytic `op_time_ms`; graph features: `basic_graph_features`.",
        f"Chosen on validation MAPE: **{chosen}**.",
        "",
        *_section(
            "Test: train 2 and 4 GPUs, test 8 GPUs",
            "Train num_gpus in {2, 4}, test num_gpus=8",
            test,
            {chosen: candidates[chosen]},
        ),  # fmt: skip
        *_section(
            "Validation (inside the training runs): train 2 GPUs, validate 4 GPUs",
            "Train num_gpus=2, validate num_gpus=4",
            validation,
            candidates,
        ),  # fmt: skip
    ]
    (OUT / "step_gnn_eval.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
