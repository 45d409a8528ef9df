"""Linear probing of a frozen backbone (DINOv2 protocol).

    python -m vitsinks.eval.linear ckpt=runs/<name>/checkpoints/last.pt data=imagenet data.root=/datasets/imagenet
    python -m vitsinks.eval.linear model=dinov2_small data=imagenet data.root=...   # a pretrained model (its import)
    python -m vitsinks.eval.linear hub=hf:facebook/dinov2-small data=imagenet data.root=...   # read unmodified
    python -m vitsinks.eval.linear run=runs/<name>+test_time_register   # a derived run (also of a hub model)

The model is any source a command takes (`vitsinks.run.source`: `ckpt=`, `run=`, `model.pretrained=`, `hub=`).
Features ([CLS] of the last 1 or 4 blocks (a model without [CLS]: its mean patch token), optionally with the
average-pooled patch tokens, through the model seam; a hub model's pictures through its own preprocessing) are
extracted once and cached in fp16; a grid of learning rates x {last 1, last 4 blocks} x {[CLS], [CLS] + avgpool}
linear heads is trained together in one pass over them (SGD, momentum 0.9, cosine); the best head by val top-1 is
reported with its top-5 in `<run>/results/linear.json` (a loose checkpoint file's or a hub model's `<run>`:
`<runs_dir>/quant/<model>/`, where `quantize` reads it). With `eval.knn` (on by default) the same cached features
also give the k-NN probe (DINO's weighted k-NN, `eval.knn_protocol`, no training) in `<run>/results/knn.json`.
`eval.linear_protocol=patches`: every head reads [CLS] with the concatenated patches (the last block's patch tokens
average-pooled to a 2 x 2 grid) instead, in `<run>/results/linear_patches.json`.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from vitsinks.configs.cli import hydra_command
from vitsinks.run.probing import linear_probe


def run(cfg: DictConfig, data: DictConfig | None = None) -> dict[str, Any]:
    """The linear probe on the model of `cfg` (`run.probing.linear_probe`)."""
    return linear_probe(cfg, data)


main = hydra_command(run)

if __name__ == "__main__":
    main()
