"""Leave-one-GPU-out accuracy of the op predictor beside both baselines, and its training time.

Reads the public kernel data in ``../shared/data`` (NeuSight fp32 GEMM and vector kernels
on 8 GPUs; optionally Vidur's fp16 layer ops and DeepBench GEMMs), holds out each GPU in
turn, and writes ``benchmarks/results/<name>.{json,md}`` (``--name``, default ``op_logo``):
per held-out GPU and class, MAPE, median and p90 APE of the model and of the two
baselines, the coverage and relative width of the 90% interval, the medians over GPUs,
and the time to fit on all rows (median of ``--repeats``).

It also writes the few-shot curve: the held-out GPU's MAPE on its other ops after a
correction (:func:`perfcast.models.calibration.fit_correction`: shrunk shift, trend in log
FLOPs and intensity, and the shape-dependent residual model) fitted on k = 5, 20, 100, 700 of its
measured ops, picked two ways: spread over the shapes as ``perfcast calibrate`` sweeps them,
and uniformly at random from the GPU's ops.

``--sources`` may name ``perfcast-h200``, perfcast's own H200 measurements (the dataset folder
``data/h200-sxm-141gb`` of this repository, whatever ``--data`` says: bf16, fp16, fp32 and fp8
GEMMs, vector ops and fused attention, timed with CUDA events around each call), the only
Hopper rows. ``--exclude`` cannot select its rows (their ``source`` has no ``name:`` prefix).

``--classes vector`` keeps only that op class's rows (a faster run for one class);
``--exclude vidur:silu,vidur:embedding`` leaves out one source's rows of some ops;
``--no-timing`` fits the timing-blind model (one launch term for every source's timing
method, the model before ``timing``); ``--repeats 0`` and ``--no-few-shot`` skip the fit
timing and the few-shot curve.

Usage: .venv/bin/python benchmarks/op_logo.py [--data DIR] [--sources neusight-gemm,...,perfcast-h200]
       [--classes vector] [--exclude SOURCE:OP,...] [--no-timing] [--repeats N] [--no-few-shot] [--name NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd

from perfcast.data.dataset import load_dataset
from perfcast.data.sources import get_reader, read_source
from perfcast.features.hardware import resolve_gpu_name
from perfcast.features.op_features import featurize_ops
from perfcast.models.op_model import OpTimeRegressor
from perfcast.training.evaluate import evaluate_logo, evaluation_class, few_shot_curve, markdown_table
from perfcast.training.metrics import summarize

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
FEW_SHOT_DESIGNS = ("spread", "random")
FEW_SHOT_KS = (0, 5, 20, 100, 700)  # a one-minute `perfcast calibrate` measures ~700 ops, 2/3 GEMMs
FILES = {
    "neusight-gemm": "neusight_kernels_gemm.csv.gz",
    "neusight-vector": "neusight_kernels_vector.csv.gz",
    "vidur-ops": "vidur_llm_layer_ops.csv.gz",
    "deepbench-gemm": "deepbench_gemm.csv",
}
OWN_DATASETS = {"perfcast-h200": ROOT / "data" / "h200-sxm-141gb"}  # dataset folders in this repository


def _markdown(mape: pd.DataFrame, coverage: pd.DataFrame) -> str:
    """Two small frames (classes x k) as one Markdown table: MAPE, then coverage in percent."""
    head = "| class | " + " | ".join(f"k={k}" for k in mape.columns) + " |"
    rule = "|---|" + "---:|" * len(mape.columns)
    body = [f"| {idx} MAPE | " + " | ".join(f"{v:.1f}" for v in row) + " |" for idx, row in mape.iterrows()]
    body += [
        f"| {idx} coverage | " + " | ".join(f"{100 * v:.1f}" for v in row) + " |" for idx, row in coverage.iterrows()
    ]
    return "\n".join([head, rule, *body])


def per_op_table(predictions: pd.DataFrame, records: pd.DataFrame) -> pd.DataFrame:
    """The model's metrics per held-out GPU, class and op (``predictions`` of ``evaluate_logo``)."""
    frame = predictions.assign(op=records.loc[predictions.index, "op"].to_numpy())
    rows = []
    for (gpu, klass, op), block in frame.groupby(["gpu", "eval_class", "op"]):
        metrics = summarize(block["model"], block["measured_ms"], block["model_lo"], block["model_hi"])
        rows.append({"gpu": gpu, "eval_class": klass, "op": op, **metrics})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--sources", default="neusight-gemm,neusight-vector")
    parser.add_argument("--repeats", type=int, default=3, help="Fits on all rows to time (0: none).")
    parser.add_argument("--classes", default="", help="Op classes to keep (comma-separated; default all).")
    parser.add_argument("--exclude", default="",
                        help="SOURCE:OP pairs to leave out, comma-separated (vidur:silu: Vidur's silu).")  # fmt: skip
    parser.add_argument("--timing", action=argparse.BooleanOptionalAction, default=True,
                        help="Model the timing method of each row (OpTimeRegressor(timing=...)).")  # fmt: skip
    parser.add_argument("--few-shot", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--name", default="op_logo", help="Result file stem under benchmarks/results.")
    args = parser.parse_args()

    def make_model() -> OpTimeRegressor:
        return OpTimeRegressor(timing=args.timing)

    frames = []
    for name in args.sources.split(","):
        if name in OWN_DATASETS:
            frames.append(load_dataset(OWN_DATASETS[name], resolve_gpu=resolve_gpu_name).ops)
            continue
        get_reader(name)
        frames.append(read_source(args.data / FILES[name], reader=name, resolve_gpu=resolve_gpu_name).records)
    records = pd.concat(frames, ignore_index=True)
    op_class = featurize_ops(records)["op_class"].to_numpy()
    keep = op_class != "collective"
    if args.classes:
        keep &= pd.Series(op_class).isin(args.classes.split(",")).to_numpy()
    for pair in filter(None, args.exclude.split(",")):
        source, op = pair.split(":", 1)
        keep &= ~(records["source"].astype(str).str.startswith(source + ":") & (records["op"] == op)).to_numpy()
    records = records[keep].reset_index(drop=True)
    y = records["measured_ms"].to_numpy(dtype=float)
    classes = evaluation_class(records, featurize_ops(records)["op_class"])

    start = time.perf_counter()
    logo = evaluate_logo(records, y, make_model=make_model, eval_class=classes,
                         progress=lambda gpu: print(f"holding out {gpu}", flush=True))  # fmt: skip
    logo_s = time.perf_counter() - start
    fit_s = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        make_model().fit(records, y)
        fit_s.append(time.perf_counter() - start)

    summary = logo.summary().reset_index()
    designs = FEW_SHOT_DESIGNS if args.few_shot else ()
    few = pd.concat(
        [pd.DataFrame(columns=["eval_class", "k", "mape", "coverage", "design"])]
        + [few_shot_curve(logo.predictions, records, ks=FEW_SHOT_KS, design=d).assign(design=d) for d in designs],
        ignore_index=True,
    )
    few_median = {d: few[few["design"] == d].groupby(["eval_class", "k"])["mape"].median().unstack("k")
                  for d in designs}  # fmt: skip
    few_coverage = {d: few[few["design"] == d].groupby(["eval_class", "k"])["coverage"].median().unstack("k")
                    for d in designs}  # fmt: skip
    result = {
        "sources": args.sources.split(","),
        "classes": args.classes.split(",") if args.classes else "all",
        "timing": args.timing,
        "rows": len(records),
        "gpus": sorted(records["gpu"].unique()),
        "per_gpu": logo.table.to_dict("records"),
        "per_gpu_op": per_op_table(logo.predictions, records).to_dict("records"),
        "median_over_gpus": summary.to_dict("records"),
        "few_shot_per_gpu": few.to_dict("records"),
        "few_shot_median_mape": {
            d: {str(c): {int(k): float(v) for k, v in r.items()} for c, r in frame.iterrows()}
            for d, frame in few_median.items()
        },
        "few_shot_median_coverage": {
            d: {str(c): {int(k): float(v) for k, v in r.items()} for c, r in frame.iterrows()}
            for d, frame in few_coverage.items()
        },
        "fit_all_rows_s_median": statistics.median(fit_s) if fit_s else None,
        "logo_total_s": logo_s,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    command = " ".join(
        [f"--sources {args.sources}", f"--classes {args.classes}" if args.classes else "",
         f"--exclude {args.exclude}" if args.exclude else "",
         "" if args.timing else "--no-timing", f"--repeats {args.repeats}" if args.repeats != 3 else "",
         "" if args.few_shot else "--no-few-shot", f"--name {args.name}"]
    ).split()  # fmt: skip
    text = (
        f"# Op predictor, leave-one-GPU-out ({', '.join(result['sources'])}; {len(records)} rows)\n\n"
        f"Command: `.venv/bin/python benchmarks/op_logo.py {' '.join(command)}`\n\n" + markdown_table(logo)
    )
    if designs:
        text += (
            "\n\nFew-shot correction (median MAPE over held-out GPUs on their other ops, median of 5 draws; k "
            "measured ops of the held-out GPU; shrunk shift, trend in log FLOPs and intensity, Gaussian-process "
            "residual, and boosted residual trees from 100 ops on, `models/calibration.py`), and median coverage "
            "of the corrected 90% interval. k ops spread over the shapes, as `perfcast calibrate` sweeps them:\n\n"
            + _markdown(few_median["spread"], few_coverage["spread"])
            + "\n\nk ops drawn at random from the GPU's ops:\n\n"
            + _markdown(few_median["random"], few_coverage["random"])
        )
    if fit_s:
        text += f"\n\nFit on all rows: {result['fit_all_rows_s_median']:.1f} s (median of {args.repeats}, 2 cores)."
    text += "\n"
    (OUT / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
