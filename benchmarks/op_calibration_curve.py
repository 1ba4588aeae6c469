"""The op error on a held-out GPU after the correction ``perfcast calibrate`` fits, per class and k.

For each held-out GPU, the op model (:class:`~perfcast.models.op_model.OpTimeRegressor`) is
trained WITHOUT that GPU on the default predictor's sources (NeuSight fp32 GEMM and vector
kernels, DeepBench GEMMs, Vidur's fp16 GEMMs and perfcast's own H200 measurements in
``data/h200-sxm-141gb``; at most ``--max-rows-per-gpu`` rows per GPU), as one fold of the
leave-one-GPU-out evaluation (``perfcast.training.evaluate.evaluate_logo``) does. It then
predicts every measured op of the held-out GPU (all its rows in those sources, plus Vidur's
vector ops, which the default predictor does not train on), draws k of them as the
"measured" ops of a calibration, fits the correction exactly as ``perfcast calibrate`` does
(one :func:`~perfcast.models.calibration.fit_correction` call over all drawn ops, then
:meth:`~perfcast.models.calibration.GpuCorrection.correct` at 90% coverage), and scores the
GPU's other ops per evaluation class (GEMMs by dtype, vector, attention): MAPE, median APE,
p90 APE, coverage of the 90% interval and its mean relative width. Each k > 0 is drawn with
``--seeds`` seeds; the tables show the median over seeds.

Two ways of drawing the k ops (``--designs``):

* ``mix``: the class mix of a calibration sweep, two thirds GEMMs (of any dtype the GPU has)
  and one third vector ops, each drawn at random within its class; no attention op is drawn
  (``perfcast calibrate`` does not measure attention), so attention stays uncorrected;
* ``sweep``: as ``mix``, but the GEMMs (and the vector ops, where the GPU has them in that dtype)
  all of the one dtype a calibration measures (``perfcast calibrate --dtype``, bf16 by default on
  cuda; a GPU whose data has no bf16 GEMM: its most numerous GEMM dtype), so the other dtypes'
  GEMMs are corrected from another dtype's measurements, as after a real calibration;
* ``uniform``: k rows drawn uniformly from all the GPU's ops (the class mix of its data).

``--in-training-folds N`` (default 0: off) adds a reference: the GPU's own training-source
rows scored by N-fold cross-validation with its other rows IN training (with the fold's
other training rows, at most ``--max-rows-per-gpu`` per GPU), no correction: what the pooled
model makes of thousands of the GPU's ops, beside what the per-GPU correction makes of k.

Classes the training data has no example of (attention when H200 is held out) are predicted
by the analytic roofline with no interval, as in ``benchmarks/op_new_gpu_eval.py``.

Writes ``benchmarks/results/<name>.{json,md}`` (default ``op_calibration_curve``).

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/op_calibration_curve.py
           [--gpus a100-sxm4-80gb,a40,...,h200-sxm-141gb] [--ks 0,20,100,700]
           [--seeds 3] [--designs mix,sweep,uniform] [--max-rows-per-gpu 20000] [--n-estimators 400]
           [--in-training-folds 5]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.dataset import load_dataset
from perfcast.data.sources import read_source
from perfcast.features.hardware import resolve_gpu_name
from perfcast.features.op_features import featurize_ops
from perfcast.models.baselines import RooflineBaseline
from perfcast.models.calibration import fit_correction
from perfcast.models.op_model import OpTimeRegressor
from perfcast.training.evaluate import evaluation_class
from perfcast.training.metrics import summarize

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
TRAIN_FILES = ("neusight_kernels_gemm.csv.gz", "neusight_kernels_vector.csv.gz", "deepbench_gemm.csv")
VIDUR_FILE = "vidur_llm_layer_ops.csv.gz"
GEMM_OPS = ("matmul", "linear", "bmm")
DEFAULT_GPUS = "a100-pcie-40gb,a100-sxm4-80gb,a40,mi100,mi210,t4,v100-pcie-32gb,h200-sxm-141gb"
GEMM_SHARE = 2 / 3  # a calibration sweep measures about two thirds GEMMs
METRICS = ("mape", "median_ape", "p90_ape", "coverage", "rel_width")
COVERAGE = 0.9


def load_records(data: Path, h200: Path) -> pd.DataFrame:
    """Every op row of the sources, with ``train`` (a default-predictor source) and ``eval_class``."""
    frames = [read_source(data / name, resolve_gpu=resolve_gpu_name).records.assign(train=True) for name in TRAIN_FILES]
    vidur = read_source(data / VIDUR_FILE, resolve_gpu=resolve_gpu_name).records
    frames.append(vidur.assign(train=vidur["op"].isin(GEMM_OPS).to_numpy()))
    frames.append(load_dataset(h200, resolve_gpu=resolve_gpu_name).ops.assign(train=True))
    records = pd.concat(frames, ignore_index=True)
    op_class = featurize_ops(records)["op_class"]
    records = records[op_class.to_numpy() != "collective"].reset_index(drop=True)
    records["gpu"] = records["gpu"].astype(str)
    records["eval_class"] = evaluation_class(records, featurize_ops(records)["op_class"].astype(str)).to_numpy()
    return records


def training_rows(records: pd.DataFrame, held_out: str, max_rows_per_gpu: int, seed: int = 0) -> pd.DataFrame:
    """The training rows of the fold that holds ``held_out`` out: at most ``max_rows_per_gpu`` per GPU."""
    train = records[records["train"] & (records["gpu"] != held_out)]
    shuffled = train.sample(frac=1.0, random_state=seed)
    return shuffled[shuffled.groupby("gpu").cumcount() < max_rows_per_gpu].reset_index(drop=True)


def predict_held_out(model: OpTimeRegressor, train: pd.DataFrame, target: pd.DataFrame) -> pd.DataFrame:
    """Model prediction and 90% interval of each target row; the roofline (no interval) for unlearned classes."""
    classes = featurize_ops(target)["op_class"].astype(str)
    learned = classes.isin(list(model.boosters_)).to_numpy()
    out = pd.DataFrame({"learned": learned}, index=target.index)
    out["pred"] = RooflineBaseline().fit(train).predict(target)
    out["lo"], out["hi"] = np.nan, np.nan
    if learned.any():
        with warnings.catch_warnings():  # a held-out GPU is out of domain by construction
            warnings.simplefilter("ignore")
            pred, interval = model.predict_with_interval(target.loc[learned], coverage=COVERAGE)
        out.loc[learned, "pred"] = pred
        out.loc[learned, "lo"], out.loc[learned, "hi"] = interval[:, 0], interval[:, 1]
    return out


def sweep_dtype(target: pd.DataFrame) -> str:
    """The dtype a calibration of this GPU measures: bf16 (the cuda default) where its data has bf16
    GEMMs, else its most numerous GEMM dtype."""
    gemm = target[target["eval_class"].str.startswith("gemm")]
    dtypes = gemm["dtype"].astype(str).value_counts()
    return "bf16" if "bf16" in dtypes.index else str(dtypes.index[0])


def draw(target: pd.DataFrame, k: int, design: str, rng: np.random.Generator) -> np.ndarray:
    """Positions of the k rows of ``target`` a calibration measures (see the module docstring)."""
    if design == "uniform":
        return rng.choice(len(target), size=min(k, len(target)), replace=False)
    classes = target["eval_class"].to_numpy()
    is_gemm = pd.Series(classes).str.startswith("gemm").to_numpy(dtype=bool, copy=True)
    is_vector = np.array(classes == "vector")
    if design == "sweep":  # one dtype, as `perfcast calibrate --dtype` measures
        dtype = sweep_dtype(target)
        same = target["dtype"].astype(str).to_numpy() == dtype
        is_gemm &= same
        if (is_vector & same).any():
            is_vector &= same
    gemm, vector = np.flatnonzero(is_gemm), np.flatnonzero(is_vector)
    n_gemm = min(len(gemm), round(k * GEMM_SHARE)) if len(vector) else min(len(gemm), k)
    n_vector = min(len(vector), k - n_gemm)
    return np.concatenate(
        [rng.choice(gemm, size=n_gemm, replace=False), rng.choice(vector, size=n_vector, replace=False)]
    )


def score(block: pd.DataFrame, pred: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> dict[str, float]:
    """Metrics of one class's rows; coverage and width only where every row has an interval."""
    measured = block["measured_ms"].to_numpy(dtype=float)
    has_interval = bool(np.isfinite(lo).all() and np.isfinite(hi).all())
    m = summarize(pred, measured, lo if has_interval else None, hi if has_interval else None)
    return {key: float(m.get(key, np.nan)) for key in ("n", *METRICS)}


