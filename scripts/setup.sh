#!/usr/bin/env bash
# Create .venv (if missing) and install perfcast with its test extras into it.
# Usage: bash scripts/setup.sh        (idempotent; re-running only refreshes the install)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
