"""Dense (segmentation) probing of a frozen backbone, under a named protocol (`eval.dense_protocol`).

    python -m vitsinks.eval.dense ckpt=runs/<name>/checkpoints/last.pt data=ade20k data.root=/datasets/ade
    python -m vitsinks.eval.dense ckpt=... data=voc data.root=/datasets/voc eval.dense_protocol=kempner
    python -m vitsinks.eval.dense model=dinov2_small data=ade20k data.root=...   # a pretrained model (its import)
    python -m vitsinks.eval.dense hub=hf:facebook/dinov2-small data=ade20k data.root=...   # read unmodified
    python -m vitsinks.eval.dense ckpt=... data=ade20k data.root=... eval.dense_backend=mmseg   # by mmsegmentation

The model is any source a command takes (`vitsinks.run.source`: `ckpt=`, `run=`, `model.pretrained=`, `hub=`).

Both protocols train a per-patch linear map on the final-norm patch tokens ([CLS] and registers dropped; through the
model seam, `Backbone.forward_features`, a hub model's inputs in its own normalisation), logits
upsampled bilinearly, cross-entropy with 255 ignored, AdamW; mIoU, per-class IoU and pixel accuracy come from one
confusion matrix over the whole val split (summed over ranks). `dinov2` (default): BatchNorm first, the model's input
size, one evaluation at the end at full label resolution with a sliding window. `kempner` / `kempner_cached`: the
attention-sink reference's probe at 512 x 512, val at 512 x 512 before the first epoch and after each, the best epoch
reported (`dense_protocols.py` holds every setting). Writes `<run>/results/dense_<data>.json` (dinov2) or
`dense_<data>_<protocol>.json`, with the example PNG and the heads beside it.

`eval.dense_backend=mmseg` (`pip install vitsinks[mmseg]`) runs the `dinov2` protocol through mmsegmentation on
ADE20K or VOC: mmseg's datasets, a config of `eval.dense_mmseg_config` (configs/mmseg/), mmengine's Runner and mmseg's
IoUMetric, whose per-class table it prints; it writes `dense_<data>_mmseg.json` (docs/evaluation.md).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from vitsinks.configs.cli import hydra_command
from vitsinks.run.probing import dense_probe


def run(cfg: DictConfig, data: DictConfig | None = None) -> dict[str, Any]:
    """The dense probe(s) of `eval.dense_protocol` on the model of `cfg` (`run.probing.dense_probe`)."""
    return dense_probe(cfg, data)


main = hydra_command(run)

if __name__ == "__main__":
    main()
