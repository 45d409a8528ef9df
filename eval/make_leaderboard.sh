#!/usr/bin/env bash
# Regenerate the committed leaderboard of vit_cpu on synthetic data (the embedded default before the first run
# became vit_mini; pinned here, with the data size and loader of then):
# the four variants x 2 seeds, each trained, diagnosed, linear- and dense-probed, then tabulated.
#   bash eval/make_leaderboard.sh   (not timed end to end: a vit_cpu step costs about 3x a first-run step, so expect
#   8 x 128 steps of ~3 CPU-s plus the probes, 1-2 hours on 2 quiet cores)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-runs/leaderboard}
python -m vitsinks.launch -m exp=base,gate,reg,gate+reg seed=0,1 model=vit_cpu data.train_size=4096 data.num_workers=0 runs_dir="$RUNS" wandb.mode=disabled \
  train.epochs=2 eval.after_train=true eval.max_train_images=1024 eval.max_val_images=512 \
  eval.linear_epochs=5 eval.dense_epochs=5  # a failed run stops the script (set -e): no leaderboard of a partial sweep
SWEEP=$(ls -dt "$RUNS"/sweeps/sweep-* | head -n 1)
python -m vitsinks.leaderboard runs="$SWEEP" out=eval/leaderboard title="vitsinks leaderboard: embedded default (vit_cpu, synthetic, CPU)"
