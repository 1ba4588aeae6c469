"""Batch prediction throughput and peak memory: configs per second through ``perfcast predict steps``.

Builds a sweep of ``--n`` run-table rows (every valid layout of a few presets on a few
GPU types and cluster sizes, cycled to ``n`` rows), writes it as CSV, and times the
streaming batch path (:func:`perfcast.serve.stream_predict.stream_predict`) once per
predictor, each in a fresh process so its peak resident memory is its own. Reports the
median of ``--repeats`` runs of configs per second, and the peak RSS.

Writes ``benchmarks/results/batch_throughput.json`` and ``.md``.

Usage: .venv/bin/python benchmarks/batch_throughput.py [--n 5000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
PREDICTORS = ("analytic", "composed", "default")
SWEEP = (("llama2-7b", "h100-sxm5-80gb", 64, 512), ("llama3-70b", "h100-sxm5-80gb", 256, 1024),
         ("gpt3-13b", "a100-sxm4-80gb", 64, 512), ("mixtral-8x7b", "h100-sxm5-80gb", 64, 512))  # fmt: skip


def sweep_rows(n: int) -> pd.DataFrame:
    """``n`` run rows: the layouts of :data:`SWEEP`, cycled."""
    from perfcast.features.hardware import ClusterSpec
    from perfcast.features.layouts import enumerate_layouts
    from perfcast.features.model import ModelSpec

    rows = []
    for model, gpu, num_gpus, batch in SWEEP:
        spec, cluster = ModelSpec.load(model), ClusterSpec.build(gpu, num_gpus)
        for p in enumerate_layouts(spec, cluster, batch):
            rows.append({"model": model, "gpu": gpu, "num_gpus": num_gpus, "tp": p.tp, "pp": p.pp, "dp": p.dp,
                         "cp": p.cp, "ep": p.ep, "micro_batch": p.micro_batch, "global_batch": batch, "vpp": p.vpp,
                         "sequence_parallel": p.sequence_parallel, "zero_stage": p.zero_stage,
                         "recompute": p.recompute.value})  # fmt: skip
    table = pd.DataFrame(rows)
    return table.iloc[[i % len(table) for i in range(n)]].reset_index(drop=True)


def run_one(predictor: str, source: str) -> dict:
    """Time one streaming prediction in this process; peak RSS in MiB."""
    import warnings

    from perfcast.serve.predictors import load_step_predictor
    from perfcast.serve.stream_predict import stream_predict

    warnings.simplefilter("ignore")
    loaded = load_step_predictor(None if predictor == "default" else predictor)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = stream_predict(source, Path(tmp) / "out.csv", "steps", loaded)
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"predictor": loaded.name, "rows": result.rows, "seconds": seconds, "peak_rss_mib": peak_mib}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--predictors", default=",".join(PREDICTORS), help="Comma list of: " + ", ".join(PREDICTORS))
    parser.add_argument("--name", default="batch_throughput", help="Result file stem under benchmarks/results.")
    parser.add_argument("--child", nargs=2, metavar=("PREDICTOR", "SOURCE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(*args.child)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "sweep.csv"
        sweep_rows(args.n).to_csv(source, index=False)
        results = []
        for predictor in [p.strip() for p in args.predictors.split(",") if p.strip()]:
            runs = []
            for _ in range(args.repeats):
                cmd = [sys.executable, __file__, "--child", predictor, str(source)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs.append(json.loads(out.strip().splitlines()[-1]))
            rates = [r["rows"] / r["seconds"] for r in runs]
            results.append({"predictor": runs[0]["predictor"], "rows": args.n,
                            "configs_per_s_median": statistics.median(rates), "configs_per_s_all": rates,
                            "peak_rss_mib_max": max(r["peak_rss_mib"] for r in runs)})  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [
        "# Batch step prediction throughput",
        "",
        f"Command: `.venv/bin/python benchmarks/batch_throughput.py --n {args.n} --repeats {args.repeats} "
        f"--predictors {args.predictors} --name {args.name}` "
        "(streaming CSV in and out, one process per run, 2 cores). Median of the runs; peak RSS is the largest.",
        "",
        "| predictor | rows | configs/s (median) | peak RSS MiB |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r['predictor']} | {r['rows']} | {r['configs_per_s_median']:.0f} | "
                     f"{r['peak_rss_mib_max']:.0f} |")  # fmt: skip
    (OUT / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
