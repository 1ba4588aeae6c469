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
  5 ms (the share of the datasheet peak its largest kernels sustain);
* ``floor_us``: the launch floor of the GPU's host, the 5% quantile of the measured times of
  its ops whose roofline time is under 1 µs (as :class:`OpTimeRegressor` estimates its launch
  term; blank with fewer than 50 such ops);
* ``oracle_<family>``: MAPE of the held-out prediction after the best correction of a
  family (:data:`ORACLE_FAMILIES`: a shift; shift and slopes in log FLOPs and log
  intensity; a full quadratic in the op's log dimensions) fitted by median regression of
  the log residual on :data:`ORACLE_FIT_OPS` of the GPU's own ops and scored on all of
  them: about the best a correction of that form reaches when its parameters are known.
  Twenty measured ops estimate a few parameters at most, so the few-shot error at k = 20
  stays near these figures or above them.

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
from sklearn.linear_model import QuantileRegressor
from sklearn.model_selection import KFold
from sklearn.preprocessing import PolynomialFeatures

from perfcast.data.sources import read_source
from perfcast.errors import OutOfDomainWarning
from perfcast.features.hardware import resolve_gpu_name
from perfcast.features.op_features import featurize_ops
from perfcast.models.calibration import gp_inputs, log_dims
from perfcast.models.op_model import LAUNCH_QUANTILE, LAUNCH_ROOFLINE_MS, MIN_LAUNCH_ROWS, OpTimeRegressor
from perfcast.training.metrics import mape

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
SOURCES = {"gemm": ("neusight-gemm", "neusight_kernels_gemm.csv.gz"),
           "vector": ("neusight-vector", "neusight_kernels_vector.csv.gz")}  # fmt: skip
LARGE_OP_MS = 5.0
FOLDS = 5
ORACLE_FIT_OPS = 4000
ORACLE_FAMILIES = ("shift", "trend", "quadratic")


def _oracle_inputs(records: pd.DataFrame, cls: str) -> dict[str, np.ndarray]:
    """Design matrices (no constant column) of each correction family in :data:`ORACLE_FAMILIES`."""
    dims = log_dims(records, cls)
    dims = dims[:, ~np.isnan(dims).any(axis=0)]
    return {
        "shift": np.empty((len(records), 0)),
        "trend": gp_inputs(records, cls, ("log_flops", "log_intensity")),
        "quadratic": PolynomialFeatures(degree=2, include_bias=False).fit_transform(dims),
    }


def _oracle_mape(x: np.ndarray, pred: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> float:
    """MAPE, %, of ``pred`` after the median-regression correction ``exp(b + x . w)`` of its log residual."""
    residual = np.log(y / pred)
    x = np.column_stack([x, np.zeros(len(y))])  # a constant-zero column lets the input-less shift through
    fit = rng.choice(len(y), min(len(y), ORACLE_FIT_OPS), replace=False)
    reg = QuantileRegressor(quantile=0.5, alpha=0.0, solver="highs").fit(x[fit], residual[fit])
    return mape(pred * np.exp(reg.predict(x)), y)


def _model(rows_per_gpu: int) -> OpTimeRegressor:
    return OpTimeRegressor(calibrate=False, max_rows_per_gpu=rows_per_gpu, n_estimators=300)


def _launch_floor_us(y: np.ndarray, roofline: np.ndarray) -> float:
    """µs: the :data:`LAUNCH_QUANTILE` quantile of the times of launch-bound ops (NaN if too few)."""
    tiny = y[roofline < LAUNCH_ROOFLINE_MS]
    return 1e3 * float(np.quantile(tiny, LAUNCH_QUANTILE)) if len(tiny) >= MIN_LAUNCH_ROWS else float("nan")


def _scores(records: pd.DataFrame, cls: str, rows_per_gpu: int, seed: int = 0) -> list[dict[str, float | str]]:
    y = records["measured_ms"].to_numpy(dtype=float)
    oracle_x = _oracle_inputs(records, cls)
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
            "floor_us": _launch_floor_us(y[own], roofline[own]),
            **{f"oracle_{name}": _oracle_mape(oracle_x[name][own], pooled, y[own], rng) for name in ORACLE_FAMILIES},
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
        result[cls] = _scores(records, cls, args.rows_per_gpu)
        frame = pd.DataFrame(result[cls])
        lines = [
            f"## {cls} ({len(records)} rows)\n",
            "| GPU | n | within-GPU CV | held out, 7 GPUs | best single other GPU | median single | "
            "large-op efficiency | floor, µs | oracle shift | oracle trend | oracle quadratic |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *(
                f"| {r.gpu} | {r.n} | {r.within:.1f} | {r.pooled:.1f} | {r.best_single:.1f} ({r.best_single_gpu}) "
                f"| {r.median_single:.1f} | {r.large_op_efficiency:.2f} | {r.floor_us:.1f} | {r.oracle_shift:.1f} "
                f"| {r.oracle_trend:.1f} | {r.oracle_quadratic:.1f} |"
                for r in frame.itertuples()
            ),
            f"| **median** | | {frame.within.median():.1f} | {frame.pooled.median():.1f} | "
            f"{frame.best_single.median():.1f} | {frame.median_single.median():.1f} | | "
            f"{frame.floor_us.median():.1f} | {frame.oracle_shift.median():.1f} | {frame.oracle_trend.median():.1f} "
            f"| {frame.oracle_quadratic.median():.1f} |",
        ]
        parts.append("\n".join(lines))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "op_transfer_limits.json").write_text(json.dumps(result, indent=2) + "\n")
    text = (
        "# Limits of transfer across GPUs (NeuSight fp32 kernels, MAPE %)\n\n"
        "Command: `OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/op_transfer_limits.py`\n\n"
        f"Columns: {FOLDS}-fold CV within the GPU; the GPU held out with the 7 others in training; one "
        f"other GPU alone in training (best, and median over the 7); median roofline/measured of ops over "
        f"{LARGE_OP_MS:g} ms; the host's launch floor (the {100 * LAUNCH_QUANTILE:g}% quantile of the times of "
        f"ops with a roofline under {1e3 * LAUNCH_ROOFLINE_MS:g} µs); the held-out MAPE after the best "
        f"correction of each family (a shift; shift and slopes in "
        f"log FLOPs and log intensity; a full quadratic in the log dimensions) fitted by median regression on "
        f"{ORACLE_FIT_OPS} of the GPU's own ops and scored on all of them (about the best a correction of "
        f"that form reaches when its parameters are known). `OpTimeRegressor(calibrate=False, "
        f"n_estimators=300)`, at most {args.rows_per_gpu} rows per GPU.\n\n" + "\n\n".join(parts) + "\n"
    )
    (OUT / "op_transfer_limits.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
