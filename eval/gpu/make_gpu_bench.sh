#!/usr/bin/env bash
# The GPU benchmark (docs/performance.md) as one prepared run that fits a short lease of one GPU: every configs/exp
# variant at ViT-L/16 then ViT-B/16, most important rows first, the JSON rewritten after each row, the rows that
# would overrun BUDGET_S recorded as skipped.
#   bash eval/gpu/make_gpu_bench.sh [OUT_JSON] [BUDGET_S]      (defaults: eval/gpu/gpu_bench.json, 420 s)
# On a GPU machine without network access whose Python lacks some of the packages: first, on a machine with it,
# `bash eval/gpu/wheels.sh` (downloads them into .whl/), copy the checkout with .whl/ over, run this script there
# (~8 minutes of an H200), then copy gpu_bench.json into eval/gpu/ and render the docs table:
#   python -m vitsinks.bench gpu table out=eval/gpu/gpu_bench.json docs=docs/performance.md
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_JSON=${1:-eval/gpu/gpu_bench.json}
BUDGET=${2:-420}
PY=${PYTHON:-python3}
if [ -d .whl ]; then  # the packages the machine's image lacks (eval/gpu/wheels.sh)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader || true
$PY -m vitsinks.bench gpu run out="$OUT_JSON" budget_s="$BUDGET"
