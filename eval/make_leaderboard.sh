#!/usr/bin/env bash
# Regenerate the committed leaderboard of the embedded default (vit_cpu on synthetic data, CPU):
# the four variants x 2 seeds, each trained, diagnosed, linear- and dense-probed, then tabulated.
#   bash eval/make_leaderboard.sh            (about 40 minutes on 2 CPU cores)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-runs/leaderboard}
python -m vitsinks.launch -m exp=base,gate,reg,gate+reg seed=0,1 model=vit_cpu runs_dir="$RUNS" wandb.mode=disabled \
  train.epochs=2 eval.after_train=true eval.max_train_images=1024 eval.max_val_images=512 \
  eval.linear_epochs=5 eval.dense_epochs=5  # a failed run stops the script (set -e): no leaderboard of a partial sweep
SWEEP=$(ls -dt "$RUNS"/sweeps/sweep-* | head -n 1)
python -m vitsinks.leaderboard runs="$SWEEP" out=eval/leaderboard title="vitsinks leaderboard: embedded default (vit_cpu, synthetic, CPU)"
