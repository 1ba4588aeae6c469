"""Leave-one-GPU-out accuracy of the collective model against the catalog alpha-beta baseline.

Reads the measured collective tables of ``--data`` (default ``../shared/data``):
vTrain nccl-tests all-reduce (A100 SXM4, V100 SXM2; 2-8 GPUs in one node, fp32, 1 MiB-1 GiB),
Vidur collectives (A100 SXM4 DGX, A100 PCIe and A40 pairwise-NVLink nodes; fp16 all-reduce
and send/recv, 1-16 ranks, intra- and inter-node) and DeepBench all-reduce (P100 PCIe, fp32).

Splits (DESIGN.md, decision 6):

* leave-one-GPU-out: train :class:`CollectiveTimeRegressor` on the other GPUs' rows, predict
  the held-out GPU's rows;
* train-small/test-large: train on groups of <= 4 ranks (every GPU), test on > 4 ranks.

Three predictors per split: ``alpha_beta_catalog`` (the analytic time with catalog figures,
no fitting), ``alpha_beta_fitted`` (the model's fitted per-link efficiency and latency, no
learned residual) and ``model`` (physics times the XGBoost residual, with the 90 % interval).
Metrics: MAPE, median APE, p90 APE (percent), interval coverage and mean relative width.
Writes ``benchmarks/results/collective_eval.json`` and ``.md``.

Usage: .venv/bin/python benchmarks/collective_eval.py [--data DIR] [--coverage 0.9]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.sources import read_source
from perfcast.features.collective_features import featurize_collectives
from perfcast.features.hardware import resolve_gpu_name
from perfcast.models.collective_model import CollectiveTimeRegressor
from perfcast.training.metrics import summarize

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "results"
FILES = ("vtrain_nccl_allreduce.csv.gz", "vidur_collectives.csv.gz", "deepbench_allreduce.csv")
COLUMNS = ["op", "bytes", "n_ranks", "ranks_per_node", "nvlink_bridged", "dtype", "gpu", "measured_ms", "source",
           "cluster"]  # fmt: skip


def load(data: Path) -> pd.DataFrame:
    frames = []
    for name in FILES:
        records = read_source(data / name, resolve_gpu=resolve_gpu_name).records
        cluster = records["cluster"] if "cluster" in records.columns else pd.NA
        bridged = records["nvlink_bridged"] if "nvlink_bridged" in records.columns else False
        records = records.assign(table=name.split("_")[0], cluster=cluster, nvlink_bridged=bridged)
        frames.append(records[[*COLUMNS, "table"]])
    return pd.concat(frames, ignore_index=True)


def _score(test: pd.DataFrame, model: CollectiveTimeRegressor, coverage: float) -> dict[str, dict[str, float]]:
    true = test["measured_ms"].to_numpy()
    catalog = featurize_collectives(test)["alpha_beta_ms"].to_numpy()
    pred = model.predict(test)
    lo, hi = model.predict_interval(test, coverage=coverage).T
    return {
        "alpha_beta_catalog": summarize(catalog, true),
        "alpha_beta_fitted": summarize(model.predict_physics(test), true),
        "model": summarize(pred, true, lo, hi),
    }


def _physics(model: CollectiveTimeRegressor) -> dict[str, dict[str, float]]:
    return {
        g: {"efficiency": round(e, 4), "step_latency_us": round(model.step_latency_us_[g], 3)}
        for g, e in model.efficiency_.items()
    }


def leave_one_gpu_out(df: pd.DataFrame, coverage: float) -> dict:
    out = {}
    for gpu in sorted(df["gpu"].unique()):
        test = df[df["gpu"] == gpu]
        train = df[df["gpu"] != gpu]
        model = CollectiveTimeRegressor(n_jobs=1).fit(train, train["measured_ms"])
        out[gpu] = {
            "tables": sorted(test["table"].unique()),
            "ops": sorted(test["op"].unique()),
            "metrics": _score(test, model, coverage),
            "physics": _physics(model),
            "calibration": model.calibration_,
        }
    return out


def small_to_large(df: pd.DataFrame, coverage: float, max_train_ranks: int = 4) -> dict:
    train = df[df["n_ranks"] <= max_train_ranks]
    test = df[df["n_ranks"] > max_train_ranks]
    model = CollectiveTimeRegressor(n_jobs=1).fit(train, train["measured_ms"])
    per_gpu = {gpu: _score(part, model, coverage) for gpu, part in test.groupby("gpu")}
    return {
        "train": f"n_ranks <= {max_train_ranks} ({len(train)} rows)",
        "test": f"n_ranks > {max_train_ranks} ({len(test)} rows)",
        "metrics": _score(test, model, coverage),
        "per_gpu": per_gpu,
        "physics": _physics(model),
    }


def _mean_over_gpus(logo: dict) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for pred in ("alpha_beta_catalog", "alpha_beta_fitted", "model"):
        rows = [v["metrics"][pred] for v in logo.values()]
        out[pred] = {k: float(np.mean([r[k] for r in rows])) for k in rows[0] if k != "n"}
    return out


def _fmt(m: dict[str, float], key: str, pct: bool = False) -> str:
    if key not in m:
        return "-"
    return f"{100 * m[key]:.0f}%" if pct else f"{m[key]:.1f}"


def to_markdown(result: dict) -> str:
    lines = [
        "# Collective model: leave-one-GPU-out and train-small/test-large",
        "",
        f"Data: {', '.join(FILES)} ({result['rows']} rows). Coverage target {result['coverage']:.0%}.",
        "APE columns in percent; cov = interval coverage, width = mean (hi-lo)/pred.",
        "",
        "## Leave-one-GPU-out",
        "",
        "| held-out GPU | rows | tables | predictor | MAPE | median APE | p90 APE | cov | width |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for gpu, v in result["leave_one_gpu_out"].items():
        for pred, m in v["metrics"].items():
            lines.append(
                f"| {gpu} | {int(m['n'])} | {'+'.join(v['tables'])} | {pred} | {_fmt(m, 'mape')} | "
                f"{_fmt(m, 'median_ape')} | {_fmt(m, 'p90_ape')} | {_fmt(m, 'coverage', True)} | "
                f"{_fmt(m, 'rel_width')} |"
            )
    for pred, m in result["leave_one_gpu_out_mean"].items():
        lines.append(
            f"| mean over GPUs | | | {pred} | {_fmt(m, 'mape')} | {_fmt(m, 'median_ape')} | {_fmt(m, 'p90_ape')} | "
            f"{_fmt(m, 'coverage', True)} | {_fmt(m, 'rel_width')} |"
        )
    s2l = result["small_to_large"]
    lines += [
        "",
        f"## Train-small/test-large (train {s2l['train']}, test {s2l['test']})",
        "",
        "| test GPU | rows | predictor | MAPE | median APE | p90 APE | cov | width |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for gpu, metrics in [("all", s2l["metrics"]), *s2l["per_gpu"].items()]:
        for pred, m in metrics.items():
            lines.append(
                f"| {gpu} | {int(m['n'])} | {pred} | {_fmt(m, 'mape')} | {_fmt(m, 'median_ape')} | "
                f"{_fmt(m, 'p90_ape')} | {_fmt(m, 'coverage', True)} | {_fmt(m, 'rel_width')} |"
            )
    lines += ["", "## Fitted physics (model trained on all rows)", "", "| link group | efficiency | step latency us |",
              "|---|---:|---:|"]  # fmt: skip
    for g, v in result["physics_all_rows"].items():
        lines.append(f"| {g} | {v['efficiency']:.3f} | {v['step_latency_us']:.1f} |")
    lines += ["", f"Runtime {result['seconds']:.0f} s.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--coverage", type=float, default=0.9)
    args = parser.parse_args()
    start = time.perf_counter()
    df = load(args.data)
    logo = leave_one_gpu_out(df, args.coverage)
    full = CollectiveTimeRegressor(n_jobs=1).fit(df, df["measured_ms"])
    result = {
        "rows": len(df),
        "rows_per_gpu_table": {f"{g}|{t}": int(n) for (g, t), n in df.groupby(["gpu", "table"]).size().items()},
        "coverage": args.coverage,
        "leave_one_gpu_out": logo,
        "leave_one_gpu_out_mean": _mean_over_gpus(logo),
        "small_to_large": small_to_large(df, args.coverage),
        "physics_all_rows": _physics(full),
    }
    result["seconds"] = time.perf_counter() - start
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "collective_eval.json").write_text(json.dumps(result, indent=2) + "\n")
    (OUT / "collective_eval.md").write_text(to_markdown(result))
    print(to_markdown(result))


if __name__ == "__main__":
    main()
