#!/usr/bin/env bash
# Set up, then run perfcast's main job on its embedded defaults (no server, no network):
#  1. train an op predictor on measured kernel data and track the run in the local MLflow
#     store (./mlflow.db): the public kernel tables in ../shared/data when they are beside
#     the repository (a quick configuration: 5,000 rows per GPU, 200 trees);
#  2. train a step model (GBDT) on the measured Megatron and MLPerf steps over the steps that
#     op predictor composes, tracked and registered the same way;
#  3. batch-predict the packaged example op table and run table with them: op times and
#     whole-step times with their 90% intervals, memory, MFU and tokens/s.
# Without ../shared/data the shipped default predictor answers both tables.
# Writes out/ops.csv, out/steps.csv, bundles/demo-ops and bundles/demo-steps.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p out
DATA=${PERFCAST_DEMO_DATA:-../shared/data}
OP_ARGS=()
STEP_ARGS=()
if [ -f "$DATA/neusight_kernels_gemm.csv.gz" ]; then
    .venv/bin/perfcast train ops --no-evaluate --no-collectives --register perfcast-demo \
        --max-rows-per-gpu 5000 --n-estimators 200 \
        --data "$DATA/neusight_kernels_gemm.csv.gz" --data "$DATA/neusight_kernels_vector.csv.gz" \
        -o bundles/demo-ops
    .venv/bin/perfcast train steps --no-evaluate --register perfcast-demo-steps \
        --data "$DATA" --sources vtrain,mlperf --op-model bundles/demo-ops -o bundles/demo-steps
    OP_ARGS=(--model bundles/demo-ops)
    STEP_ARGS=(--model bundles/demo-steps)
else
    echo "no measured data at $DATA: predicting with the shipped default predictor" >&2
fi
.venv/bin/perfcast predict ops -o out/ops.csv "${OP_ARGS[@]}"
.venv/bin/perfcast predict steps -o out/steps.csv --breakdown "${STEP_ARGS[@]}"
