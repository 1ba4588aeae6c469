"""Before/after table of the vector class under leave-one-GPU-out, from ``op_logo.py`` result files.

Reads ``benchmarks/results/<stem>.json`` of the runs named on the command line (each written by
``benchmarks/op_logo.py --classes vector``) and prints, per held-out GPU, each run's model MAPE,
median APE, coverage of the 90% interval and its mean relative width, then the median over GPUs
and whether the issue's bar holds (median MAPE <= 12%, every GPU <= 30%, coverage >= 80%).

Usage: .venv/bin/python benchmarks/op_vector_timing_report.py LABEL=STEM [LABEL=STEM ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MEDIAN_MAPE_BAR, GPU_MAPE_BAR, COVERAGE_BAR = 12.0, 30.0, 0.80


def _model_rows(stem: str) -> dict[str, dict]:
    result = json.loads((RESULTS / f"{stem}.json").read_text())
    return {r["gpu"]: r for r in result["per_gpu"] if r["predictor"] == "model" and r["eval_class"] == "vector"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="LABEL=STEM: a column label and a result file stem.")
    args = parser.parse_args()
    runs = [tuple(r.split("=", 1)) for r in args.runs]
    rows = {label: _model_rows(stem) for label, stem in runs}
    gpus = sorted(set().union(*rows.values()))
    head = "| held-out GPU | n | " + " | ".join(
        f"{label} MAPE | {label} median APE | {label} coverage | {label} width" for label, _ in runs
    )
    lines = [head + " |", "|---|---:|" + "---:|" * (4 * len(runs))]
    for gpu in gpus:
        n = next(int(r[gpu]["n"]) for r in rows.values() if gpu in r)
        cells = []
        for label, _ in runs:
            r = rows[label].get(gpu)
            cells += (
                ["-"] * 4
                if r is None
                else [
                    f"{r['mape']:.1f}",
                    f"{r['median_ape']:.1f}",
                    f"{100 * r['coverage']:.1f}",
                    f"{r['rel_width']:.2f}",
                ]
            )
        lines.append(f"| {gpu} | {n} | " + " | ".join(cells) + " |")
    cells = []
    for label, _ in runs:
        vals = list(rows[label].values())
        cells += [
            f"{statistics.median(v['mape'] for v in vals):.1f}",
            f"{statistics.median(v['median_ape'] for v in vals):.1f}",
            f"{100 * statistics.median(v['coverage'] for v in vals):.1f}",
            f"{statistics.median(v['rel_width'] for v in vals):.2f}",
        ]
    lines.append("| median over GPUs | | " + " | ".join(cells) + " |")
    lines.append("")
    for label, _ in runs:
        vals = rows[label]
        median = statistics.median(v["mape"] for v in vals.values())
        over = [g for g, v in vals.items() if v["mape"] > GPU_MAPE_BAR]
        under = [g for g, v in vals.items() if v["coverage"] < COVERAGE_BAR]
        lines.append(
            f"- {label}: median MAPE {median:.1f}% ({'meets' if median <= MEDIAN_MAPE_BAR else 'misses'} <= 12%); "
            f"MAPE > 30% on {', '.join(over) or 'no GPU'}; coverage < 80% on {', '.join(under) or 'no GPU'}."
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
