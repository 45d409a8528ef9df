#!/usr/bin/env bash
# Real-data emergence study: LeJEPA on Fashion-MNIST (real images, offline), the four variants x 2 seeds, vit_cpu at
# 32 px with patch 4 (64 patches), batch 64, 1,200 steps each (what 2 CPU cores train in about 40 minutes), a
# checkpoint and the sink diagnostics (64 fixed test images) every 200 steps, fp32 everywhere.
#   bash eval/emergence/make_emergence.sh            # train (skips finished runs), then report
#   bash eval/emergence/make_emergence.sh train      # only train;  PARALLEL=8 runs 8 at once (a GPU machine)
#   bash eval/emergence/make_emergence.sh report     # over-training figures and the leaderboard into eval/emergence/
#   bash eval/regenerate.sh     # the leaderboard again from the inputs committed beside it (no training)
# Env: RUNS (default runs/emergence), DATA_ROOT (default: the Debian package's folder), PARALLEL (default 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-runs/emergence}
PARALLEL=${PARALLEL:-1}
STAGE=${1:-all}
VARIANTS=(base gate reg gate+reg)
SEEDS=(0 1)
COMMON=(data=fashion_mnist data.image_size=32 model.img_size=32 model.patch_size=4 views.global_size=32
  views.local_size=16 train.max_steps=1200 train.epochs=2 train.warmup_epochs=0.05 train.ckpt_every=200
  train.precision=fp32 diagnostics.n_images=64 wandb.mode=disabled runs_dir="$RUNS" data.num_workers=1)
[ -n "${DATA_ROOT:-}" ] && COMMON+=(data.root="$DATA_ROOT")

if [ "$STAGE" = all ] || [ "$STAGE" = train ]; then
  for v in "${VARIANTS[@]}"; do
    for s in "${SEEDS[@]}"; do
      while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n; done
      python -m vitsinks.launch exp="$v" seed="$s" name="emergence-$v-s$s" "${COMMON[@]}" \
        > "$RUNS-$v-s$s.log" 2>&1 &
    done
  done
  wait
  mkdir -p "$RUNS" && mv -f "$RUNS"-*.log "$RUNS"/ 2>/dev/null || true
fi
if [ "$STAGE" = all ] || [ "$STAGE" = report ]; then
  OUTDIR=eval/emergence
  trained=()  # the trained runs only: eval/residual/make_residual.sh adds training-free runs (<run>+<method>) beside
  for run in "$RUNS"/emergence-*-s[0-9]/; do
    if ! grep -qs '"finished"' "$run/status.json"; then echo "$run: not finished, left out" >&2; continue; fi
    python -m vitsinks.diagnose run="$run" > /dev/null
    cp "$run/diagnostics/over_training.png" "$OUTDIR/over_training_$(basename "$run").png"
    trained+=("$(cd "$run" && pwd)")
  done
  [ "${#trained[@]}" -gt 0 ] || { echo "no finished run under $RUNS: train first (make_emergence.sh train)" >&2; exit 1; }
  mkdir -p "$RUNS/.trained"  # a manifest of them (as a sweep's), so the leaderboard reads those and no others
  python -c 'import json, sys; print(json.dumps({"runs": [{"run_dir": r} for r in sys.argv[1:]]}))' "${trained[@]}" \
    > "$RUNS/.trained/sweep.json"
  python -m vitsinks.leaderboard runs="$RUNS/.trained/sweep.json" out="$OUTDIR/leaderboard" \
    title="vitsinks emergence study: LeJEPA on Fashion-MNIST (vit_cpu, 32 px, 1,200 steps)"
fi
