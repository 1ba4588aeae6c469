#!/usr/bin/env bash
# Train the default predictor shipped inside the package (src/perfcast/models/default_bundle)
# on ../shared/data, tracked in the local MLflow store (./mlflow.db): first the op models on the
# compute-op sources, then the step GBDT on the measured runs (vTrain, NeuSight, MLPerf and the
# published step tables of llm-foundry, torchtitan, NeMo and NeMo AutoModel) over the steps those op
# models compose, evaluated on the held-out splits first. The step model keeps the MFU ceiling of its
# training runs (the physics floor of every predicted step; src/perfcast/models/physics_bounds.py).
#
# - NeuSight fp32 GEMM and vector kernels (8 GPUs), DeepBench GEMMs (fp32/fp16), and Vidur's fp16
#   GEMMs. Vidur's vector ops are left out: Vidur times them with record_function on the host,
#   not CUDA events, and the model trained with them predicts held-out vector ops at 94-142% MAPE
#   (benchmarks/results/op_logo_all_sources.md).
# - perfcast's own H200 measurements (data/h200-sxm-141gb): Hopper, bf16/fp8 GEMMs and fused
#   attention, which no public table holds.
# - Collectives keep the catalog alpha-beta estimate: the learned collective model does not beat
#   it on unseen GPUs yet (benchmarks/results/collective_eval.md).
# - --no-timing: one launch term per (vendor, class) over every timing method. The timing-aware
#   model predicts queries as kernel time, which the schedule's host floor was not fitted for
#   (benchmarks/results/step_transfer_eval_op_timing.md against step_transfer_eval.md).
# Usage: bash scripts/train_default.sh [DATA_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}  # XGBoost's OpenMP threads spin 10x slower on busy cores
DATA=${1:-../shared/data}
bash scripts/setup.sh
.venv/bin/python - "$DATA" <<'PY'
import sys

from perfcast.data.dataset import write_dataset
from perfcast.data.sources import read_source
from perfcast.features.hardware import resolve_gpu_name

loaded = read_source(f"{sys.argv[1]}/vidur_llm_layer_ops.csv.gz", resolve_gpu=resolve_gpu_name)
gemm = loaded.records[loaded.records["op"].isin(["matmul", "linear", "bmm"])]
write_dataset("datasets/vidur-gemm", source="vidur-ops:vidur_llm_layer_ops.csv.gz (GEMMs only)",
              how_measured=loaded.reader.description, ops=gemm)
print(f"vidur GEMMs: {len(gemm)} of {len(loaded.records)} records")
PY
.venv/bin/perfcast train ops --no-timing --no-evaluate --no-collectives --register "" \
    --data "$DATA/neusight_kernels_gemm.csv.gz" \
    --data "$DATA/neusight_kernels_vector.csv.gz" \
    --data "$DATA/deepbench_gemm.csv" \
    --data datasets/vidur-gemm \
    --data data/h200-sxm-141gb \
    -o src/perfcast/models/default_bundle
.venv/bin/perfcast train steps --model-type gbdt --register "" --data "$DATA" \
    --sources vtrain,neusight,mlperf,published \
    --op-model src/perfcast/models/default_bundle -o src/perfcast/models/default_bundle
