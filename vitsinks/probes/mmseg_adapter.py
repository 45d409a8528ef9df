"""The dense probe's mmsegmentation backend (`pip install vitsinks[mmseg]`; docs/evaluation.md): a frozen model as an
mmseg backbone, mmseg's own datasets, pipelines, segmentor, `Runner` and `IoUMetric`.

`VitsinksBackbone` is a plain torch module (usable without mmseg): a model through the seam (a `Backbone` given, or
a vitsinks ViT built or loaded from a training checkpoint) returning the final-norm patch tokens of the chosen blocks
as (B, D, h, w) maps, [CLS] and registers dropped. `register()` puts the stand-in for mmcv's compiled ops in place
(`probes.mmcv_standin`), imports mmseg and adds `VitsinksBackbone` and DINOv2's linear head (`BNHead`, `bn_head`)
to its model registry. `train_and_evaluate` runs one config (`probes.mmseg_config`): the head trained by mmengine's
`Runner`, evaluated by mmseg's `IoUMetric`, which prints its per-class table.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitsinks.backbones import adapt
from vitsinks.models import build_vit
from vitsinks.models.seam import Backbone
from vitsinks.probes.mmcv_standin import install
from vitsinks.probes.mmseg_config import read
from vitsinks.train.checkpoint import load_backbone
from vitsinks.utils.errors import BadValue

MMSEG_HELP = "pip install 'vitsinks[mmseg]' (mmcv-lite, mmsegmentation, mmengine)"
DATASET_TYPES = {"ade20k": "ADE20KDataset", "voc": "PascalVOCDataset"}
REQUIRED = ("model", "train_dataloader", "val_dataloader", "train_cfg", "val_cfg", "val_evaluator", "optim_wrapper")


class VitsinksBackbone(nn.Module):
    """A model as a dense backbone: a list of (B, D, h, w) maps, one per block index in `out_indices`.

    `model`: a model through the seam (any family; held outside this module's parameters and state, on its own
    device); without it a vitsinks ViT of `size` (`build_vit` with `model_kwargs`), or the backbone of the training
    `checkpoint`. `frozen`: no gradients, and the model stays in evaluation mode.
    """

    def __init__(self, size: str = "vit_base", out_indices: tuple[int, ...] = (-1,), checkpoint: str | None = None,
                 frozen: bool = True, model: Backbone | None = None, **model_kwargs: Any) -> None:
        super().__init__()
        if model is None:
            self.vit = load_backbone(checkpoint)[0] if checkpoint else build_vit(size, **model_kwargs)
            model = adapt(self.vit)
            if frozen:
                self.vit.requires_grad_(False)
        self.seam = model
        depth = len(model.blocks)
        self.out_indices = tuple(i % depth for i in out_indices)
        self.frozen = frozen

    def init_weights(self) -> None:
        """Nothing: mmengine's weight initialisation leaves the backbone as it is."""

    def train(self, mode: bool = True) -> VitsinksBackbone:
        """This module's mode; a frozen model stays in evaluation mode."""
        super().train(mode)
        self.seam.train(mode and not self.frozen)
        return self

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        seam, device = self.seam, next(self.seam.parameters()).device
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            x, maps = seam.embed_tokens(images.to(device)), {}
            for i in range(max(self.out_indices) + 1):
                x = seam.block(i, x)
                if i in self.out_indices:
                    patches = seam.readout(x)[:, seam.num_prefix :]
                    h = images.shape[-2] // seam.patch_size[0]
                    maps[i] = patches.transpose(1, 2).reshape(len(x), patches.shape[-1], h, -1).to(images.device)
        return [maps[i] for i in self.out_indices]


@functools.cache
def bn_head() -> type[nn.Module]:
    """DINOv2's linear segmentation head as an mmseg decode head, `BNHead` (mmseg itself has none): BatchNorm (its
    `norm_cfg`, default BN) + the 1x1 convolution `conv_seg` to the class logits, over the selected backbone maps
    (`in_channels == channels`). One map (`in_index=[0]`) is the linear head; several (`input_transform=
    "resize_concat"`) its multi-layer variant, the maps resized to the first one's grid and concatenated along
    channels first, as DINOv2's evaluation code does. Built on first use: it subclasses mmseg's `BaseDecodeHead`."""
    from mmcv.cnn import build_norm_layer
    from mmseg.models.decode_heads.decode_head import BaseDecodeHead

    class BNHead(BaseDecodeHead):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            if self.in_channels != self.channels:
                raise ValueError(f"BNHead: channels={self.channels} must equal the input width {self.in_channels} "
                                 f"(the sum of in_channels for resize_concat)")
            self.bn = build_norm_layer(self.norm_cfg or {"type": "BN"}, self.in_channels)[1]

        def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
            return self.cls_seg(self.bn(self._transform_inputs(inputs)))

    return BNHead


def register() -> type[nn.Module]:
    """Import mmseg (the stand-in for mmcv's compiled ops first, where they are missing), register its modules with
    mmseg as the default scope, and add `VitsinksBackbone` and `BNHead` (`bn_head`) to its `MODELS`; a `BadValue`
    saying what to install when mmseg is missing."""
    install()  # before mmseg: it imports mmcv.ops, which asks for the compiled ops
    try:
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    except ImportError as err:
        raise BadValue(f"the mmseg backend needs mmsegmentation ({type(err).__name__}: {err}): {MMSEG_HELP}") from err
    register_all_modules(init_default_scope=True)
    MODELS.register_module(name="VitsinksBackbone", module=VitsinksBackbone, force=True)
    MODELS.register_module(name="BNHead", module=bn_head(), force=True)
    return VitsinksBackbone


