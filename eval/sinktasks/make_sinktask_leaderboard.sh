#!/usr/bin/env bash
# The ViT sink tasks x the variants of configs/study/sinktasks.yaml (base, gate, reg, gate+reg, relu, softpick,
# softmax1, attn_bias, the global-pathway family, diff, entmax15, clipped_softmax, headnorm, qknorm and cores), 2 seeds
# each (72 runs of 256 steps; about 35 minutes on 2 CPU cores), trained by the real pipeline (launch -> trainer ->
# checkpoints -> diagnostics), the causal interventions of every final checkpoint (256 images, heads selected by docs/fidelity.md; a run without a qualifying head and
# without registers has nothing to edit and is said so), then one leaderboard with a row per (task, variant), and
# every run's intervention report copied to eval/sinktasks/interventions/<run>/.
#   bash eval/sinktasks/make_sinktask_leaderboard.sh
# Some variants only, tabulated beside runs made before (their leaderboard inputs, e.g. the committed ones):
#   EXPS=diff,entmax15 KEEP=eval/sinktasks/leaderboard/inputs bash eval/sinktasks/make_sinktask_leaderboard.sh
# (KEEP's runs are copied into $RUNS as they are, never overwriting a run of the same name; the committed
# leaderboard of December 2026 was made this way: the 48 earlier runs from their inputs, the six new variants trained)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-runs/sinktasks}
# the study configs/study/sinktasks.yaml: both tasks x the variants x 2 seeds (run names as committed), one sweep
python -m vitsinks.launch -m study=sinktasks ${EXPS:+exp=$EXPS} runs_dir="$RUNS" wandb.mode=disabled
fresh=$(ls -d "$RUNS"/*-s[0-9]/)
if [ -n "${KEEP:-}" ]; then
  for old in "$KEEP"/*-s[0-9]/; do
    [ -e "$RUNS/$(basename "$old")" ] || cp -r "$old" "$RUNS/"
  done
fi
for run in $fresh; do
  run=${run%/}
  if ! out=$(python -m vitsinks.intervene run="$run" 2>&1); then
    grep -q "no head has" <<<"$out" || { echo "$out" >&2; exit 1; }
    echo "$(basename "$run"): no head with sink events and no registers: no interventions"
    continue
  fi
  echo "$(basename "$run"): interventions in $run/interventions/last"
  dest=eval/sinktasks/interventions/$(basename "$run")
  mkdir -p "$dest"
  cp "$run"/interventions/last/{by_class.md,by_head.csv,summary.json,interventions.png} "$dest"/
done
python -m vitsinks.leaderboard runs="$RUNS" out=eval/sinktasks/leaderboard \
  title="vitsinks sink tasks: attention-only ViT, 1 block, 2 heads, 256 steps (CPU)"
