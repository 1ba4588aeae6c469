#!/usr/bin/env bash
# Set up, then run perfcast's main job on its embedded defaults: predict the packaged
# example run table and op table. Writes out/steps.csv and out/ops.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p out
.venv/bin/perfcast predict steps -o out/steps.csv --breakdown
.venv/bin/perfcast predict ops -o out/ops.csv