def curve(target: pd.DataFrame, base: pd.DataFrame, ks: list[int], seeds: int, design: str) -> list[dict]:
    """Per (class, k, seed): metrics on the GPU's rows not drawn, after the correction from the k drawn."""
    gpu = str(target["gpu"].iloc[0])
    rows = []
    for k in ks:
        for seed in range(seeds if k else 1):
            rng = np.random.default_rng(seed)
            pick = draw(target, k, design, rng) if k else np.array([], dtype=int)
            rest = np.setdiff1d(np.arange(len(target)), pick)
            ops, b = target.iloc[rest], base.iloc[rest]
            pred, lo, hi = (b[c].to_numpy(dtype=float) for c in ("pred", "lo", "hi"))
            drawn = {}
            fit_s = 0.0
            if k:
                start = time.perf_counter()
                measured = target["measured_ms"].to_numpy(dtype=float)
                corr = fit_correction(gpu, target.iloc[pick], measured[pick], base["pred"].to_numpy()[pick])
                pred, lo, hi = corr.correct(ops, pred, lo, hi, coverage=COVERAGE)
                fit_s = time.perf_counter() - start
                drawn = target["eval_class"].iloc[pick].value_counts().to_dict()
            classes = ops["eval_class"].to_numpy()
            for klass in sorted(set(classes)):
                m = classes == klass
                rows.append({
                    "gpu": gpu, "design": design, "eval_class": klass, "k": k, "seed": seed,
                    "k_class": int(drawn.get(klass, 0)), "learned": bool(b["learned"].to_numpy()[m].all()),
                    "fit_apply_s": fit_s, **score(ops[m], pred[m], lo[m], hi[m]),
                })  # fmt: skip
    return rows


