#!/usr/bin/env bash
# Set up, then run perfcast's main job on its embedded defaults (no server, no network):
#  1. train an op predictor on measured kernel data and track the run in the local MLflow
#     store (./mlflow.db): perfcast's own H200 measurements that this repository carries
#     (data/h200-sxm-141gb), plus the public kernel tables in ../shared/data when they are
#     beside the repository (a quick configuration: 5,000 rows per GPU, 200 trees);
#  2. with ../shared/data, train a step model (GBDT) on the measured Megatron and MLPerf steps
#     over the steps that op predictor composes, tracked and registered the same way;
#  3. batch-predict the packaged example op table and run table: op times and whole-step
#     times with their 90% intervals, memory, MFU and tokens/s (steps with the shipped
#     default predictor when there are no measured runs to train a step model on).
# Writes out/ops.csv, out/steps.csv, bundles/demo-ops and bundles/demo-steps.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p out
DATA=${PERFCAST_DEMO_DATA:-../shared/data}
OP_DATA=(--data data/h200-sxm-141gb)
STEP_ARGS=()
if [ -f "$DATA/neusight_kernels_gemm.csv.gz" ]; then
    OP_DATA+=(--data "$DATA/neusight_kernels_gemm.csv.gz" --data "$DATA/neusight_kernels_vector.csv.gz")
else
    echo "no public kernel tables at $DATA: training on the repository's own H200 measurements only" >&2
fi
.venv/bin/perfcast train ops --no-evaluate --no-collectives --register perfcast-demo \
    --max-rows-per-gpu 5000 --n-estimators 200 "${OP_DATA[@]}" -o bundles/demo-ops
if [ -f "$DATA/neusight_kernels_gemm.csv.gz" ]; then
    .venv/bin/perfcast train steps --no-evaluate --register perfcast-demo-steps \
        --data "$DATA" --sources vtrain,mlperf --op-model bundles/demo-ops -o bundles/demo-steps
    STEP_ARGS=(--model bundles/demo-steps)
else
    echo "no measured runs at $DATA: predicting steps with the shipped default predictor" >&2
fi
.venv/bin/perfcast predict ops -o out/ops.csv --model bundles/demo-ops
.venv/bin/perfcast predict steps -o out/steps.csv --breakdown "${STEP_ARGS[@]}"
