#!/usr/bin/env bash
# The wheels the GPU machine's image lacks (it has torch, torchvision, numpy, pillow, matplotlib, tqdm, pytorch-lightning,
# huggingface-hub, safetensors, pyyaml; no package registry): downloaded here into .whl/ (git-ignored), carried by the
# device run (carry [".whl"]) and installed there by make_gpu_bench.sh. Python 3.12, x86-64.
#   bash eval/gpu/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PIP=${PIP:-python3 -m pip}
mkdir -p .whl
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  hydra-core==1.3.8 omegaconf==2.3.1 lightly==1.6.0 kornia==0.9.0 kornia_rs==0.2.0 timm==1.0.31
# antlr4-python3-runtime 4.9.3 (hydra's pinned parser) is published as a source archive only: build its pure-Python wheel
$PIP wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
ls -l .whl