def in_training(records: pd.DataFrame, gpu: str, folds: int, max_rows_per_gpu: int, n_estimators: int) -> list[dict]:
    """Per class: metrics of ``gpu``'s training-source rows predicted by ``folds``-fold models that train on
    its other rows and the other GPUs' (no interval, no correction)."""
    own = records[records["train"] & (records["gpu"] == gpu)].reset_index(drop=True)
    others = training_rows(records, gpu, max_rows_per_gpu)
    fold_of = np.random.default_rng(0).permutation(len(own)) % folds
    pred = np.full(len(own), np.nan)
    for f in range(folds):
        known = own[fold_of != f]
        known = known.sample(n=min(len(known), max_rows_per_gpu), random_state=f)
        train = pd.concat([others, known], ignore_index=True)
        model = OpTimeRegressor(n_estimators=n_estimators, calibrate=False)
        model.fit(train, train["measured_ms"].to_numpy(dtype=float))
        learned = featurize_ops(own[fold_of == f])["op_class"].astype(str).isin(list(model.boosters_)).to_numpy()
        rows = np.flatnonzero(fold_of == f)[learned]
        pred[rows] = model.predict(own.iloc[rows])
    out, none = [], np.full(len(own), np.nan)  # no interval
    for klass in sorted(own["eval_class"].unique()):
        m = (own["eval_class"] == klass).to_numpy() & np.isfinite(pred)
        if m.any():
            out.append({"gpu": gpu, "eval_class": klass, "folds": folds, **score(own[m], pred[m], none[m], none[m])})
    return out


