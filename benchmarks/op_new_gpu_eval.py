"""How the op predictor does on a GPU generation it never saw: perfcast's own H200 measurements.

Trains the op model (and both baselines) on the public kernel tables in ``../shared/data``
— the sources of the shipped default predictor: NeuSight fp32 GEMM and vector kernels on
8 GPUs (Pascal to Ampere, CDNA), DeepBench GEMMs and Vidur's fp16 GEMMs, none of them
Hopper — then predicts every op of a perfcast dataset measured on a new GPU (by default
``data/h200-sxm-141gb``, measured by ``perfcast profile`` on an H200) from its catalog
entry alone. Reports per evaluation class (GEMMs per dtype, vector ops, attention) MAPE,
median and p90 APE of the model beside the roofline and the efficiency baseline, the
coverage and relative width of the 90% interval, and the few-shot curve (k of the new
GPU's ops measured, the rest predicted after the correction ``perfcast calibrate`` fits).

Classes the training data has no example of (attention: the public tables hold none) are
answered by the analytic roofline, as ``perfcast predict ops`` does, and shown so.

Writes ``benchmarks/results/<name>.{json,md}`` (default ``op_new_gpu_h200``).

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/op_new_gpu_eval.py
           [--data ../shared/data] [--target data/h200-sxm-141gb] [--max-rows-per-gpu 20000]
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
from perfcast.models.baselines import EfficiencyBaseline, RooflineBaseline
from perfcast.models.op_model import OpTimeRegressor
from perfcast.training.evaluate import MODEL, evaluation_class, few_shot_curve
from perfcast.training.metrics import summarize

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
FEW_SHOT_KS = (0, 5, 20, 100, 700)
TRAIN_FILES = ("neusight_kernels_gemm.csv.gz", "neusight_kernels_vector.csv.gz", "deepbench_gemm.csv")
VIDUR_FILE = "vidur_llm_layer_ops.csv.gz"
GEMM_OPS = ("matmul", "linear", "bmm")


def training_records(data: Path, max_rows_per_gpu: int, seed: int = 0) -> pd.DataFrame:
    """The default predictor's training rows (Vidur: GEMMs only), at most ``max_rows_per_gpu`` per GPU."""
    frames = [read_source(data / name, resolve_gpu=resolve_gpu_name).records for name in TRAIN_FILES]
    vidur = read_source(data / VIDUR_FILE, resolve_gpu=resolve_gpu_name).records
    frames.append(vidur[vidur["op"].isin(GEMM_OPS)])
    records = pd.concat(frames, ignore_index=True)
    records = records[featurize_ops(records)["op_class"].to_numpy() != "collective"]
    shuffled = records.sample(frac=1.0, random_state=seed)
    return shuffled[shuffled.groupby("gpu").cumcount() < max_rows_per_gpu].reset_index(drop=True)


def predict_target(model: OpTimeRegressor, train: pd.DataFrame, target: pd.DataFrame) -> pd.DataFrame:
    """Per-row predictions on ``target``: model (and 90% interval), roofline, efficiency baseline."""
    feats = featurize_ops(target)
    classes = feats["op_class"].astype(str)
    out = pd.DataFrame(
        {"gpu": target["gpu"].astype(str), "eval_class": evaluation_class(target, classes).to_numpy(),
         "measured_ms": target["measured_ms"].to_numpy(dtype=float), "learned": classes.isin(list(model.boosters_))},
        index=target.index,
    )  # fmt: skip
    y_train = train["measured_ms"].to_numpy(dtype=float)
    out["roofline"] = RooflineBaseline().fit(train).predict(target)
    out["efficiency"] = EfficiencyBaseline().fit(train, y_train).predict(target)
    out[MODEL], out[f"{MODEL}_lo"], out[f"{MODEL}_hi"] = out["roofline"], np.nan, np.nan
    learned = out["learned"].to_numpy()
    with warnings.catch_warnings():  # a new GPU is out of domain by construction
        warnings.simplefilter("ignore")
        pred, interval = model.predict_with_interval(target.loc[learned], coverage=0.9)
    out.loc[learned, MODEL] = pred
    out.loc[learned, f"{MODEL}_lo"], out.loc[learned, f"{MODEL}_hi"] = interval[:, 0], interval[:, 1]
    return out


