#!/usr/bin/env bash
# Profile ops on a lent GPU (the device tool's nvidia-h200 machine) with perfcast's own profiler.
#
# Two steps:
#   1. Here, once, in the repo root:   bash scripts/gpu_profile.sh prepare
#      The device image has torch (CUDA), numpy, pandas, pyarrow, typer and rich, but no
#      pydantic (see /work/.library/device/KINDS.md). `prepare` downloads the pydantic
#      wheels for the device's Python 3.12 into .whl/ and ignores that folder in git.
#   2. On the device, one call (about 8 of the 15 device minutes):
#        run(command="bash scripts/gpu_profile.sh", carry=[".whl"], timeout_s=600)
#      It runs the CUDA tests of the profiler (pytest -m gpu), then
#        perfcast profile --device cuda --dtypes bf16,fp16,fp8,fp32 --budget-s 420 -o $OUT/h200-profile
#      and checks the records. What comes back (at most 8 files, 2 folders down):
#        $OUT/h200-profile/ops.parquet, $OUT/h200-profile/card.json   the dataset
#        $OUT/h200-profile/.partial/{measurements.jsonl,meta.json}    only if the sweep was cut short
#        $OUT/profile.log, $OUT/env.txt                               log, nvidia-smi and versions
#      To continue a cut-short sweep on a fresh machine, copy the returned h200-profile folder
#      into the repo (an ignored folder, e.g. .resume/h200-profile), carry it too, and set
#      RESUME_FROM=.resume/h200-profile in the command: the profiler skips what it measured.
#
# Environment: BUDGET_S (420), DTYPES (bf16,fp16,fp8,fp32), OPS (all families), RESUME_FROM.
# Nothing here changes the GPU's settings (clocks, power, MIG); the card records them as found.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "prepare" ]; then
    set -e
    grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    # versions as pinned by this repo's venv; the device has typing-extensions already
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    ls -l .whl
    exit 0
fi

OUT=${OUT:?OUT is set by the device tool: run this through it, or set OUT=/some/dir}
BUDGET_S=${BUDGET_S:-420}
DTYPES=${DTYPES:-bf16,fp16,fp8,fp32}
OPS=${OPS:-gemm,attention,norm,softmax,elementwise,collective}
DEST="$OUT/h200-profile"
LOG="$OUT/profile.log"
export PYTHONUNBUFFERED=1
PY=python3

if ! $PY -c "import pydantic" 2>/dev/null; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            || { echo "wheel install failed" >&2; exit 3; }
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "pydantic is missing and no .whl/ was carried: run 'bash scripts/gpu_profile.sh prepare' here first" >&2
        exit 3
    fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # perfcast from the tree; catalogs are files under src/

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit,mig.mode.current \
        --format=csv 2>&1
    $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, \
'devices', torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"
    git rev-parse --short HEAD 2>/dev/null || true
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ -n "${RESUME_FROM:-}" ] && [ -d "$RESUME_FROM" ]; then
    mkdir -p "$DEST" && cp -r "$RESUME_FROM"/. "$DEST"/ && echo "resuming from $RESUME_FROM"
fi

echo "== CUDA tests of the profiler" | tee -a "$LOG"
timeout 150 $PY -m pytest -q -m gpu -p no:cacheprovider tests/data/test_profiler.py 2>&1 | tail -n 15 | tee -a "$LOG"

echo "== perfcast profile: budget ${BUDGET_S} s, dtypes ${DTYPES}" | tee -a "$LOG"
CMD=($PY -m perfcast.serve.cli profile)
# SIGINT after budget + 120 s: the profiler keeps its journal (.partial) and exits; the run tool's own
# limit (timeout_s) would SIGKILL, which keeps the fsynced journal too.
timeout --signal=INT $((BUDGET_S + 120)) "${CMD[@]}" --device cuda --ops "$OPS" --dtypes "$DTYPES" \
    --budget-s "$BUDGET_S" -o "$DEST" 2>&1 | tee -a "$LOG" | grep -v '━' 
status=${PIPESTATUS[0]}
echo "profile exit status: $status" | tee -a "$LOG"

echo "== check" | tee -a "$LOG"
$PY - "$DEST" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path
import pandas as pd
from perfcast.data.validate import check_op_records
from perfcast.features.hardware import resolve_gpu_name
dest = Path(sys.argv[1])
if not (dest / "ops.parquet").exists():
    journal = dest / ".partial" / "measurements.jsonl"
    n = len(journal.read_text().splitlines()) if journal.exists() else 0
    print(f"no dataset written; journal holds {n} rows (resume with RESUME_FROM)")
    sys.exit(0)
records = pd.read_parquet(dest / "ops.parquet")
card = json.loads((dest / "card.json").read_text())
checked = check_op_records(records, resolve_gpu=resolve_gpu_name)
print(f"records {len(records)}: accepted {checked.n_records}, rejected {checked.n_rejected}")
if checked.n_rejected:
    print(checked.rejected["reason"].value_counts().head(10).to_string())
extra = card["extra"]
print("device", extra["device"]["name"], "catalog id", extra.get("catalog_id"))
print("plan", json.dumps(extra["plan"]), "elapsed_s", extra["elapsed_s"])
print("calibration", json.dumps(extra["method"]["calibration"]))
summary = records.groupby(["op", "dtype"]).agg(rows=("measured_ms", "size"), median_ms=("measured_ms", "median"))
print(summary.to_string())
PY
ls -la "$DEST" "$DEST/.partial" 2>/dev/null
exit "$status"
