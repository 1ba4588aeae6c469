"""Evaluation plots of an op predictor (matplotlib figures; the caller saves or logs them)."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from perfcast.training.evaluate import BASELINES, CALIBRATION_LEVELS, MODEL  # noqa: E402


def parity_plot(predictions: pd.DataFrame) -> Figure:
    """Predicted against measured time (log-log), one colour per evaluation class."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for klass, block in predictions.groupby("eval_class"):
        ax.scatter(block["measured_ms"], block[MODEL], s=2, alpha=0.3, label=str(klass))
    lims = [predictions["measured_ms"].min(), predictions["measured_ms"].max()]
    ax.plot(lims, lims, color="black", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="predicted (ms)",
           title="held-out GPUs: predicted vs measured")  # fmt: skip
    ax.legend(markerscale=5, fontsize=8)
    fig.tight_layout()
    return fig


def error_by_gpu_plot(table: pd.DataFrame) -> Figure:
    """MAPE per held-out GPU and class, for the model and each baseline."""
    classes = sorted(table["eval_class"].unique())
    fig, axes = plt.subplots(len(classes), 1, figsize=(8, 2.6 * len(classes)), squeeze=False)
    names = [MODEL, *BASELINES]
    for ax, klass in zip(axes[:, 0], classes, strict=True):
        block = table[table["eval_class"] == klass].pivot(index="gpu", columns="predictor", values="mape")
        block = block.reindex(columns=names)
        x = np.arange(len(block))
        for i, name in enumerate(names):
            ax.bar(x + (i - 1) * 0.27, block[name], width=0.27, label=name)
        ax.set_xticks(x, block.index, rotation=20, fontsize=8)
        ax.set(ylabel="MAPE (%)", title=f"{klass}: error by held-out GPU")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def calibration_plot(predictions: pd.DataFrame) -> Figure:
    """Empirical coverage of the held-out intervals against their nominal coverage, per class."""
    fig, ax = plt.subplots(figsize=(5, 5))
    for klass, block in predictions.groupby("eval_class"):
        seen = [
            float(((block[f"lo@{c}"] <= block["measured_ms"]) & (block["measured_ms"] <= block[f"hi@{c}"])).mean())
            for c in CALIBRATION_LEVELS
        ]
        ax.plot(CALIBRATION_LEVELS, seen, marker="o", label=str(klass))
    ax.plot([0, 1], [0, 1], color="black", lw=1)
    ax.set(xlim=(0.4, 1), ylim=(0, 1), xlabel="nominal coverage", ylabel="held-out coverage",
           title="interval calibration on unseen GPUs")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def importance_plot(importance: Mapping[str, Mapping[str, float]], top: int = 15) -> Figure:
    """Top features by total gain, one panel per op class."""
    fig, axes = plt.subplots(1, max(1, len(importance)), figsize=(5 * max(1, len(importance)), 4.5), squeeze=False)
    for ax, (klass, scores) in zip(axes[0], importance.items(), strict=False):
        items = sorted(scores.items(), key=lambda kv: kv[1])[-top:]
        ax.barh([k for k, _ in items], [v for _, v in items])
        ax.set(title=f"{klass}: feature importance (gain)")
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


def measured_parity_plot(rows: pd.DataFrame, pred_col: str, lo_col: str, hi_col: str, group: str, title: str) -> Figure:
    """Predicted against measured time (log-log) of a user's measured rows, with each row's
    interval as an error bar, one colour per ``group`` value, the 1:1 line and a ±20% band."""
    answered = rows[rows[pred_col].notna()]
    fig, ax = plt.subplots(figsize=(6, 5.5))
    groups = list(answered.groupby(group, dropna=False))
    for name, block in groups[:12]:
        lo, hi = block[lo_col].to_numpy(float), block[hi_col].to_numpy(float)
        pred = block[pred_col].to_numpy(float)
        yerr = np.vstack([pred - lo, hi - pred]) if np.isfinite(lo).all() and np.isfinite(hi).all() else None
        ax.errorbar(block["measured_ms"], pred, yerr=yerr, fmt="o", ms=3, alpha=0.6, elinewidth=0.6, label=str(name))
    if len(groups) > 12:
        rest = pd.concat([b for _, b in groups[12:]])
        ax.scatter(rest["measured_ms"], rest[pred_col], s=6, alpha=0.4, color="grey", label="other")
    low = float(min(answered["measured_ms"].min(), answered[pred_col].min()))
    high = float(max(answered["measured_ms"].max(), answered[pred_col].max()))
    line = np.array([low / 1.5, high * 1.5])
    ax.plot(line, line, color="black", lw=1, label="measured = predicted")
    ax.fill_between(line, line / 1.2, line * 1.2, color="grey", alpha=0.15, label="±20%")
    ax.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="predicted (ms)", title=title)
    ax.legend(fontsize=7, markerscale=1.5)
    fig.tight_layout()
    return fig


