"""Leave-one-source-out coverage of the step model's 90% interval: pooled level vs the group-median level.

Issue 14 asks the 90% interval to cover, per source held out, a median between 85% and 95%
over the sources and at least 75% on each. The step model as shipped
(:func:`~perfcast.training.train_steps.fit_step_model`, ``correction_scale`` the default) is
fitted once per held-out source, on the other sources only; its interval is then read at
each of :data:`~perfcast.models.step_model.INTERVAL_LEVELS`: ``pooled`` (the quantile level is the
coverage), ``group_median`` (the level at which the median training source's held-out
residuals are covered at 90%, :meth:`~perfcast.models.step_model.StepTimeRegressor.calibrated_level`)
and ``group_median_in_domain`` (that level for rows inside the training range, the pooled one beyond).
The median prediction is the same for every level (same MAPE); bounds are raised to the MFU-ceiling
floor as ``step_transfer_eval.py``'s ``+bound`` predictors are. Each seed (``--seeds``) refits
every model with that ``random_state`` (booster sampling and calibration folds).

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/step_interval_eval.py [--data DIR] [--seeds 0 1 2 3 4]
Writes ``benchmarks/results/step_interval_eval.md``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.models.composer import StepComposer
from perfcast.models.step_model import INTERVAL_LEVELS
from perfcast.serve.predictors import load_op_predictor
from perfcast.training.defaults import DEFAULT_CORRECTION_SCALE
from perfcast.training.train_steps import build_step_table, fit_step_model, load_runs, predict_rows

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "results" / "step_interval_eval.md"
COVERAGE = 0.9


def evaluate(table, seed: int) -> pd.DataFrame:  # noqa: ANN001
    """One row per (held-out source, interval level): n, coverage, mean relative width, MAPE, level read."""
    source = table.runs["source"].astype(str).to_numpy()
    measured = table.runs["measured_step_ms"].to_numpy(dtype=float)
    rows = []
    for name in sorted(set(source)):
        train, test = source != name, source == name
        model = fit_step_model(table, train, correction_scale=DEFAULT_CORRECTION_SCALE, random_state=seed)
        true = measured[test]
        for level in INTERVAL_LEVELS:
            model.interval_level = level
            pred, lo, hi = predict_rows(model, table, test, coverage=COVERAGE, bound=True)
            covered = (true >= lo) & (true <= hi)
            rows.append({"seed": seed, "source": name, "interval_level": level, "n": int(test.sum()),
                         "level": model.calibrated_level(COVERAGE), "coverage": float(np.mean(covered)),
                         "rel_width": float(np.mean((hi - lo) / pred)),
                         "mape": float(100 * np.mean(np.abs(pred - true) / true))})  # fmt: skip
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    bundle = load_op_predictor(None)
    table = build_step_table(load_runs(args.data), StepComposer(bundle, bundle.collective_model))
    result = pd.concat([evaluate(table, seed) for seed in args.seeds], ignore_index=True)
    summary = result.groupby(["seed", "interval_level"]).agg(
        median_coverage=("coverage", "median"), min_coverage=("coverage", "min"),
        mean_mape=("mape", "mean"), mean_rel_width=("rel_width", "mean"),
    ).reset_index()  # fmt: skip
    wide = result.pivot_table(index=["source", "n"], columns=["interval_level", "seed"], values="coverage")
    width = result.pivot_table(index="source", columns=["interval_level", "seed"], values="rel_width")
    chosen = result[result["interval_level"] == "group_median"]
    levels = chosen.pivot_table(index="source", columns="seed", values="level")

    def table_md(frame: pd.DataFrame, pct: bool) -> str:
        frame = frame.copy()
        frame.columns = [" ".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in frame.columns]
        frame = frame.reset_index()
        head = "| " + " | ".join(frame.columns) + " |\n|" + "---|" * len(frame.columns) + "\n"
        fmt = (lambda v: f"{100 * v:.1f}%") if pct else (lambda v: f"{v:.3f}")  # noqa: E731
        body = "".join("| " + " | ".join(fmt(v) if isinstance(v, float) else str(v) for v in row) + " |\n"
                       for row in frame.itertuples(index=False))  # fmt: skip
        return head + body

    text = "\n".join([
        "# Step interval level (issue 14)\n",
        f"`benchmarks/step_interval_eval.py`; {len(table.runs)} composed runs; leave-one-source-out; seeds "
        f"{args.seeds}; {time.perf_counter() - start:.0f} s. Coverage of the 90% interval per held-out source; "
        "relative width (hi - lo) / pred, mean over runs, then over sources; MAPE in percent (the same for "
        "every level).\n",
        "## Summary\n",
        table_md(summary.set_index(["seed", "interval_level"])[["median_coverage", "min_coverage"]], True),
        table_md(summary.set_index(["seed", "interval_level"])[["mean_mape", "mean_rel_width"]], False),
        "## Coverage per source (interval level, seed)\n",
        table_md(wide, True),
        "## Relative width per source\n",
        table_md(width, False),
        "## Quantile level read under group_median (per held-out source, seed)\n",
        table_md(levels, False),
    ])  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