def _finite(value: object) -> object:
    """``value`` with every non-finite float (a class with no interval) as ``None``, for strict JSON."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def _cell(value: float, scale: float = 1.0, digits: int = 1) -> str:
    return "" if value is None or not np.isfinite(value) else f"{scale * value:.{digits}f}"


def markdown(per_seed: pd.DataFrame, meta: dict) -> str:
    """Tables per design: per GPU x class x k (median over seeds), then the median over GPUs."""
    per = per_seed.groupby(["design", "gpu", "eval_class", "k"]).median(numeric_only=True).reset_index()
    lines = [
        "# Op error on a held-out GPU after the `perfcast calibrate` correction (k measured ops)",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Wall time {meta['wall_s'] / 60:.1f} min on 2 shared cores (model fits {meta['fit_s_total']:.0f} s in all). "
        f"Held-out GPUs: {', '.join(meta['gpus'])}. Each fold trains the op model on the default predictor's "
        f"sources without that GPU ({meta['max_rows_per_gpu']} rows per GPU at most, "
        f"{meta['n_estimators']} trees per class), predicts all the GPU's ops, fits the correction of "
        "`perfcast calibrate` (`fit_correction` over all k drawn ops, one call, then `GpuCorrection.correct`) "
        "and scores the GPU's other ops. Median over "
        f"{meta['seeds']} seeded draws per k; k = 0 is the uncorrected model. `k_cls` is how many of the k drawn "
        "ops fell in the class. Coverage (%) is of the 90% interval; width is the mean (hi - lo) / pred. "
        "Attention (H200 only) has no learned model in its fold: roofline, no interval until a correction "
        "measures 20 attention ops.",
        "",
        "Designs: `mix` draws two thirds GEMMs (any dtype the GPU has) and one third vector ops, no attention, "
        "as a calibration sweep measures them; `sweep` is `mix` with the GEMMs (and vector ops, where the GPU has "
        "them in that dtype) of the one dtype a calibration measures (bf16 where the GPU's data has bf16 GEMMs: "
        "H200; else the GPU's most numerous GEMM dtype), so other dtypes are corrected from it, as after a real "
        "`perfcast calibrate`; `uniform` draws from all the GPU's ops.",
    ]
    for design in meta["designs"]:
        block = per[per["design"] == design]
        summary = block.groupby(["eval_class", "k"])[list(METRICS)].median().reset_index()
        n_gpus = block.groupby(["eval_class", "k"])["gpu"].nunique().reset_index(name="gpus")
        summary = summary.merge(n_gpus, on=["eval_class", "k"])
        lines += [
            "",
            f"## Design `{design}`: median over held-out GPUs",
            "",
            "| class | GPUs | " + " | ".join(f"MAPE k={k}" for k in meta["ks"]) + " | "
            + " | ".join(f"cov. k={k}" for k in meta["ks"]) + " | "
            + " | ".join(f"width k={k}" for k in meta["ks"]) + f" | worst GPU, MAPE k={meta['ks'][-1]} |",
            "|---|---:|" + "---:|" * (3 * len(meta["ks"])) + "---|",
        ]  # fmt: skip
        for klass, rows in summary.groupby("eval_class"):
            by_k = rows.set_index("k")
            cells = [
                _cell(by_k[col].get(k, np.nan), scale, digits)
                for col, scale, digits in (("mape", 1, 1), ("coverage", 100, 1), ("rel_width", 1, 2))
                for k in meta["ks"]
            ]
            last = block[(block["eval_class"] == klass) & (block["k"] == meta["ks"][-1])]
            worst = last.loc[last["mape"].idxmax()] if len(last) else None
            cells.append("" if worst is None else f"{worst['gpu']} {worst['mape']:.1f}")
            lines.append(f"| {klass} | {int(rows['gpus'].max())} | " + " | ".join(cells) + " |")
        lines += [
            "",
            f"### Design `{design}`: per GPU",
            "",
            "| GPU | class | k | k_cls | n scored | MAPE | median APE | p90 APE | coverage | width |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for _, r in block.sort_values(["gpu", "eval_class", "k"]).iterrows():
            lines.append(
                f"| {r['gpu']} | {r['eval_class']}{'' if r['learned'] else ' (roofline)'} | {int(r['k'])} "
                f"| {int(r['k_class'])} | {int(r['n'])} | {_cell(r['mape'])} | {_cell(r['median_ape'])} "
                f"| {_cell(r['p90_ape'])} | {_cell(r['coverage'], 100)} | {_cell(r['rel_width'], digits=2)} |"
            )
    if meta.get("in_training"):
        lines += [
            "",
            f"## Reference: the GPU's own ops in training ({meta['in_training'][0]['folds']}-fold, no correction)",
            "",
            "| GPU | class | n scored | MAPE | median APE | p90 APE |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for r in meta["in_training"]:
            lines.append(f"| {r['gpu']} | {r['eval_class']} | {int(r['n'])} | {_cell(r['mape'])} "
                         f"| {_cell(r['median_ape'])} | {_cell(r['p90_ape'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--h200", type=Path, default=ROOT / "data" / "h200-sxm-141gb")
    parser.add_argument("--gpus", default=DEFAULT_GPUS, help="Held-out GPU ids, comma-separated.")
    parser.add_argument("--ks", default="0,20,100,700")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--designs", default="mix,sweep,uniform")
    parser.add_argument("--max-rows-per-gpu", type=int, default=20000)
    parser.add_argument("--n-estimators", type=int, default=400, help="Trees per class of the op model.")
    parser.add_argument("--name", default="op_calibration_curve", help="Result file stem under benchmarks/results.")
    parser.add_argument("--in-training-folds", type=int, default=0,
                        help="Also score each GPU with its other ops in training, N-fold (0: off).")  # fmt: skip
    args = parser.parse_args()
    started = time.perf_counter()
    ks = [int(k) for k in args.ks.split(",")]
    designs = args.designs.split(",")
    gpus = args.gpus.split(",")

    records = load_records(args.data, args.h200)
    rows, folds, reference = [], [], []
    for gpu in gpus:
        target = records[records["gpu"] == gpu].reset_index(drop=True)
        if target.empty:
            raise SystemExit(f"no rows of {gpu}; GPUs: {', '.join(sorted(records['gpu'].unique()))}")
        train = training_rows(records, gpu, args.max_rows_per_gpu)
        start = time.perf_counter()
        model = OpTimeRegressor(n_estimators=args.n_estimators).fit(train, train["measured_ms"].to_numpy(dtype=float))
        fit_s = time.perf_counter() - start
        base = predict_held_out(model, train, target)
        start = time.perf_counter()
        for design in designs:
            rows += curve(target, base, ks, args.seeds, design)
        folds.append({"gpu": gpu, "train_rows": len(train), "target_rows": len(target), "fit_s": fit_s,
                      "curve_s": time.perf_counter() - start})  # fmt: skip
        print(f"{gpu}: fit {fit_s:.0f} s, curves {folds[-1]['curve_s']:.0f} s", flush=True)
        if args.in_training_folds:
            reference += in_training(records, gpu, args.in_training_folds, args.max_rows_per_gpu, args.n_estimators)

    per_seed = pd.DataFrame(rows)
    command = (
        f"OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/op_calibration_curve.py --gpus {args.gpus} "
        f"--ks {args.ks} --seeds {args.seeds} --designs {args.designs} --max-rows-per-gpu {args.max_rows_per_gpu} "
        f"--n-estimators {args.n_estimators} --name {args.name}"
        + (f" --in-training-folds {args.in_training_folds}" if args.in_training_folds else "")
    )
    meta = {
        "command": command, "wall_s": time.perf_counter() - started, "gpus": gpus, "ks": ks, "seeds": args.seeds,
        "designs": designs, "max_rows_per_gpu": args.max_rows_per_gpu, "n_estimators": args.n_estimators,
        "fit_s_total": sum(f["fit_s"] for f in folds), "folds": folds, "in_training": reference,
    }  # fmt: skip
    per = per_seed.groupby(["design", "gpu", "eval_class", "k"]).median(numeric_only=True).reset_index()
    summary = per.groupby(["design", "eval_class", "k"])[list(METRICS)].median().reset_index()
    OUT.mkdir(parents=True, exist_ok=True)
    result = {
        **meta,
        "summary_median_over_gpus": summary.to_dict("records"),
        "per_gpu_median_over_seeds": per.to_dict("records"),
        "per_seed": per_seed.to_dict("records"),
    }
    text = json.dumps(_finite(result), indent=2, default=str, allow_nan=False)
    (OUT / f"{args.name}.json").write_text(text + "\n")
    text = markdown(per_seed, meta)
    (OUT / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
