#!/usr/bin/env bash
# The controlled broadcast task (README "Controlled broadcast task"): two pre-norm layers with one head and an MLP
# each, d = 64, 32 tokens; arms attention only / + global pathway / + global pathway + common-mode penalty
# (lambda_B = 1 on the sum over the two layers), seeds 0, 1, 2, the same initial parameters and batches in every arm
# of a seed. CPU setting: 1,000 steps of batch 256 at a constant lr 1e-2 (the reference: 5 seeds, 30k steps of
# batch 1,024 at 5e-4, which is
#   python -m vitsinks.synthetic task=broadcast_pathway n_seeds=5 steps=30000 batch=1024 lr=5e-4 device=cuda
# on a GPU). About 22 minutes on 2 shared CPU cores with OMP_NUM_THREADS=1 (on a shared machine more threads than
# free cores make every step several times slower). Writes eval/pathway/broadcast_pathway.{json,png}.
#   bash eval/pathway/make_broadcast_pathway.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
python -m vitsinks.synthetic task=broadcast_pathway seed=0 n_seeds=3 steps=1000 batch=256 lr=1e-2 cm_penalty=1.0 \
  out=eval/pathway