def metrics_table(pred: pd.DataFrame) -> pd.DataFrame:
    """One row per evaluation class: model, roofline and efficiency metrics."""
    rows = []
    for klass, block in pred.groupby("eval_class"):
        true = block["measured_ms"].to_numpy()
        learned = bool(block["learned"].all())
        m = summarize(block[MODEL].to_numpy(), true,
                      block[f"{MODEL}_lo"].to_numpy() if learned else None,
                      block[f"{MODEL}_hi"].to_numpy() if learned else None)  # fmt: skip
        rows.append({
            "eval_class": klass, "n": int(m["n"]), "learned": learned,
            "model_mape": m["mape"], "model_median_ape": m["median_ape"], "model_p90": m["p90_ape"],
            "coverage": m.get("coverage", np.nan), "rel_width": m.get("rel_width", np.nan),
            **{f"{b}_{k}": summarize(block[b].to_numpy(), true)[s]
               for b in ("roofline", "efficiency") for k, s in (("mape", "mape"), ("p90", "p90_ape"))},
        })  # fmt: skip
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, few: pd.DataFrame, meta: dict) -> str:
    """The result as Markdown."""
    lines = [
        f"# Op predictor on a GPU generation it never saw: {meta['target_gpu']}",
        "",
        f"Command: `OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/op_new_gpu_eval.py "
        f"--target {meta['target']} --max-rows-per-gpu {meta['max_rows_per_gpu']}`",
        "",
        f"Trained on {meta['train_rows']} rows of the public kernel tables ({', '.join(meta['train_gpus'])}; "
        f"fit {meta['fit_s']:.1f} s on 2 cores), tested on {meta['target_rows']} rows perfcast measured on the "
        "new GPU (`data/README.md`). The training data has no bf16, fp8 or attention rows and no Hopper GPU: "
        "bf16/fp8 GEMMs are predicted through the dtype's datasheet peak; attention (no learned model) gets the "
        "roofline, marked `analytic`.",
        "",
        "| class | n | model | MAPE | median APE | p90 APE | roofline MAPE | roofline p90 | efficiency MAPE "
        "| coverage | rel. width |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for _, r in table.iterrows():
        cov = "" if np.isnan(r["coverage"]) else f"{100 * r['coverage']:.1f}"
        width = "" if np.isnan(r["rel_width"]) else f"{r['rel_width']:.2f}"
        lines.append(
            f"| {r['eval_class']} | {r['n']} | {'learned' if r['learned'] else 'analytic'} | {r['model_mape']:.1f} "
            f"| {r['model_median_ape']:.1f} | {r['model_p90']:.1f} | {r['roofline_mape']:.1f} "
            f"| {r['roofline_p90']:.1f} | {r['efficiency_mape']:.1f} | {cov} | {width} |"
        )
    if len(few):
        wide = few.pivot_table(index="eval_class", columns="k", values="mape")
        cover = few.pivot_table(index="eval_class", columns="k", values="coverage") * 100
        lines += ["", "Few-shot: MAPE on the other ops, and coverage of the corrected 90% interval, after a correction "
                  "fitted on k measured ops of the new GPU (spread over the shapes, median of 5 draws; a one-minute "
                  "`perfcast calibrate` measures about 700 ops in all, two thirds of them GEMMs):", "",
                  "| class | " + " | ".join(f"k={k}" for k in wide.columns) + " |",
                  "|---|" + "---:|" * len(wide.columns)]  # fmt: skip
        for label, frame in (("MAPE", wide), ("coverage", cover)):
            for klass, row in frame.iterrows():
                cells = " | ".join("" if np.isnan(v) else f"{v:.1f}" for v in row)
                lines.append(f"| {klass} {label} | {cells} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--target", type=Path, default=Path("data/h200-sxm-141gb"))
    parser.add_argument("--max-rows-per-gpu", type=int, default=20000)
    parser.add_argument("--name", default="op_new_gpu_h200", help="Result file stem under benchmarks/results.")
    args = parser.parse_args()

    train = training_records(args.data, args.max_rows_per_gpu)
    target = load_dataset(ROOT / args.target, resolve_gpu=resolve_gpu_name).ops.reset_index(drop=True)
    start = time.perf_counter()
    model = OpTimeRegressor().fit(train, train["measured_ms"].to_numpy(dtype=float))
    fit_s = time.perf_counter() - start
    pred = predict_target(model, train, target)
    table = metrics_table(pred)
    learned = pred[pred["learned"]]
    few = few_shot_curve(learned, target.loc[learned.index], ks=FEW_SHOT_KS) if len(learned) else pd.DataFrame()
    meta = {
        "target": str(args.target), "target_gpu": str(target["gpu"].iloc[0]), "target_rows": len(target),
        "train_rows": len(train), "train_gpus": sorted(train["gpu"].astype(str).unique()),
        "max_rows_per_gpu": args.max_rows_per_gpu, "fit_s": fit_s,
    }  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    result = {**meta, "per_class": table.to_dict("records"), "few_shot": few.to_dict("records")}
    (OUT / f"{args.name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    text = markdown(table, few, meta)
    (OUT / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
