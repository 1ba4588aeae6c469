"""Fully sharded against hybrid-sharded ZeRO-3 as the cluster grows: the shipped default's predictions.

For Llama-3-8B (op-level selective checkpointing; 2K and 8K sequences) and Llama-3-70B (full
recomputation; 8K sequences) under torchtitan's FSDP2, one sequence per GPU per step, on 8-GPU
H100 nodes: the step time, the time of the ZeRO-3 weight gathers and of the other data-parallel
communication left exposed, the optimizer step, the model FLOPs utilisation and the memory per
GPU of three shardings at each cluster size: one replica (``dp_replicate = 1``, full
sharding), one replica per 64 GPUs and one per node (``dp_replicate = dp / 8``).

These are predictions of composed physics with the learned correction, not measurements:
no published run of the step training set states hybrid sharding (``docs/run_table.md``).

Writes ``benchmarks/results/hybrid_sharding_sweep.md`` and ``.csv``.

Usage: .venv/bin/python benchmarks/hybrid_sharding_sweep.py
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

import perfcast

OUT = Path(__file__).resolve().parent / "results" / "hybrid_sharding_sweep"
MODELS = (("llama3-8b", "op-sac", 2048), ("llama3-8b", "op-sac", 8192), ("llama3-70b", "full", 8192))
"""(model preset, recomputation, sequence length); 70B needs full recomputation to fit."""
GPUS = (64, 512, 1024, 4096, 8192)
SHARD_GROUPS = (None, 64, 8)
"""GPUs a replica shards over: None = every GPU (full sharding)."""


def rows() -> pd.DataFrame:
    """One run-table row per (model, cluster size, shard group)."""
    out = []
    for model, recompute, seq_len in MODELS:
        for gpus in GPUS:
            for shard in SHARD_GROUPS:
                if shard is not None and shard >= gpus:
                    continue  # the fully sharded row already
                out.append({"model": model, "seq_len": seq_len, "dp": gpus, "micro_batch": 1, "global_batch": gpus,
                            "zero_stage": 3, "dp_replicate": 1 if shard is None else gpus // shard,
                            "recompute": recompute, "dtype": "bf16", "gpu": "h100-sxm5-80gb", "num_gpus": gpus,
                            "gpus_per_node": 8, "framework": "torchtitan"})  # fmt: skip
    return pd.DataFrame(out)


def main() -> None:
    start = time.perf_counter()
    table = rows()
    pred = perfcast.predict_steps(table, breakdown=True)
    pred["seq_len"], pred["shard_gpus"] = table["seq_len"], table["dp"] // table["dp_replicate"]
    cols = ["model", "seq_len", "num_gpus", "shard_gpus", "step_ms", "step_lo_ms", "step_hi_ms", "comm_dp_ms",
            "dp_sync_ms", "optimizer_ms", "mfu", "peak_mem_gib", "fits_memory"]  # fmt: skip
    frame = pred[cols]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(OUT.with_suffix(".csv"), index=False)
    lines = [
        "# Fully sharded against hybrid-sharded ZeRO-3 (predictions, shipped default)",
        "",
        f"`.venv/bin/python benchmarks/hybrid_sharding_sweep.py`; {time.perf_counter() - start:.0f} s. torchtitan "
        "FSDP2 on 8-GPU H100 nodes, one sequence of `seq` tokens per GPU per step. `shard GPUs`: the GPUs one replica "
        "shards over (`dp / dp_replicate`). Predictions, not measurements: no training run states hybrid sharding.",
        "",
        "| model | seq | GPUs | shard GPUs | step s (90% interval) | exposed weight gathers ms | exposed grad sync ms "
        "| optimizer ms | MFU | memory GiB | fits |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in frame.itertuples():
        lines.append(f"| {r.model} | {r.seq_len} | {r.num_gpus:,} | {r.shard_gpus:,} | {r.step_ms / 1e3:.2f} "
                     f"({r.step_lo_ms / 1e3:.2f}-{r.step_hi_ms / 1e3:.2f}) | {r.comm_dp_ms:.0f} | {r.dp_sync_ms:.0f} | "
                     f"{r.optimizer_ms:.0f} | {r.mfu:.1%} | "
                     f"{r.peak_mem_gib:.1f} | {'yes' if r.fits_memory else 'no'} |")  # fmt: skip
    OUT.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
