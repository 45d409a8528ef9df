#!/usr/bin/env bash
# The ViT sink tasks x the variants base, gate, reg, gate+reg, relu, 2 seeds each (20 runs of 256 steps; about
# 8 minutes on 2 CPU cores), trained by the real pipeline (launch -> trainer -> checkpoints -> diagnostics), then
# one leaderboard with a row per (task, variant) and the figures of eval/sinktasks/.
#   bash eval/sinktasks/make_sinktask_leaderboard.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-runs/sinktasks}
for task in sinktask_nop sinktask_broadcast; do
  python -m vitsinks.launch -m exp=base,gate,reg,gate+reg,relu seed=0,1 data="$task" runs_dir="$RUNS" \
    wandb.mode=disabled
done
python -m vitsinks.leaderboard runs="$RUNS" out=eval/sinktasks/leaderboard \
  title="vitsinks sink tasks: attention-only ViT, 1 block, 2 heads, 256 steps (CPU)"
