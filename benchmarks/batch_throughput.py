"""Batch prediction throughput and peak memory: configs per second through ``perfcast predict steps``.

Builds ``--n`` run-table rows, writes them as CSV, and times the streaming batch path
(:func:`perfcast.serve.stream_predict.stream_predict`) once per predictor, each in a fresh
process so its peak resident memory is its own. Reports the median of ``--repeats`` runs
of configs per second, the peak RSS, and how many rows are distinct configs.

Sweeps (``--sweep``):

* ``cycled``: every valid layout of a few presets on one GPU type and cluster size each
  (:data:`SWEEP`, about 19k layouts), cycled to ``n`` rows: mostly repeated rows;
* ``distinct``: ``n`` distinct rows drawn at random (seeded) from every valid layout of
  :data:`DISTINCT_MODELS` x :data:`DISTINCT_GPUS` x :data:`DISTINCT_NUM_GPUS` x
  :data:`DISTINCT_GLOBAL_BATCHES` (about 1.4M configs), kept in sweep order
  (``--order sweep``) or shuffled (``--order shuffled``, the hardest case: neighbouring
  rows share the least).

Writes ``benchmarks/results/<name>.json`` and ``.md``.

Usage: .venv/bin/python benchmarks/batch_throughput.py [--n 5000] [--repeats 3] [--sweep cycled|distinct]
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
PREDICTORS = ("analytic", "composed", "default")
SWEEP = (("llama2-7b", "h100-sxm5-80gb", 64, 512), ("llama3-70b", "h100-sxm5-80gb", 256, 1024),
         ("gpt3-13b", "a100-sxm4-80gb", 64, 512), ("mixtral-8x7b", "h100-sxm5-80gb", 64, 512))  # fmt: skip


DISTINCT_MODELS = ("llama2-7b", "llama3-8b", "qwen2.5-7b", "gpt3-6.7b", "gpt3-13b", "llama2-13b", "llama3-70b",
                   "mixtral-8x7b")  # fmt: skip
DISTINCT_GPUS = ("h100-sxm5-80gb", "a100-sxm4-80gb", "h200-sxm-141gb", "b200-hgx")
DISTINCT_NUM_GPUS = (32, 64, 128, 256)
DISTINCT_GLOBAL_BATCHES = (256, 512, 1024)


def _layout_rows(sweep: list[tuple[str, str, int, int]]) -> pd.DataFrame:
    """Every valid layout of each (model, gpu, num_gpus, global_batch), one row each, in sweep order."""
    from perfcast.features.hardware import ClusterSpec
    from perfcast.features.layouts import enumerate_layouts
    from perfcast.features.model import TransformerSpec

    rows = []
    for model, gpu, num_gpus, batch in sweep:
        spec, cluster = TransformerSpec.load(model), ClusterSpec.build(gpu, num_gpus)
        for p in enumerate_layouts(spec, cluster, batch):
            rows.append({"model": model, "gpu": gpu, "num_gpus": num_gpus, "tp": p.tp, "pp": p.pp, "dp": p.dp,
                         "cp": p.cp, "ep": p.ep, "micro_batch": p.micro_batch, "global_batch": batch, "vpp": p.vpp,
                         "sequence_parallel": p.sequence_parallel, "zero_stage": p.zero_stage,
                         "recompute": p.recompute.value})  # fmt: skip
    return pd.DataFrame(rows)


def sweep_rows(n: int, sweep: str = "cycled", order: str = "sweep", seed: int = 0) -> pd.DataFrame:
    """``n`` run rows of the ``cycled`` or ``distinct`` sweep (see the module docstring)."""
    if sweep == "cycled":
        table = _layout_rows(list(SWEEP))
        return table.iloc[[i % len(table) for i in range(n)]].reset_index(drop=True)
    grid = itertools.product(DISTINCT_MODELS, DISTINCT_GPUS, DISTINCT_NUM_GPUS, DISTINCT_GLOBAL_BATCHES)
    table = _layout_rows(list(grid))
    if n > len(table):
        raise SystemExit(f"--n {n} exceeds the {len(table)} distinct configs of the distinct sweep")
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(table), size=n, replace=False)
    picked = rng.permutation(picked) if order == "shuffled" else np.sort(picked)
    return table.iloc[picked].reset_index(drop=True)


def run_one(predictor: str, source: str) -> dict:
    """Time one streaming prediction in this process; peak RSS in MiB."""
    import warnings

    from perfcast.serve.predictors import load_step_predictor
    from perfcast.serve.stream_predict import stream_predict

    warnings.simplefilter("ignore")
    loaded = load_step_predictor(None if predictor == "default" else predictor)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start, cpu_start = time.perf_counter(), usage.ru_utime + usage.ru_stime
    with tempfile.TemporaryDirectory() as tmp:
        result = stream_predict(source, Path(tmp) / "out.csv", "steps", loaded)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = usage.ru_utime + usage.ru_stime - cpu_start
    return {"predictor": loaded.name, "rows": result.rows, "seconds": seconds, "cpu_seconds": cpu_s,
            "peak_rss_mib": _peak_rss_mib()}  # fmt: skip


def _peak_rss_mib() -> float:
    """This process's peak resident memory, MiB: ``VmHWM`` where Linux has it (``ru_maxrss`` of a
    child also counts the parent's memory at fork time)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--predictors", default=",".join(PREDICTORS), help="Comma list of: " + ", ".join(PREDICTORS))
    parser.add_argument("--name", default="batch_throughput", help="Result file stem under benchmarks/results.")
    parser.add_argument("--sweep", choices=("cycled", "distinct"), default="cycled", help="Which rows (see above).")
    parser.add_argument("--order", choices=("sweep", "shuffled"), default="sweep", help="Row order, distinct sweep.")
    parser.add_argument("--child", nargs=2, metavar=("PREDICTOR", "SOURCE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(*args.child)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "sweep.csv"
        table = sweep_rows(args.n, args.sweep, args.order)
        unique = len(table.drop_duplicates())
        table.to_csv(source, index=False)
        del table
        results = []
        for predictor in [p.strip() for p in args.predictors.split(",") if p.strip()]:
            runs = []
            for _ in range(args.repeats):
                cmd = [sys.executable, __file__, "--child", predictor, str(source)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs.append(json.loads(out.strip().splitlines()[-1]))
            rates = [r["rows"] / r["seconds"] for r in runs]
            cpu_rates = [r["rows"] / r["cpu_seconds"] for r in runs]
            results.append({"predictor": runs[0]["predictor"], "rows": args.n, "unique_rows": unique,
                            "configs_per_s_median": statistics.median(rates), "configs_per_s_all": rates,
                            "configs_per_cpu_s_median": statistics.median(cpu_rates),
                            "peak_rss_mib_max": max(r["peak_rss_mib"] for r in runs)})  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [
        "# Batch step prediction throughput",
        "",
        f"Command: `OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/batch_throughput.py --n {args.n} "
        f"--repeats {args.repeats} --predictors {args.predictors} --sweep {args.sweep} --order {args.order} "
        f"--name {args.name}` (streaming CSV in and out, one process per run, 2 cores shared with other work). "
        "Median of the runs; peak RSS (the child's own VmHWM) is the largest. Configs per CPU-second "
        "(user + system time of the predicting process) is steadier than wall time when other work shares the cores.",
        "",
        "| predictor | sweep | rows | distinct rows | configs/s (median) | configs/CPU-s (median) | peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    sweep = args.sweep if args.sweep == "cycled" else f"distinct, {args.order} order"
    for r in results:
        lines.append(f"| {r['predictor']} | {sweep} | {r['rows']} | {r['unique_rows']} | "
                     f"{r['configs_per_s_median']:.0f} | {r['configs_per_cpu_s_median']:.0f} | "
                     f"{r['peak_rss_mib_max']:.0f} |")  # fmt: skip
    (OUT / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
