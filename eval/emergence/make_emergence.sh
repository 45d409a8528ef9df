#!/usr/bin/env bash
# Real-data emergence study: LeJEPA on Fashion-MNIST (real images, offline), the four variants x 2 seeds, vit_cpu at
# 32 px with patch 4 (64 patches), batch 64, 1,200 steps each (about 40 minutes a run on 2 CPU cores), a checkpoint
# and the sink diagnostics (64 fixed test images) every 200 steps, fp32 everywhere. Each finished run then gets the
# residual side, W8A8 and the training-free mitigations (eval/residual/steps.sh: its probes, quantization, diagnosis,
# three derived runs) and its over-training figure.
#   bash eval/emergence/make_emergence.sh           # each run in turn (every variant's seed 0 first): train, its
#                                                     steps, both leaderboards (banked)
#   bash eval/emergence/make_emergence.sh train     # train every run and take its steps; PARALLEL=8 trains 8 at once
#   bash eval/emergence/make_emergence.sh report    # the steps of any finished run left, then both leaderboards:
#     eval/emergence/leaderboard (the trained runs) and eval/residual/fashion_mnist (with the training-free rows,
#     and findings.md: the per-run numbers, eval/residual/findings.py)
# The study spans sessions: the leaderboards' committed inputs are its bank. A run whose inputs are committed in
# eval/residual/fashion_mnist/inputs (with its derived runs; its over-training figure beside this script) is not
# trained again; `report` copies the banked runs a runs folder lacks into it and tabulates them beside the new ones.
# A run interrupted mid-training resumes exactly from its last checkpoint in $RUNS (lost with the folder).
# Env: RUNS (default runs/emergence), DATA_ROOT (default: the Debian package's folder), PARALLEL (default 1).
# A trial elsewhere (refused unless RUNS, OUT, BOARD and PAGES are all given): VARIANTS / SEEDS (default
# "base gate reg gate+reg" / "0 1"), METHODS (the training-free edits, default "test_time_register mean_massive
# zero_massive"), EXTRA (overrides added to every run's, e.g. 'train.max_steps=4'); OUT (default eval/emergence: the
# figures and the trained runs' board), BOARD (default eval/residual/fashion_mnist: the board with the derived runs,
# whose inputs/ is the bank), PAGES (the seed-0 runs' report pages, default eval/residual/reports).
set -euo pipefail
cd "$(dirname "$0")/../.."
PARALLEL=${PARALLEL:-1}
STAGE=${1:-all}
case "$STAGE" in all|train|report) ;; *) echo "unknown stage '$STAGE': use all, train or report" >&2; exit 2;; esac
trial=${EXTRA:-}${VARIANTS:-}${SEEDS:-}${METHODS:-}
if [ -n "$trial" ] && [ -z "${RUNS:-}" -o -z "${OUT:-}" -o -z "${BOARD:-}" -o -z "${PAGES:-}" ]; then
  echo "EXTRA, VARIANTS, SEEDS or METHODS make a trial, not the study: give it its own RUNS, OUT, BOARD and PAGES" >&2
  exit 2
fi
RUNS=${RUNS:-runs/emergence}
OUT=${OUT:-eval/emergence}
BOARD=${BOARD:-eval/residual/fashion_mnist}
BANK=$BOARD/inputs
read -ra VARIANTS <<<"${VARIANTS:-base gate reg gate+reg}"
read -ra SEEDS <<<"${SEEDS:-0 1}"
COMMON=(model=vit_cpu data=fashion_mnist data.image_size=32 model.img_size=32 model.patch_size=4 views.global_size=32
  views.local_size=16 train.max_steps=1200 train.epochs=2 train.warmup_epochs=0.05 train.ckpt_every=200
  train.precision=fp32 diagnostics.n_images=64 eval.after_train=false wandb.mode=disabled runs_dir="$RUNS" data.num_workers=1)
[ -n "${DATA_ROOT:-}" ] && COMMON+=(data.root="$DATA_ROOT")
read -ra extra <<<"${EXTRA:-}" && COMMON+=("${extra[@]}")
. eval/residual/steps.sh
mkdir -p "$RUNS" "$OUT"

banked() { [ -f "$BANK/$1/config.yaml" ]; }
finished() { finished_run "$RUNS/$1"; }

# a finished run's steps: its over-training figure, probes, W8A8 and diagnosis, the training-free derived runs
steps() {
  local run=$RUNS/$1
  [ "$run/diagnostics/over_training.png" -nt "$run/checkpoints/last.pt" ] || \
    python -m vitsinks.diagnose run="$run" > /dev/null
  cp "$run/diagnostics/over_training.png" "$OUT/over_training_$1.png"
  probe_run "$run"
  quantize_diagnose "$run"
  derive "$run"
}

