"""How the reading of torchtitan's runs moves the framework-out and leave-one-source-out splits.

The shipped reading of ``published_llm_training_steps.csv`` (``docs/readers.md``) reads
torchtitan's tensor parallelism as sequence-parallel (its framework default) and its selective
checkpointing as ``op-sac``. Holding Megatron-Core out whole got worse with it. This benchmark
fits the shipped step model (``correction_scale`` as shipped, MFU-ceiling floor) on each split
under variants of the training set and reports MAPE, interval coverage and the median of
predicted over measured:

* ``shipped``: the runs as read;
* ``torchtitan tp not sequence-parallel``: torchtitan rows with ``tp > 1`` state
  ``sequence_parallel = false``;
* ``stand-in boards left out of training``: the runs on boards the catalog lacks (``gpu`` in
  ``defaulted_fields``: torchtitan's Grand Teton H100s) are not trained on (they are still
  scored when their source is held out).

Splits: Megatron-Core held out (framework), torchtitan held out (source).

Writes ``benchmarks/results/step_reading_variants.md`` and ``.json``.

Usage: .venv/bin/python benchmarks/step_reading_variants.py [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.models.composer import StepComposer
from perfcast.serve.predictors import load_op_predictor
from perfcast.training.defaults import DEFAULT_CORRECTION_SCALE
from perfcast.training.train_steps import StepTable, build_step_table, fit_step_model, load_runs, predict_rows

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
OUT = Path(__file__).resolve().parent / "results" / "step_reading_variants"
COVERAGE = 0.9


def not_sequence_parallel(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with torchtitan's tensor-parallel rows stating ``sequence_parallel = false``."""
    out = runs.copy()
    rows = out["source"].eq("published:torchtitan") & (out["tp"] > 1)
    out["sequence_parallel"] = out["sequence_parallel"].astype(object)
    out.loc[rows, "sequence_parallel"] = False
    return out


def stand_in_rows(table: StepTable) -> np.ndarray:
    """Runs read on a catalog part that stands in for their board (``gpu`` in ``defaulted_fields``)."""
    named = table.runs["defaulted_fields"].fillna("").astype(str).str.split(";")
    return named.map(lambda names: "gpu" in names).to_numpy(dtype=bool)


def score(table: StepTable, train: np.ndarray, test: np.ndarray) -> dict[str, float]:
    """MAPE %, coverage % of the 90% interval and median predicted/measured of the shipped step
    model fitted on ``train`` and scored on ``test``."""
    model = fit_step_model(table, train, correction_scale=DEFAULT_CORRECTION_SCALE)
    pred, lo, hi = predict_rows(model, table, test, coverage=COVERAGE)
    true = table.runs["measured_step_ms"].to_numpy(dtype=float)[test]
    return {"n": int(test.sum()), "mape": float(np.mean(np.abs(pred / true - 1)) * 100),
            "coverage": float(np.mean((lo <= true) & (true <= hi)) * 100),
            "median_pred_over_measured": float(np.median(pred / true))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    bundle = load_op_predictor(None)
    composer = StepComposer(bundle, bundle.collective_model)
    runs = load_runs(args.data)
    tables = {
        "shipped": build_step_table(runs, composer),
        "torchtitan tp not sequence-parallel": build_step_table(not_sequence_parallel(runs), composer),
    }
    rows = []
    for variant, table in (*tables.items(), ("stand-in boards left out of training", tables["shipped"])):
        keep = ~stand_in_rows(table) if variant.startswith("stand-in") else np.ones(len(table.runs), dtype=bool)
        framework = table.runs["framework_group"].astype(str).to_numpy()
        source = table.runs["source"].astype(str).to_numpy()
        for split, test in (("Megatron-Core held out", framework == "megatron-core"),
                            ("torchtitan held out", source == "published:torchtitan")):  # fmt: skip
            rows.append({"variant": variant, "split": split, **score(table, ~test & keep, test)})
            print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "# Reading torchtitan's runs: framework-out and source-out splits",
        "",
        f"`.venv/bin/python benchmarks/step_reading_variants.py`; {time.perf_counter() - start:.0f} s. The shipped "
        f"step model (`correction_scale={DEFAULT_CORRECTION_SCALE}`, MFU-ceiling floor) fitted per split; MAPE %, "
        "coverage % of the 90% interval, median predicted / measured.",
        "",
        "| variant | split | runs | MAPE | coverage | median pred / measured |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in frame.itertuples():
        lines.append(f"| {r.variant} | {r.split} | {r.n} | {r.mape:.1f} | {r.coverage:.0f}% | "
                     f"{r.median_pred_over_measured:.2f} |")  # fmt: skip
    OUT.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
