"""Optional mmsegmentation adapter (`pip install vitsinks[mmseg]`), for stacks whose mmcv has its compiled ops.

`VitsinksBackbone` is a plain torch module (usable without mmseg): a vitsinks ViT, optionally loaded from a
training checkpoint, returning the final-norm patch tokens of the chosen blocks as feature maps, [CLS] and
registers dropped. `register()` adds it to mmseg's model registry under the name `VitsinksBackbone`; the configs
in `vitsinks/configs/mmseg/` use it with linear and UperNet heads on ADE20K and VOC.

Here (torch >= 2.10, no prebuilt mmcv) mmseg cannot import `mmcv.ops`; `register()` then fails with one message
that says why and points to the native dense probe (`python -m vitsinks.eval.dense`), which needs no mmcv.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from vitsinks.models import build_vit
from vitsinks.train.checkpoint import load_backbone

MMCV_HELP = ("mmsegmentation needs mmcv with its compiled ops (mmcv.ops), which is not installed or does not build "
             "against this torch (mmcv 2.1/2.2 compile with C++14/17, torch >= 2.10 headers need C++20). Use the "
             "native dense probe instead: python -m vitsinks.eval.dense ckpt=... data=ade20k|voc data.root=...")


class VitsinksBackbone(nn.Module):
    """A vitsinks ViT as a dense backbone: a list of (B, D, h, w) maps, one per index in `out_indices`."""

    def __init__(self, size: str = "vit_base", out_indices: tuple[int, ...] = (-1,), checkpoint: str | None = None,
                 frozen: bool = True, **model_kwargs: Any) -> None:
        super().__init__()
        if checkpoint:
            self.vit, _ = load_backbone(checkpoint)
        else:
            self.vit = build_vit(size, **model_kwargs)
        depth = len(self.vit.blocks)
        self.out_indices = tuple(i % depth for i in out_indices)
        self.frozen = frozen
        if frozen:
            self.vit.requires_grad_(False)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        if self.frozen:
            self.vit.eval()
        out = self.vit.forward_intermediates(images, indices=list(self.out_indices), norm=True, output_fmt="NCHW",
                                             intermediates_only=True)
        return list(cast(list[torch.Tensor], out))  # intermediates_only: the list of maps


def register() -> type[nn.Module]:
    """Register `VitsinksBackbone` with mmseg's MODELS registry; a clear ImportError when mmseg/mmcv are unusable."""
    try:
        import mmcv.ops  # noqa: F401  - mmseg's heads need the compiled ops; fail here, not deep inside a run
        from mmseg.registry import MODELS
    except Exception as err:  # noqa: BLE001 - ImportError, OSError from a broken extension, version asserts
        raise ImportError(f"{MMCV_HELP} ({type(err).__name__}: {err})") from err
    MODELS.register_module(name="VitsinksBackbone", module=VitsinksBackbone, force=True)
    return VitsinksBackbone