STEP_PARTS = ("compute_ms", "attention_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms")
"""Breakdown columns of a step drawn as their own segments (exposed communication adds one per group)."""


def step_breakdown_plot(rows: pd.DataFrame, label: pd.Series, *, max_rows: int = 40) -> Figure:
    """Where each config's step time goes: one horizontal stacked bar per row of ``rows`` (the
    ``--breakdown`` columns of a step prediction, in ms), labelled by ``label``."""
    comm = [c for c in rows.columns if c.startswith("comm_") and c.endswith("_ms") and rows[c].fillna(0).gt(0).any()]
    parts = [c for c in (*STEP_PARTS[:1], *comm, *STEP_PARTS[1:]) if c in rows.columns]
    shown = rows.head(max_rows)
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(shown) + 1.6))
    left = np.zeros(len(shown))
    y = np.arange(len(shown))[::-1]
    for name in parts:
        width = shown[name].fillna(0).to_numpy(float) / 1e3
        ax.barh(y, width, left=left, label=name.removesuffix("_ms").replace("comm_", "exposed comm "))
        left += width
    ax.set_yticks(y, label.head(max_rows).astype(str).tolist(), fontsize=7)
    ax.set(xlabel="step time (s)", title="where the step time goes")
    ax.legend(fontsize=7, ncols=2, loc="lower right")
    fig.tight_layout()
    return fig


def search_plot(ranked: pd.DataFrame, *, key: str = "step_ms") -> Figure:
    """Ranked layouts: ``key`` (step time in ms, or ``usd_per_step``) against peak memory per GPU,
    with interval bars (step time), one colour per GPU type, hollow markers where the prediction
    extrapolates, and the Pareto front (no layout both faster and lighter) drawn as a line."""
    fig, ax = plt.subplots(figsize=(7, 5))
    scale = 1e3 if key == "step_ms" else 1.0
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (gpu, block) in enumerate(ranked.groupby("gpu")):
        colour = colours[i % len(colours)]
        value = block[key].to_numpy(float) / scale
        yerr = None
        if (
            key == "step_ms"
            and {"step_lo_ms", "step_hi_ms"} <= set(block.columns)
            and block["step_lo_ms"].notna().all()
        ):
            yerr = np.vstack([value - block["step_lo_ms"] / scale, block["step_hi_ms"] / scale - value])
        ood = (
            block["out_of_domain"].fillna(False).to_numpy(bool)
            if "out_of_domain" in block
            else np.zeros(len(block), bool)
        )
        if yerr is not None:
            ax.errorbar(block["peak_mem_gib"], value, yerr=yerr, fmt="none", color=colour, alpha=0.25, elinewidth=0.6)
        ax.scatter(block["peak_mem_gib"][~ood], value[~ood], s=14, color=colour, label=str(gpu))
        if ood.any():
            ax.scatter(block["peak_mem_gib"][ood], value[ood], s=14, facecolors="none", edgecolors=colour,
                       label=f"{gpu} (extrapolates)")  # fmt: skip
    front = ranked.sort_values(["peak_mem_gib", key])
    front = front[front[key] <= front[key].cummin()]
    ax.step(front["peak_mem_gib"], front[key] / scale, where="post", color="black", lw=1, label="Pareto front")
    ax.set(xlabel="peak memory per GPU (GiB)", ylabel="step time (s)" if key == "step_ms" else key,
           title="layouts that fit: time against memory")  # fmt: skip
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
