"""How much of an unseen GPU's op error is learnable from other GPUs: the limits of transfer.

For every GPU of the public kernel data (NeuSight fp32 GEMM and vector kernels, 8 GPUs)
and op class, it measures with the project's own :class:`OpTimeRegressor` (no interval
fit):

* ``within``: 5-fold cross-validated MAPE with the GPU's own ops in training, a floor set by
  timing noise and the features (what a GPU-specific model reaches);
* ``pooled``: MAPE when the GPU is held out and the model trains on the 7 others (the
  leave-one-GPU-out number of ``op_logo.py``, here without the interval);
* ``best_single`` / ``median_single``: MAPE of a model trained on ONE other GPU's ops, the
  best and the median over the 7 (does some other GPU behave like this one?);
* ``large_op_efficiency``: median roofline / measured time of the GPU's ops that take over
  5 ms (the share of the datasheet peak its largest kernels sustain).

The gap between ``within`` and ``pooled`` is what no descriptor-based model bridges with this
data when the best single GPU is no closer: each architecture picks its own kernels for the
same shapes.

Usage: .venv/bin/python benchmarks/op_transfer_limits.py [--data DIR] [--rows-per-gpu N]
Writes ``benchmarks/results/op_transfer_limits.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import KFold

from perfcast.data.sources import read_source
from perfcast.errors import OutOfDomainWarning
from perfcast.features.hardware import resolve_gpu_name
from perfcast.features.op_features import featurize_ops
from perfcast.models.op_model import OpTimeRegressor
from perfcast.training.metrics import mape

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
SOURCES = {"gemm": ("neusight-gemm", "neusight_kernels_gemm.csv.gz"),
           "vector": ("neusight-vector", "neusight_kernels_vector.csv.gz")}  # fmt: skip
LARGE_OP_MS = 5.0
FOLDS = 5


def _model(rows_per_gpu: int) -> OpTimeRegressor:
    return OpTimeRegressor(calibrate=False, max_rows_per_gpu=rows_per_gpu, n_estimators=300)


def _scores(records: pd.DataFrame, rows_per_gpu: int, seed: int = 0) -> list[dict[str, float | str]]:
    y = records["measured_ms"].to_numpy(dtype=float)
    gpus = records["gpu"].to_numpy()
    roofline = featurize_ops(records)["roofline_ms"].to_numpy()
    rng = np.random.default_rng(seed)
    rows = []
    distinct = sorted(pd.unique(gpus))
    experts = {}
    for gpu in distinct:
        own = np.flatnonzero(gpus == gpu)
        sample = own if len(own) <= rows_per_gpu else np.sort(rng.choice(own, rows_per_gpu, replace=False))
        experts[gpu] = _model(rows_per_gpu).fit(records.iloc[sample], y[sample])
    for gpu in distinct:
        own = np.flatnonzero(gpus == gpu)
        within = np.empty(len(own))
        for train, test in KFold(FOLDS, shuffle=True, random_state=seed).split(own):
            fitted = _model(rows_per_gpu).fit(records.iloc[own[train]], y[own[train]])
            within[test] = fitted.predict(records.iloc[own[test]])
        others = gpus != gpu
        pooled = _model(rows_per_gpu).fit(records[others], y[others]).predict(records.iloc[own])
        single = {h: mape(experts[h].predict(records.iloc[own]), y[own]) for h in distinct if h != gpu}
        best = min(single, key=single.get)
        large = own[y[own] > LARGE_OP_MS]
        rows.append({
            "gpu": gpu,
            "n": len(own),
            "within": mape(within, y[own]),
            "pooled": mape(pooled, y[own]),
            "best_single": single[best],
            "best_single_gpu": best,
            "median_single": float(np.median(list(single.values()))),
            "large_op_efficiency": float(np.median(roofline[large] / y[large])) if len(large) else float("nan"),
        })  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--rows-per-gpu", type=int, default=15_000)
    args = parser.parse_args()
    warnings.simplefilter("ignore", OutOfDomainWarning)  # held-out GPUs lie outside by design

    result: dict[str, list[dict[str, float | str]]] = {}
    parts = []
    for cls, (reader, file) in SOURCES.items():
        records = read_source(args.data / file, reader=reader, resolve_gpu=resolve_gpu_name).records
        result[cls] = _scores(records, args.rows_per_gpu)
        frame = pd.DataFrame(result[cls])
        lines = [
            f"## {cls} ({len(records)} rows)\n",
            "| GPU | n | within-GPU CV | held out, 7 GPUs | best single other GPU | median single | "
            "large-op efficiency |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *(
                f"| {r.gpu} | {r.n} | {r.within:.1f} | {r.pooled:.1f} | {r.best_single:.1f} ({r.best_single_gpu}) "
                f"| {r.median_single:.1f} | {r.large_op_efficiency:.2f} |"
                for r in frame.itertuples()
            ),
            f"| **median** | | {frame.within.median():.1f} | {frame.pooled.median():.1f} | "
            f"{frame.best_single.median():.1f} | {frame.median_single.median():.1f} | |",
        ]
        parts.append("\n".join(lines))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "op_transfer_limits.json").write_text(json.dumps(result, indent=2) + "\n")
    text = (
        "# Limits of transfer across GPUs (NeuSight fp32 kernels, MAPE %)\n\n"
        "Command: `OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/op_transfer_limits.py`\n\n"
        f"Columns: {FOLDS}-fold CV within the GPU; the GPU held out with the 7 others in training; one "
        f"other GPU alone in training (best, and median over the 7); median roofline/measured of ops over "
        f"{LARGE_OP_MS:g} ms. `OpTimeRegressor(calibrate=False, n_estimators=300)`, at most "
        f"{args.rows_per_gpu} rows per GPU.\n\n" + "\n\n".join(parts) + "\n"
    )
    (OUT / "op_transfer_limits.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