@dataclass(frozen=True)
class MmsegData:
    """The data of one mmseg run: `name` (ade20k | voc), the dataset folder, VOC's augmented training set, and
    the indices of the images each split uses (None: all)."""

    name: str
    root: Path
    voc_aug: bool = False
    train_indices: list[int] | None = None
    val_indices: list[int] | None = None


def _dataset(dataloader: dict[str, Any], data: MmsegData, indices: list[int] | None, split: str) -> Any:
    """The dataset of one dataloader of the config, with the command's images, checked against the data."""
    from mmseg.registry import DATASETS

    cfg = dict(dataloader.get("dataset") or {})
    if cfg.get("type") != DATASET_TYPES[data.name]:
        raise BadValue(f"the mmseg config's {split} dataset is {cfg.get('type')!r}, but data={data.name} is read "
                       f"with mmseg's {DATASET_TYPES[data.name]}: use a config made for {data.name}")
    if data.voc_aug and split == "train":
        cfg.update(ann_file="ImageSets/Segmentation/train_aug.txt",
                   data_prefix={**cfg.get("data_prefix", {}), "seg_map_path": "SegmentationClassAug"})
    if indices is not None:
        cfg["indices"] = indices
    return DATASETS.build(cfg)


def _recorder(metric: Any) -> dict[str, Any]:
    """What `metric` (an mmseg `IoUMetric`) computes at each evaluation, kept: its summary as it prints it and its
    unrounded per-class values (`per_class`)."""
    seen: dict[str, Any] = {}
    own_summary, own_per_class = metric.compute_metrics, metric.total_area_to_metrics

    def per_class(*args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        out = own_per_class(*args, **kwargs)
        seen["per_class"] = dict(out)  # IoUMetric pops aAcc from its own
        return out

    def summary(results: list) -> dict[str, float]:
        seen["summary"] = own_summary(results)
        return seen["summary"]

    metric.compute_metrics, metric.total_area_to_metrics = summary, per_class
    return seen


def train_and_evaluate(backbone: Backbone, data: MmsegData, config: Path, bound: dict[str, Any],
                       work_dir: Path, seed: int) -> dict[str, Any]:
    """Run the mmseg config `config` (read with the command's names `bound`, `mmseg_config.read`) on the frozen
    `backbone`: the segmentor built by mmseg, its head trained by mmengine's `Runner` (logs in `work_dir`), then the
    val split evaluated by mmseg's `IoUMetric` (its per-class table printed). Returns the metrics (fractions; per
    class None where a class is in neither prediction nor labels), mmseg's own summary (in %, rounded as it
    prints it), the class names, the image counts and the head's state."""
    register()
    from mmengine.config import Config
    from mmengine.runner import Runner, set_random_seed
    from mmseg.registry import MODELS

    cfg = read(config, bound)
    if missing := [k for k in REQUIRED if k not in cfg]:
        raise BadValue(f"{config} sets no {', '.join(missing)}: a config of the mmseg backend needs "
                       f"{', '.join(REQUIRED)} (the package's configs build on _runtime.py for them)")
    model = dict(cfg["model"])
    backbone_cfg = {"type": "VitsinksBackbone", "out_indices": (model.get("backbone") or {}).get("out_indices", (-1,))}
    model["backbone"] = {**backbone_cfg, "model": backbone, "frozen": True}
    set_random_seed(seed)  # the head's initial weights: drawn as the native probe's are, from the seed
    segmentor = MODELS.build(Config({"model": model}).model)
    train = _dataset(cfg["train_dataloader"], data, data.train_indices, "train")
    val = _dataset(cfg["val_dataloader"], data, data.val_indices, "val")
    if len(val.metainfo["classes"]) != bound["classes"]:
        raise BadValue(f"mmseg's {DATASET_TYPES[data.name]} has {len(val.metainfo['classes'])} classes, the data "
                       f"config {bound['classes']} (data.num_classes): leave data.num_classes at its default")
    runner_keys = set(inspect.signature(Runner).parameters) - {"model", "work_dir", "cfg", "launcher", "randomness",
                                                               "train_dataloader", "val_dataloader", "test_dataloader",
                                                               "test_cfg", "test_evaluator"}
    runner = Runner(model=segmentor, work_dir=str(work_dir), launcher="none",
                    randomness={**cfg.get("randomness", {}), "seed": seed},
                    train_dataloader={**cfg["train_dataloader"], "dataset": train},
                    val_dataloader={**cfg["val_dataloader"], "dataset": val},
                    cfg={**cfg, "model": {**model, "backbone": backbone_cfg}},
                    **{k: cfg[k] for k in runner_keys if k in cfg})
    metrics = [m for m in runner.val_loop.evaluator.metrics if hasattr(m, "total_area_to_metrics")]
    if len(metrics) != 1:
        raise BadValue(f"{config}: val_evaluator must hold one IoUMetric (mmseg's), not {len(metrics)}")
    seen = _recorder(metrics[0])
    runner.train()  # mmengine's loops evaluate after the last epoch too
    if "per_class" not in seen:  # a loop that stopped early
        runner.val()
    iou = seen["per_class"]["IoU"]
    return {"mIoU": float(np.nanmean(iou)), "pixel_acc": float(seen["per_class"]["aAcc"]),
            "per_class_iou": [None if np.isnan(v) else float(v) for v in iou],
            "mmseg_metrics": {k: float(v) for k, v in seen["summary"].items()},
            "class_names": list(val.metainfo["classes"]), "train_images": len(train), "val_images": len(val),
            "head": segmentor.decode_head.state_dict()}
