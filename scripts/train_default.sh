#!/usr/bin/env bash
# Train the default op predictor shipped inside the package (src/perfcast/models/default_bundle)
# on every compute-op source of ../shared/data, tracked in the local MLflow store (./mlflow.db).
# Collectives keep the catalog alpha-beta estimate: the learned collective model does not beat
# it on unseen GPUs yet (benchmarks/results/collective_eval.md).
# Usage: bash scripts/train_default.sh [DATA_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data}
bash scripts/setup.sh
.venv/bin/perfcast train ops --no-evaluate --no-collectives --register "" \
    --data "$DATA/neusight_kernels_gemm.csv.gz" \
    --data "$DATA/neusight_kernels_vector.csv.gz" \
    --data "$DATA/vidur_llm_layer_ops.csv.gz" \
    --data "$DATA/deepbench_gemm.csv" \
    -o src/perfcast/models/default_bundle
