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
# torch first, pinned: this machine keeps a CPU build of 2.13.0 on disk; an unpinned
# torch would pull a multi-GB CUDA build. The project itself asks only torch>=2.2.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[all,test]"
