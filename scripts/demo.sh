#!/usr/bin/env bash
# Set up, then run perfcast's main job on its embedded defaults (no server, no network):
#  1. train an op predictor on measured kernel data and track the run in the local MLflow
#     store (./mlflow.db): the public kernel tables in ../shared/data when they are beside
#     the repository (a quick configuration: 5,000 rows per GPU, 200 trees);
#  2. batch-predict the packaged example op table with it (intervals included), and the
#     packaged example run table with the analytic step model.
# Writes out/ops.csv, out/steps.csv and bundles/demo-ops.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p out
DATA=${PERFCAST_DEMO_DATA:-../shared/data}
MODEL_ARGS=()
if [ -f "$DATA/neusight_kernels_gemm.csv.gz" ]; then
    .venv/bin/perfcast train ops --no-evaluate --no-collectives --register perfcast-demo \
        --max-rows-per-gpu 5000 --n-estimators 200 \
        --data "$DATA/neusight_kernels_gemm.csv.gz" --data "$DATA/neusight_kernels_vector.csv.gz" \
        -o bundles/demo-ops
    MODEL_ARGS=(--model bundles/demo-ops)
else
    echo "no measured data at $DATA: predicting with the shipped default op predictor" >&2
fi
.venv/bin/perfcast predict ops -o out/ops.csv "${MODEL_ARGS[@]}"
.venv/bin/perfcast predict steps -o out/steps.csv --breakdown
