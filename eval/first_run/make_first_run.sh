#!/usr/bin/env bash
# The first run (README command 1, `python -m vitsinks.launch exp=gate+reg`) with seeds 0, 1 and 2, exactly as the
# README gives it save seed= and runs_dir=, then its leaderboard (one row, the seeds' mean and spread; inputs/ kept,
# so eval/regenerate.sh and tests/test_committed.py hold the table), seed 0's training curves, and the first-run
# benchmark (wall and CPU time of the README command, split by phase). About 15 minutes on 2 quiet cores.
#   bash eval/first_run/make_first_run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-runs/first_run}
OUT=eval/first_run
python -m vitsinks.launch -m exp=gate+reg seed=0,1,2 runs_dir="$RUNS"  # a failed run stops the script (set -e)
SWEEP=$(ls -dt "$RUNS"/sweeps/sweep-* | head -n 1)
python -m vitsinks.leaderboard runs="$SWEEP" out="$OUT" \
  title="vitsinks first run: python -m vitsinks.launch exp=gate+reg (vit_mini, synthetic, CPU), seeds 0-2"
cp "$RUNS/gate+reg-vit_mini-synthetic-s0/diagnostics/training_curves.png" "$OUT/training_curves_s0.png"
sleep 60  # the 1-min load average of the runs above decays before the benchmark starts
python -m vitsinks.bench first-run > "$OUT/bench.txt"
cat "$OUT/bench.txt"
