"""Error of the analytic step predictor on vTrain's measured Megatron iteration times.

The baseline every learned step model must beat. Reads
``../shared/data/vtrain_megatron_iteration_time.csv`` (1,440 runs of GPT models on 2-8
A100s), predicts each config with ``--model analytic`` and writes
``benchmarks/results/analytic_vtrain.json`` and ``.md``: MAPE, median and p90 APE,
Spearman rank correlation, overall and per GPU count, plus the median ratio
measured/predicted and the prediction throughput (configs/s, median of repeats).

Usage: .venv/bin/python benchmarks/analytic_vtrain.py [--data PATH] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd

from perfcast.data.readers.vtrain import read_vtrain_iterations
from perfcast.serve.batch import predict_steps_table
from perfcast.training.metrics import spearman, summarize

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "vtrain_megatron_iteration_time.csv"
OUT = ROOT / "benchmarks" / "results"


def _metrics(df: pd.DataFrame) -> dict[str, float]:
    pred, true = df["step_ms"].to_numpy(), df["measured_step_ms"].to_numpy()
    out = summarize(pred, true)
    out["spearman"] = spearman(pred, true)
    out["median_ratio_measured_over_pred"] = float((df["measured_step_ms"] / df["step_ms"]).median())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    read = read_vtrain_iterations(args.data)
    runs = read.records
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        pred = predict_steps_table(runs)
        seconds.append(time.perf_counter() - start)
    ok = pred[pred["error"] == ""]
    result = {
        "data": str(args.data.name),
        "rows_loaded": read.n_records,
        "rows_rejected_by_reader": read.n_rejected,
        "rows_predicted": len(ok),
        "rows_invalid_config": int(len(pred) - len(ok)),
        "overall": _metrics(ok),
        "by_num_gpus": {int(k): _metrics(g) for k, g in ok.groupby("num_gpus")},
        "configs_per_s_median": len(runs) / statistics.median(seconds),
        "repeats": args.repeats,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "analytic_vtrain.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Analytic predictor vs vTrain measured Megatron iteration times",
        "",
        f"{result['rows_predicted']} configs ({result['data']}), command: "
        "`.venv/bin/python benchmarks/analytic_vtrain.py`",
        "",
        "| split | n | MAPE % | median APE % | p90 APE % | Spearman | measured/pred (median) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [("all", result["overall"])] + [(f"{k} GPUs", v) for k, v in result["by_num_gpus"].items()]
    for name, m in rows:
        lines.append(
            f"| {name} | {int(m['n'])} | {m['mape']:.1f} | {m['median_ape']:.1f} | {m['p90_ape']:.1f} "
            f"| {m['spearman']:.3f} | {m['median_ratio_measured_over_pred']:.2f} |"
        )
    lines += ["", f"Throughput: {result['configs_per_s_median']:.0f} configs/s (median of {args.repeats})."]
    (OUT / "analytic_vtrain.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
