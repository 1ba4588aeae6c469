"""Picture of leave-one-source-out step predictions: measured against predicted, per source.

Reads ``benchmarks/results/step_transfer_eval_loso_runs.csv`` (written by
``benchmarks/step_transfer_eval.py``: every run with its held-out prediction) and draws three
panels on log-log axes, one point per run coloured by its held-out source: the shipped step
model (with its 90% interval as a vertical bar), the composed step alone, and a constant MFU
fitted on the other sources. The diagonal is a perfect prediction, the dashed lines ±25%.
Each panel's title gives the mean over sources of the MAPE.

Usage: .venv/bin/python benchmarks/plot_step_transfer.py [--runs CSV] [--out PNG]
Writes ``benchmarks/results/step_transfer_loso.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.training.defaults import DEFAULT_CORRECTION_SCALE
from perfcast.training.metrics import ape

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "benchmarks" / "results" / "step_transfer_eval_loso_runs.csv"
OUT = ROOT / "benchmarks" / "results" / "step_transfer_loso.png"
PANELS = (
    (f"gbdt(scale={DEFAULT_CORRECTION_SCALE:g})+bound", "shipped step model"),
    ("composed", "composed physics alone"),
    ("mfu_fit", "constant MFU (other sources)"),
)
"""(prediction column prefix in the runs file, panel title)."""


def mean_source_mape(runs: pd.DataFrame, column: str) -> float:
    """Mean over sources of each source's MAPE of ``column`` against the measured step, percent."""
    errors = pd.Series(ape(runs[column], runs["measured_step_ms"]), index=runs.index)
    return float(errors.groupby(runs["source"]).mean().mean())


def plot(runs: pd.DataFrame, out: Path) -> None:
    """Draw the three panels of the module docstring into ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = list(runs["source"].value_counts().index)
    colours = plt.get_cmap("tab10")
    measured = runs["measured_step_ms"].to_numpy(dtype=float)
    lo_all = np.nanmin([runs[f"{p}_ms"].min() for p, _ in PANELS] + [measured.min()])
    hi_all = np.nanmax([runs[f"{p}_ms"].max() for p, _ in PANELS] + [measured.max()])
    span = np.array([lo_all / 1.5, hi_all * 1.5])
    fig, axes = plt.subplots(1, len(PANELS), figsize=(6 * len(PANELS), 6), sharex=True, sharey=True)
    for ax, (prefix, title) in zip(axes, PANELS, strict=True):
        for i, source in enumerate(sources):
            rows = runs[runs["source"] == source]
            pred = rows[f"{prefix}_ms"].to_numpy(dtype=float)
            true = rows["measured_step_ms"].to_numpy(dtype=float)
            colour = colours(i % 10)
            size = 4 if len(rows) > 500 else 14
            ax.scatter(true, pred, s=size, color=colour, alpha=0.6, label=f"{source} ({len(rows)})", linewidths=0)
            if prefix == PANELS[0][0] and f"{prefix}_lo_ms" in rows:
                lo, hi = rows[f"{prefix}_lo_ms"].to_numpy(dtype=float), rows[f"{prefix}_hi_ms"].to_numpy(dtype=float)
                ax.vlines(true, lo, hi, color=colour, alpha=0.15, linewidth=0.8)
        ax.plot(span, span, color="black", linewidth=0.8)
        for factor in (0.75, 1.25):
            ax.plot(span, span * factor, color="grey", linewidth=0.6, linestyle="--")
        ax.set(xscale="log", yscale="log", xlim=span, ylim=span, xlabel="measured step (ms)",
               title=f"{title}: mean MAPE over sources {mean_source_mape(runs, f'{prefix}_ms'):.1f}%")  # fmt: skip
        ax.grid(True, which="major", linewidth=0.3)
    axes[0].set_ylabel("predicted step, its source held out (ms)")
    axes[0].legend(loc="upper left", fontsize=7, markerscale=1.5)
    fig.suptitle("Leave one source out: every run predicted by a model that never saw its source")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    plot(pd.read_csv(args.runs), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
