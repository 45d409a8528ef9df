#!/usr/bin/env bash
# The residual side, quantization robustness and the training-free mitigations on the checkpoints of the two
# committed CPU studies: the sink tasks (eval/sinktasks: 40 runs, attention-only, 1 block) and the embedded default
# (eval/leaderboard: vit_cpu on synthetic data, the four variants x 2 seeds). Nothing is trained.
#   1. every final checkpoint quantized (W8A8: linear-input kurtosis / inf-norm, feature cosine, the probes' change;
#      results/quant.json) and re-diagnosed (summary.json with the residual side, plots, report.html with both);
#   2. the embedded default's runs edited by every training-free mitigation (derived runs <run>+<method>, diagnosed
#      and probed with the leaderboard's evaluation settings); a test-time register needs high-norm patch tokens to
#      move: a run without any is said so and has no such row;
#   3. both studies' leaderboards regenerated (new columns), the embedded default's with the training-free rows into
#      eval/residual/leaderboard; each seed-0 run's report page copied to eval/residual/reports/.
#   4. with RUNS_EM (the Fashion-MNIST emergence runs, eval/emergence/make_emergence.sh): their linear and dense probes
#      (trained without them), steps 1-2 on its finished runs too, and their leaderboard with the training-free rows
#      into eval/residual/fashion_mnist.
#   RUNS_SINK=runs/sinktasks RUNS_LB=runs/leaderboard bash eval/residual/make_residual.sh   (~45 min on 2 CPU cores)
#   RUNS_EM=runs/emergence ... adds ~5 min per Fashion-MNIST run (probes, W8A8, diagnosis, 3 edits)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS_SINK=${RUNS_SINK:-runs/sinktasks}
RUNS_LB=${RUNS_LB:-runs/leaderboard}
OUT=eval/residual
EVAL=(eval.max_train_images=1024 eval.max_val_images=512 eval.linear_epochs=5 eval.dense_epochs=5)  # make_leaderboard.sh's
RUNS_EM=${RUNS_EM:-}
# the trained runs of a study that finished (derived runs end in +<method>, not -s<seed>)
trained() {
  [ -n "$1" ] || return 0
  for run in "$1"/*-s[0-9]/; do grep -q '"finished"' "$run/status.json" 2>/dev/null && echo "${run%/}"; done; return 0
}

# a summary that counts the sink share the current way (residual.sink_share_of; older ones are diagnosed again)
current() { grep -qs '"sink_share_of": "entering"' "$@"; }
# the emergence runs trained without probes: the linear and dense probes first, with the derived runs' settings, so
# that their rows have the same quality columns and W8A8 measures the probes' change
for run in $(trained "$RUNS_EM"); do
  [ -f "$run/results/linear.json" ] || { echo "$(basename "$run"): linear probe"
    python -m vitsinks.eval.linear ckpt="$run/checkpoints/last.pt" "${EVAL[@]}" > /dev/null; }
  compgen -G "$run/results/dense_*.json" > /dev/null || { echo "$(basename "$run"): dense probe"
    python -m vitsinks.eval.dense ckpt="$run/checkpoints/last.pt" "${EVAL[@]}" > /dev/null; }
done
for run in $(trained "$RUNS_SINK") $(trained "$RUNS_LB") $(trained "$RUNS_EM"); do
  # a rerun skips what is done (delete results/quant.json to redo the quantization); a probe newer than the
  # quantization (above) is compared again
  quantized=$([ "$run/results/quant.json" -nt "$run/checkpoints/last.pt" ] && \
              ! [ "$run/results/linear.json" -nt "$run/results/quant.json" ] && echo 1 || true)
  if [ -n "$quantized" ] && [ "$run/diagnostics/last/report.html" -nt "$run/results/quant.json" ] && \
     current "$run/diagnostics/last/summary.json"; then
    echo "$(basename "$run"): done already"; continue
  fi
  echo "$(basename "$run"): $([ -n "$quantized" ] && echo "diagnose (quantized already)" || echo "quantize, diagnose")"
  [ -n "$quantized" ] || python -m vitsinks.quantize ckpt="$run/checkpoints/last.pt" "${EVAL[@]}" > /dev/null
  python -m vitsinks.diagnose ckpt="$run/checkpoints/last.pt" > /dev/null  # after: its page shows results/quant.json
  case "$run" in *-s0)  # one page per seed-0 run is committed
    page="$OUT/reports/$(basename "$run")"
    mkdir -p "$page" && cp "$run/diagnostics/last/report.html" "$page/";;
  esac
done
for run in $(trained "$RUNS_LB") $(trained "$RUNS_EM"); do
  for method in test_time_register mean_massive zero_massive; do
    derived="$run+$method"
    if [ -f "$derived/diagnostics/final/summary.json" ]; then
      if current "$derived"/diagnostics/{final,last}/summary.json; then echo "$(basename "$derived"): done already"
      else python -m vitsinks.diagnose ckpt="$derived/checkpoints/last.pt" > /dev/null
           echo "$(basename "$derived"): diagnosed again (sink share)"; fi
      continue
    fi
    if ! out=$(python -m vitsinks.trainfree ckpt="$run/checkpoints/last.pt" method="$method" runs_dir="$(dirname "$run")" \
               "${EVAL[@]}" 2>&1); then
      grep -q "has no artifact for register neurons" <<<"$out" || { echo "$out" >&2; exit 1; }
      echo "$(basename "$run"): no high-norm patch token, no test-time register"
      continue
    fi
    echo "$(basename "$derived"): derived, diagnosed, probed"
  done
done
# the two studies' own leaderboards gain the residual and W8A8 columns (same runs, same titles as their scripts) ...
python -m vitsinks.leaderboard runs="$RUNS_SINK" out=eval/sinktasks/leaderboard \
  title="vitsinks sink tasks: attention-only ViT, 1 block, 2 heads, 256 steps (CPU)"
SWEEP=$(ls -dt "$RUNS_LB"/sweeps/sweep-* | head -n 1)
python -m vitsinks.leaderboard runs="$SWEEP" out=eval/leaderboard \
  title="vitsinks leaderboard: embedded default (vit_cpu, synthetic, CPU)"
# ... and the embedded default with the training-free rows beside the trained variants
python -m vitsinks.leaderboard runs="$RUNS_LB" out="$OUT/leaderboard" \
  title="vitsinks embedded default with training-free mitigations and W8A8 (vit_cpu, synthetic, CPU)"
if [ -n "$RUNS_EM" ]; then
  python -m vitsinks.leaderboard runs="$RUNS_EM" out="$OUT/fashion_mnist" \
    title="vitsinks Fashion-MNIST emergence runs with training-free mitigations and W8A8 (vit_cpu, 32 px, 1,200 steps)"
fi
