"""SM cycles per element of measured vector ops: where instruction issue, not bandwidth, bounds them.

A memory-bound op's time follows the GPU's bandwidth; an op bound by instruction issue
follows its SM count times clock instead. Per (source, GPU, op, dtype), over forward ops of
at least ``--min-elements`` output elements (where launch overhead is small), the median of

* ``cycles/element = t * sm_count * boost_clock / elements``, and
* ``bandwidth fraction = roofline time / t`` (bytes read and written over the datasheet
  bandwidth, perfcast's roofline),

for two families:

1. embedding forwards (PyTorch's ``index_select`` gather): Vidur's fp16 ``emb`` rows (kernel
   time) and NeuSight's fp32 embedding modules (CUDA events, launch included), the evidence
   for ``perfcast.features.op_features.GATHER_CYCLES_PER_ELEMENT``;
2. element-wise ops (add, mul, gelu, silu, swiglu): Vidur's fp16 rows, perfcast's own H200
   measurements (``data/h200-sxm-141gb``, bf16/fp16/fp32) and NeuSight's fp32 kernels.

Writes ``benchmarks/results/op_issue_rate.{md,json}``.

Usage: .venv/bin/python benchmarks/op_issue_rate.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from perfcast.data.sources import read_source
from perfcast.features.hardware import HardwareSpec, descriptor_figures, resolve_gpu_name
from perfcast.features.op_features import GATHER_CYCLES_PER_ELEMENT, featurize_ops

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OWN_H200 = ROOT / "data" / "h200-sxm-141gb" / "ops.parquet"
GATHER_SOURCES = {"vidur-ops": "vidur_llm_layer_ops.csv.gz", "neusight-model-ops": "neusight_model_op_latency.csv.gz"}
ELEMENTWISE_SOURCES = {"vidur-ops": "vidur_llm_layer_ops.csv.gz", "neusight-vector": "neusight_kernels_vector.csv.gz"}
ELEMENTWISE_OPS = ("add", "mul", "gelu", "silu", "swiglu")


def issue_table(records: pd.DataFrame, source: str) -> pd.DataFrame:
    """One row per (GPU, op, dtype) of forward op ``records``: count, median bandwidth fraction,
    median, 10% and 90% quantiles of SM cycles per output element."""
    fwd = records[~records["backward"].fillna(False).astype(bool)] if "backward" in records else records
    feats = featurize_ops(fwd)
    frame = fwd.assign(
        elements=fwd["rows"].astype(float) * fwd["cols"].astype(float),
        bandwidth_fraction=feats["roofline_ms"].to_numpy() / fwd["measured_ms"].to_numpy(dtype=float),
        gpu_id=feats["gpu_id"].to_numpy(),
    )
    rows = []
    for (gpu, op, dtype), g in frame.groupby(["gpu_id", "op", "dtype"]):
        figures = descriptor_figures(HardwareSpec.from_name(gpu))
        cycles_per_ms = figures["sm_count"] * figures["boost_clock_mhz"] * 1e3
        cycles = g["measured_ms"].astype(float) * cycles_per_ms / g["elements"]
        rows.append({
            "source": source, "gpu": gpu, "op": op, "dtype": dtype, "ops": len(g),
            "bandwidth_fraction_median": float(g["bandwidth_fraction"].median()),
            "cycles_per_element_median": float(cycles.median()),
            "cycles_per_element_p10": float(cycles.quantile(0.1)),
            "cycles_per_element_p90": float(cycles.quantile(0.9)),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _large(records: pd.DataFrame, ops: tuple[str, ...], min_elements: float) -> pd.DataFrame:
    keep = records["op"].isin(ops) & (records["rows"].astype(float) * records["cols"].astype(float) >= min_elements)
    return records[keep]


def _markdown(table: pd.DataFrame) -> list[str]:
    lines = [
        "| source | GPU | op | dtype | ops | bandwidth fraction | cycles/element median | p10 | p90 |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.source} | {r.gpu} | {r.op} | {r.dtype} | {r.ops} | {r.bandwidth_fraction_median:.2f} | "
            f"{r.cycles_per_element_median:.2f} | {r.cycles_per_element_p10:.2f} | {r.cycles_per_element_p90:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--min-elements", type=float, default=2**20)
    args = parser.parse_args()

    def read(reader: str, file: str) -> pd.DataFrame:
        return read_source(args.data / file, reader=reader, resolve_gpu=resolve_gpu_name).records

    gather = pd.concat(
        [issue_table(_large(read(r, f), ("embedding",), args.min_elements), r) for r, f in GATHER_SOURCES.items()],
        ignore_index=True,
    )
    parts = [read(r, f).assign(source=r) for r, f in ELEMENTWISE_SOURCES.items()]
    if OWN_H200.is_file():
        parts.append(pd.read_parquet(OWN_H200).assign(source="perfcast-h200"))
    elementwise = pd.concat(
        [issue_table(_large(p, ELEMENTWISE_OPS, args.min_elements), p["source"].iloc[0]) for p in parts],
        ignore_index=True,
    )
    lines = [
        "# SM cycles per element of measured vector ops (`benchmarks/op_issue_rate.py`)",
        "",
        f"Forward ops of at least {args.min_elements:,.0f} output elements; cycles/element = time x SMs x boost "
        "clock / elements; bandwidth fraction = roofline time / time.",
        "",
        f"## Embedding forwards (`GATHER_CYCLES_PER_ELEMENT` = {GATHER_CYCLES_PER_ELEMENT})",
        "",
        *_markdown(gather),
        "",
        "## Element-wise ops",
        "",
        *_markdown(elementwise),
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "op_issue_rate.md").write_text("\n".join(lines) + "\n")
    result = {"gather": gather.to_dict("records"), "elementwise": elementwise.to_dict("records")}
    (RESULTS / "op_issue_rate.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
