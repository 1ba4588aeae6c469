"""Achieved memory bandwidth of large elementwise ops per GPU, and the signed error of held-out GPUs.

Issue 15, item 1: after the timing fix, NeuSight's vector ops still miss on held-out V100 and
P100 (``op_vector_timing.md``). This asks whether any datasheet figure could carry what they
differ in. For every GPU of NeuSight's vector kernels it reports the bandwidth that large
streaming ops reach (``add``, ``mul``, ``relu`` over 1 ms: bytes moved / measured time, GB/s,
and that over the datasheet ``mem_bw_gbps``), beside the descriptors the op model sees
(``bw_per_w``, ``peak_per_w``). Then, for each ``--hold-out`` GPU, it fits the op model
(``OpTimeRegressor(timing=False)`` defaults) on the other GPUs' vector rows and reports the
median ratio predicted / measured by op and by measured-time bucket (above 1: predicted slower
than measured).

Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/op_vector_bandwidth.py
[--data DIR] [--hold-out v100-pcie-32gb,p100-pcie-16gb]
Writes ``benchmarks/results/op_vector_bandwidth.md`` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from op_logo import FILES
from step_transfer_eval import md_table

from perfcast.data.sources import read_source
from perfcast.features.hardware import resolve_gpu_name
from perfcast.features.op_features import featurize_ops
from perfcast.models.op_model import OpTimeRegressor

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "op_vector_bandwidth.md"
STREAMING_OPS = ("add", "mul", "relu")
"""Elementwise ops whose large instances are bound by memory bandwidth alone."""
LARGE_MS = 1.0
"""Measured time above which a streaming op's launch and tail are negligible, ms."""
TIME_BUCKETS_MS = (0.0, 0.02, 0.05, 0.1, 0.5, 2.0, np.inf)


def achieved_bandwidth(records: pd.DataFrame, features: pd.DataFrame) -> pd.DataFrame:
    """Per GPU: median GB/s of large streaming ops, its fraction of the datasheet, and two descriptors."""
    large = (records["op"].isin(STREAMING_OPS) & (records["measured_ms"] > LARGE_MS)).to_numpy()
    rows = records[large].assign(
        gbps=features["mem_bytes"].to_numpy()[large] / records["measured_ms"].to_numpy()[large] / 1e6,
        fraction=features["roofline_ms"].to_numpy()[large] / records["measured_ms"].to_numpy()[large],
        bw_per_w=features["bw_per_w"].to_numpy()[large],
        peak_per_w=features["peak_per_w"].to_numpy()[large],
    )
    table = rows.groupby("gpu").agg(
        ops=("gbps", "size"),
        achieved_gbps=("gbps", "median"),
        of_datasheet=("fraction", "median"),
        bw_per_w=("bw_per_w", "first"),
        peak_per_w=("peak_per_w", "first"),
    )
    return table.round(3).reset_index()


def held_out_ratios(records: pd.DataFrame, gpu: str) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """Median predicted / measured on held-out ``gpu``: by op, by measured-time bucket, and overall."""
    y = records["measured_ms"].to_numpy(dtype=float)
    test = (records["gpu"] == gpu).to_numpy()
    model = OpTimeRegressor(timing=False).fit(records[~test].reset_index(drop=True), y[~test])
    held = records[test].reset_index(drop=True)
    held = held.assign(ratio=model.predict(held) / y[test])
    held["measured"] = pd.cut(held["measured_ms"], TIME_BUCKETS_MS).astype(str)
    by_op = held.groupby("op")["ratio"].agg(["size", "median"]).round(3).reset_index()
    by_time = held.groupby("measured", sort=False)["ratio"].agg(["size", "median"]).round(3).reset_index()
    return by_op, by_time.sort_values("measured"), float(np.median(held["ratio"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--hold-out", default="v100-pcie-32gb,p100-pcie-16gb")
    args = parser.parse_args()
    records = read_source(
        args.data / FILES["neusight-vector"], reader="neusight-vector", resolve_gpu=resolve_gpu_name
    ).records
    features = featurize_ops(records)
    lines = [
        "# Achieved bandwidth of NeuSight's large streaming ops, and held-out vector errors (issue 15)\n",
        "`.venv/bin/python benchmarks/op_vector_bandwidth.py`. Streaming ops: "
        f"{', '.join(STREAMING_OPS)} measured over {LARGE_MS:g} ms; `of_datasheet` = roofline / measured "
        "(bytes at the datasheet bandwidth over the measured time).\n",
        md_table(achieved_bandwidth(records, features)),
    ]
    for gpu in filter(None, args.hold_out.split(",")):
        by_op, by_time, overall = held_out_ratios(records, gpu)
        lines += [
            f"\n## {gpu} held out: median predicted / measured {overall:.3f}\n",
            md_table(by_op),
            "",
            md_table(by_time),
        ]
        print(f"{gpu}: median predicted / measured {overall:.3f}", flush=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
