# The residual side, W8A8 and the training-free mitigations of one finished run: the steps that
# eval/residual/make_residual.sh (the two committed CPU studies) and eval/emergence/make_emergence.sh (the
# Fashion-MNIST runs, one at a time as each finishes) take. Sourced, not run; a rerun skips what is done.
#   probe_run RUN               its linear and dense probes, where its training ran none
#   quantize_diagnose RUN       W8A8 (results/quant.json), then the diagnosis with the residual side (its page shows the
#                               quantization panel); a seed-0 run's report page is copied to eval/residual/reports/
#   derive RUN                  the three training-free mitigations as derived runs <RUN>+<method>, diagnosed and probed
# The probes' settings are make_leaderboard.sh's, so every row of a study's leaderboard is probed alike.
EVAL=(eval.max_train_images=1024 eval.max_val_images=512 eval.linear_epochs=5 eval.dense_epochs=5)
PAGES=${PAGES:-eval/residual/reports}
read -ra METHODS <<<"${METHODS:-test_time_register mean_massive zero_massive}"  # the training-free edits derived
# the steps' own progress bars stay out of the driver's log (a training's still reach its run's log)
step() { TQDM_DISABLE=1 python -m "$@"; }

# a run whose training finished; the finished trained runs under a folder (derived runs end in +<method>, not -s<seed>)
finished_run() { grep -qs '"finished"' "$1/status.json"; }
trained() {
  [ -n "$1" ] || return 0
  for run in "$1"/*-s[0-9]/; do finished_run "$run" && echo "${run%/}"; done; return 0
}

# a summary that counts the sink share the current way (residual.sink_share_of; older ones are diagnosed again)
current() { grep -qs '"sink_share_of": "entering"' "$@"; }
# a derived run whose diagnosis and probes were all written (trainfree writes the run first: one interrupted after
# that is made again)
derived_done() { [ -f "$1/diagnostics/final/summary.json" ] && [ -f "$1/results/linear.json" ] && \
                 compgen -G "$1/results/dense_*.json" > /dev/null; }

probe_run() {
  local run=$1
  [ -f "$run/results/linear.json" ] || { echo "$(basename "$run"): linear probe"
    step vitsinks.eval.linear ckpt="$run/checkpoints/last.pt" "${EVAL[@]}" > /dev/null; }
  compgen -G "$run/results/dense_*.json" > /dev/null || { echo "$(basename "$run"): dense probe"
    step vitsinks.eval.dense ckpt="$run/checkpoints/last.pt" "${EVAL[@]}" > /dev/null; }
}

quantize_diagnose() {
  local run=$1 quantized page
  # delete results/quant.json to redo the quantization; a probe newer than the quantization is compared again
  quantized=$([ "$run/results/quant.json" -nt "$run/checkpoints/last.pt" ] && \
              ! [ "$run/results/linear.json" -nt "$run/results/quant.json" ] && echo 1 || true)
  if [ -n "$quantized" ] && [ "$run/diagnostics/last/report.html" -nt "$run/results/quant.json" ] && \
     current "$run/diagnostics/last/summary.json"; then
    echo "$(basename "$run"): done already"; return 0
  fi
  echo "$(basename "$run"): $([ -n "$quantized" ] && echo "diagnose (quantized already)" || echo "quantize, diagnose")"
  [ -n "$quantized" ] || step vitsinks.quantize ckpt="$run/checkpoints/last.pt" "${EVAL[@]}" > /dev/null
  step vitsinks.diagnose ckpt="$run/checkpoints/last.pt" > /dev/null  # after: its page shows results/quant.json
  case "$run" in *-s0)  # one page per seed-0 run is committed
    page="$PAGES/$(basename "$run")"
    mkdir -p "$page" && cp "$run/diagnostics/last/report.html" "$page/";;
  esac
}

derive() {
  local run=$1 method derived out refused
  for method in "${METHODS[@]}"; do
    derived="$run+$method"
    refused="$run/results/$method.refused"  # a refusal is kept with the checkpoint it was made on, not fitted again
    if [ "$refused" -nt "$run/checkpoints/last.pt" ]; then
      echo "$(basename "$run"): $(cat "$refused") (delete $refused to fit it again)"; continue
    fi
    if derived_done "$derived"; then
      if current "$derived"/diagnostics/{final,last}/summary.json; then echo "$(basename "$derived"): done already"
      else step vitsinks.diagnose ckpt="$derived/checkpoints/last.pt" > /dev/null
           echo "$(basename "$derived"): diagnosed again (sink share)"; fi
      continue
    fi
    # a derived run left half-made (interrupted before its diagnosis or probes) is made again
    if ! out=$(step vitsinks.trainfree ckpt="$run/checkpoints/last.pt" method="$method" \
               runs_dir="$(dirname "$run")" trainfree.overwrite="$([ -d "$derived" ] && echo true || echo false)" \
               "${EVAL[@]}" 2>&1); then
      grep -q "has no artifact for register neurons" <<<"$out" || { echo "$out" >&2; return 1; }
      echo "no high-norm patch token, no test-time register" > "$refused"
      echo "$(basename "$run"): $(cat "$refused")"
      continue
    fi
    echo "$(basename "$derived"): derived, diagnosed, probed"
  done
}
