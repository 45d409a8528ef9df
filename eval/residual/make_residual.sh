#!/usr/bin/env bash
# The residual side, quantization robustness and the training-free mitigations on the checkpoints of the two
# committed CPU studies: the sink tasks (eval/sinktasks: 40 runs, attention-only, 1 block) and the vit_cpu leaderboard
# (eval/leaderboard: vit_cpu on synthetic data, the four variants x 2 seeds). Nothing is trained.
#   1. every final checkpoint quantized (W8A8: linear-input kurtosis / inf-norm, feature cosine, the probes' change;
#      results/quant.json) and re-diagnosed (summary.json with the residual side, plots, report.html with both);
#   2. the embedded default's runs edited by every training-free mitigation (derived runs <run>+<method>, diagnosed
#      and probed with the leaderboard's evaluation settings); a test-time register needs high-norm patch tokens to
#      move: a run without any is said so and has no such row;
#   3. both studies' leaderboards regenerated (new columns), the embedded default's with the training-free rows into
#      eval/residual/leaderboard; each seed-0 run's report page copied to eval/residual/reports/.
#   RUNS_SINK=runs/sinktasks RUNS_LB=runs/leaderboard bash eval/residual/make_residual.sh   (~45 min on 2 CPU cores)
#   RUNS_LB=none bash eval/residual/make_residual.sh     # the sink tasks only (after make_sinktask_leaderboard.sh)
# The Fashion-MNIST runs get the same steps from eval/emergence/make_emergence.sh, each as soon as it is trained
# (the steps are eval/residual/steps.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS_SINK=${RUNS_SINK:-runs/sinktasks}
RUNS_LB=${RUNS_LB:-runs/leaderboard}
[ "$RUNS_LB" = none ] && RUNS_LB=""
for runs in "$RUNS_SINK" $RUNS_LB; do
  [ -d "$runs" ] || { echo "no runs at $runs: train them first (eval/sinktasks, make_leaderboard.sh)" >&2; exit 1; }
done
unset METHODS  # every training-free edit (steps.sh's default), whatever the caller's environment says
. eval/residual/steps.sh

for run in $(trained "$RUNS_SINK") $(trained "$RUNS_LB"); do quantize_diagnose "$run"; done
for run in $(trained "$RUNS_LB"); do derive "$run"; done
# the two studies' own leaderboards gain the residual and W8A8 columns (same runs, same titles as their scripts) ...
python -m vitsinks.leaderboard runs="$RUNS_SINK" out=eval/sinktasks/leaderboard \
  title="vitsinks sink tasks: attention-only ViT, 1 block, 2 heads, 256 steps (CPU)"
[ -n "$RUNS_LB" ] || exit 0
SWEEP=$(ls -dt "$RUNS_LB"/sweeps/sweep-* | head -n 1)
python -m vitsinks.leaderboard runs="$SWEEP" out=eval/leaderboard \
  title="vitsinks leaderboard: embedded default (vit_cpu, synthetic, CPU)"
# ... and the embedded default with the training-free rows beside the trained variants
python -m vitsinks.leaderboard runs="$RUNS_LB" out=eval/residual/leaderboard \
  title="vitsinks embedded default with training-free mitigations and W8A8 (vit_cpu, synthetic, CPU)"
