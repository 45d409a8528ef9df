#!/usr/bin/env bash
# Regenerate the committed leaderboard of vit_cpu on synthetic data (the embedded default before the first run
# became vit_mini; pinned here, with the data size and loader of then):
# the four variants x 2 seeds, each trained, diagnosed, linear- and dense-probed, then tabulated.
#   bash eval/make_leaderboard.sh   (not timed end to end: a vit_cpu step costs about 3x a first-run step, so expect
#   8 x 128 steps of ~3 CPU-s plus the probes, 1-2 hours on 2 quiet cores)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-runs/leaderboard}
# the sweep is the study configs/study/vit_cpu_leaderboard.yaml (the runs and sweep folder of its overrides typed out);
# a failed run stops the script (set -e): no leaderboard of a partial sweep
python -m vitsinks.launch -m study=vit_cpu_leaderboard runs_dir="$RUNS" wandb.mode=disabled
SWEEP=$(ls -dt "$RUNS"/sweeps/sweep-* | head -n 1)
python -m vitsinks.leaderboard runs="$SWEEP" out=eval/leaderboard title="vitsinks leaderboard: embedded default (vit_cpu, synthetic, CPU)"