train_one() {
  # a banked copy of this name whose bank entry is gone is trained afresh, not into the copy (nor beside its derived)
  [ -f "$RUNS/$3/.banked" ] && rm -rf "${RUNS:?}/$3" "${RUNS:?}/$3"+*
  finished "$3" || python -m vitsinks.launch exp="$1" seed="$2" name="$3" "${COMMON[@]}" > "$RUNS/$3.log" 2>&1 || {
    echo "$3: training failed; its log: $RUNS/$3.log" >&2; return 1; }
  steps "$3"
}

manifest() {
  local dir=$1; shift
  mkdir -p "$dir"
  python -c 'import json, sys; print(json.dumps({"runs": [{"run_dir": r} for r in sys.argv[1:]]}))' "$@" \
    > "$dir/sweep.json"
}

report() {
  # (v and s local too: the training loop that calls this after each run iterates with the same names)
  local v s name src d trained=() derived=() done_=0 total=$(( ${#VARIANTS[@]} * ${#SEEDS[@]} )) title note
  # the banked runs (trained and derived) that this runs folder lacks, copied in to be tabulated beside its own
  for src in "$BANK"/emergence-*/; do
    [ -d "$src" ] || continue
    name=$(basename "$src")
    [ -e "$RUNS/$name" ] || { cp -r "$src" "$RUNS/$name"; touch "$RUNS/$name/.banked"; }
  done
  for v in "${VARIANTS[@]}"; do
    for s in "${SEEDS[@]}"; do
      name=emergence-$v-s$s
      if finished "$name"; then steps "$name" > /dev/null
      elif [ ! -f "$RUNS/$name/.banked" ]; then echo "$name: not trained yet, left out" >&2; continue; fi
      trained+=("$(cd "$RUNS/$name" && pwd)")
      done_=$((done_ + 1))
      for d in "$RUNS/$name"+*/; do  # its derived runs that are whole (banked ones were, when banked)
        if [ -f "$d/.banked" ] || derived_done "$d"; then derived+=("$(cd "$d" && pwd)"); fi
      done
    done
  done
  [ "$done_" -gt 0 ] || { echo "no finished run under $RUNS and none banked: train first" >&2; exit 1; }
  note=$([ "$done_" -lt "$total" ] && echo " - $done_ of $total runs so far" || true)
  # manifests (as a sweep's) of the runs each board reads: never a run that is unfinished or half-made
  manifest "$RUNS/.trained" "${trained[@]}"
  manifest "$RUNS/.with_derived" "${trained[@]}" ${derived[@]+"${derived[@]}"}
  title="vitsinks emergence study: LeJEPA on Fashion-MNIST (vit_cpu, 32 px, 1,200 steps)$note"
  python -m vitsinks.leaderboard runs="$RUNS/.trained/sweep.json" out="$OUT/leaderboard" title="$title" > /dev/null
  title="vitsinks Fashion-MNIST emergence runs with training-free mitigations and W8A8 (vit_cpu, 32 px, 1,200 steps)"
  python -m vitsinks.leaderboard runs="$RUNS/.with_derived/sweep.json" out="$BOARD" title="$title$note" > /dev/null
  python eval/residual/findings.py "$BOARD" > /dev/null  # its per-run numbers (findings.md)
  echo "written: $OUT/leaderboard, $BOARD ($done_ of $total runs)"
}

if [ "$STAGE" != report ]; then
  pids=()
  for s in "${SEEDS[@]}"; do  # seed-major: a study that spans sessions has every variant's first seed soonest
    for v in "${VARIANTS[@]}"; do
      name=emergence-$v-s$s
      if banked "$name"; then echo "$name: banked (its inputs are committed), not trained again"; continue; fi
      if [ "$PARALLEL" -le 1 ]; then
        echo "$name: training (log: $RUNS/$name.log)"
        train_one "$v" "$s" "$name"
        if [ "$STAGE" = all ]; then report; reported=1; fi
      else
        while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do sleep 5; done  # (waiting on one would reap its status)
        echo "$name: training (log: $RUNS/$name.log)"
        train_one "$v" "$s" "$name" &
        pids+=($!)
      fi
    done
  done
  fail=0
  for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" || fail=1; done
  [ "$fail" = 0 ] || { echo "a run failed (its message above): the leaderboards are not written" >&2; exit 1; }
fi
[ "$STAGE" = train ] || [ -n "${reported:-}" ] || report  # (after each run already, when one at a time)
