#!/usr/bin/env bash
# The controlled broadcast task of SPEC section 7 (two attention-only layers, one head each, d = 64, 32 tokens):
# attention only / + global pathway / + global pathway + common-mode penalty (lambda_B = 1), seeds 0, 1, 2, the
# same batches in every arm; CPU setting: 1,500 steps of batch 256 at lr 1e-2 (the reference: 30k x 1,024 at
# 5e-4). About 8 minutes on 2 CPU cores. Writes eval/pathway/broadcast_pathway.{json,png}.
#   bash eval/pathway/make_broadcast_pathway.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
python -m vitsinks.synthetic task=broadcast_pathway seed=0 n_seeds=3 steps=1500 batch=256 lr=1e-2 cm_penalty=1.0 \
  out=eval/pathway
