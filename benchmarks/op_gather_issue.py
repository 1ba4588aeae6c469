"""SM cycles per element of measured embedding forwards: the evidence for ``GATHER_CYCLES_PER_ELEMENT``.

An embedding forward (PyTorch's ``index_select`` gather) reads one weight row per token and
writes it out. If it were bandwidth-bound its time would follow the GPU's memory bandwidth;
this script shows it follows the GPU's SM count times clock instead: per GPU, the median
over large lookups (at least ``--min-elements`` output elements, where launch overhead is
small) of

* ``cycles/element = t * sm_count * boost_clock / elements``, and
* ``bandwidth fraction = (read + write bytes) / t / mem_bw``,

from Vidur's fp16 ``emb`` rows (kernel time) and NeuSight's fp32 embedding modules (CUDA
events around the call, launch included). Writes ``benchmarks/results/op_gather_issue.{md,json}``.

Usage: .venv/bin/python benchmarks/op_gather_issue.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from perfcast.data.sources import read_source
from perfcast.features.hardware import HardwareSpec, descriptor_figures, resolve_gpu_name
from perfcast.features.op_features import GATHER_CYCLES_PER_ELEMENT
from perfcast.features.ops import op_memory_bytes

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SOURCES = {
    "vidur-ops": "vidur_llm_layer_ops.csv.gz",
    "neusight-model-ops": "neusight_model_op_latency.csv.gz",
}


def gather_table(data: Path, min_elements: float) -> pd.DataFrame:
    """One row per (source, GPU): lookups, median cycles per element and bandwidth fraction."""
    rows = []
    for reader, file in SOURCES.items():
        records = read_source(data / file, reader=reader, resolve_gpu=resolve_gpu_name).records
        emb = records[(records["op"] == "embedding") & ~records["backward"].astype(bool)].copy()
        emb["elements"] = emb["rows"].astype(float) * emb["cols"].astype(float)
        emb = emb[emb["elements"] >= min_elements]
        emb["bytes"] = op_memory_bytes(emb)
        for gpu, g in emb.groupby("gpu"):
            hw = HardwareSpec.from_name(gpu)
            figures = descriptor_figures(hw)
            cycles_per_s = figures["sm_count"] * figures["boost_clock_mhz"] * 1e6
            seconds = g["measured_ms"].astype(float) / 1e3
            cycles = seconds * cycles_per_s / g["elements"]
            bw_fraction = g["bytes"] / seconds / (hw.mem_bw_gbps * 1e9)
            rows.append(
                {
                    "source": reader,
                    "gpu": hw.id,
                    "dtype": "/".join(sorted(g["dtype"].astype(str).unique())),
                    "lookups": len(g),
                    "cycles_per_element_median": float(cycles.median()),
                    "cycles_per_element_p10": float(cycles.quantile(0.1)),
                    "cycles_per_element_p90": float(cycles.quantile(0.9)),
                    "bandwidth_fraction_median": float(bw_fraction.median()),
                    "mem_bw_gbps": hw.mem_bw_gbps,
                    "sm_cycles_per_ns": cycles_per_s / 1e9,
                }
            )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--min-elements", type=float, default=2**20)
    args = parser.parse_args()
    table = gather_table(args.data, args.min_elements)
    lines = [
        "# SM cycles per element of embedding forwards (`benchmarks/op_gather_issue.py`)",
        "",
        f"Lookups of at least {args.min_elements:,.0f} output elements. `GATHER_CYCLES_PER_ELEMENT` = "
        f"{GATHER_CYCLES_PER_ELEMENT} (`perfcast.features.op_features`).",
        "",
        "| source | GPU | dtype | lookups | cycles/element median | p10 | p90 | bandwidth fraction | "
        "bandwidth GB/s | SM cycles/ns |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.source} | {r.gpu} | {r.dtype} | {r.lookups} | {r.cycles_per_element_median:.2f} | "
            f"{r.cycles_per_element_p10:.2f} | {r.cycles_per_element_p90:.2f} | {r.bandwidth_fraction_median:.2f} | "
            f"{r.mem_bw_gbps:,.0f} | {r.sm_cycles_per_ns:.0f} |"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "op_gather_issue.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "op_gather_issue.json").write_text(json.dumps(table.to_dict("records"), indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
