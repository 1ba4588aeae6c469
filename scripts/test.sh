#!/usr/bin/env bash
# Set up, then run the whole test suite (tests that need ../shared skip when it is absent).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --quiet src tests scripts benchmarks
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}  # XGBoost threads spin-wait badly on busy cores
.venv/bin/python -m pytest -q "$@"
