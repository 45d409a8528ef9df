"""The supervised objective (`objective=supervised`): the dataset's own targets.

- Sink tasks (`data=sinktask_*`): per-patch regression on the residual stream itself (before the final norm), the
  target patch embedded by the frozen isometric patch embedding (`model.patch_embed=orthonormal`), so that "leave
  this patch unchanged" means an attention output of exactly zero; weighted squared error per patch.
- Labelled images: classification by a linear head on the final-norm [CLS] of the centre view, cross-entropy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import Dataset

from vitsinks.data import SinkTask, is_sink_task, read_item
from vitsinks.data.selection import analysis_transform
from vitsinks.models import SinkViT
from vitsinks.objectives.monitors import Embedded
from vitsinks.objectives.objective import OBJECTIVES, Batch, Objective, Runtime, StepTerms
from vitsinks.utils.errors import BadValue, ConfigError


def residual_stream(backbone: SinkViT, images: torch.Tensor) -> torch.Tensor:
    """All tokens after the last block, before the final norm (B, N, dim): `forward_features` without `norm`."""
    return backbone.blocks(backbone.embed_tokens(images))


def embed_targets(backbone: SinkViT, target: torch.Tensor) -> torch.Tensor:
    """Patch-pixel targets (B, P, C * p * p) -> residual-stream targets (B, P, dim) by the frozen patch embedding."""
    proj = backbone.patch_embed.proj
    if proj.bias is not None or proj.weight.requires_grad:
        raise BadValue("the sink tasks need model.patch_embed=orthonormal (a frozen, bias-free isometry), so that "
                         "their targets can be embedded into the residual stream; use the data=sinktask_* preset")
    return target @ proj.weight.reshape(proj.weight.shape[0], -1).T.to(target.dtype)


class SupervisedModel(nn.Module):
    """Backbone + (for classification) a linear head on the final-norm [CLS]."""

    def __init__(self, backbone: SinkViT, num_classes: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.embed_dim, num_classes) if num_classes else None

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (B, C) with a head; else the patch tokens' final residual stream (B, P, dim)."""
        if self.head is not None:
            return self.head(self.backbone(images))
        return residual_stream(self.backbone, images)[:, self.backbone.num_prefix_tokens :]


def dense_loss(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Weighted mean over patches of the squared error norm: sum_i w_i ||pred_i - target_i||^2 / sum_i w_i."""
    err = ((pred.float() - target.float()) ** 2).sum(-1)
    return (err * weight).sum() / weight.sum().clamp_min(1e-12)


def supervised_loss(model: SupervisedModel, out: torch.Tensor, targets: Any) -> dict[str, torch.Tensor]:
    """The loss terms of one batch: {loss, [acc]} (classification) or {loss} (dense regression)."""
    if model.head is not None:
        return {"loss": F.cross_entropy(out.float(), targets),
                "acc": (out.argmax(-1) == targets).float().mean()}
    target, weight = targets
    return {"loss": dense_loss(out, embed_targets(model.backbone, target), weight)}


class SupervisedSamples(Dataset):
    """Sink-task items as they are, labelled images as (centre view, label); a corrupt image is None."""

    def __init__(self, base: Dataset, image_size: int, on_bad_image: str = "skip") -> None:
        self.base, self.on_bad_image = base, on_bad_image
        self.dense = isinstance(base, SinkTask)
        self.transform = None if self.dense else analysis_transform(image_size)
        self.epoch = 0  # the items do not depend on the epoch (the trainer sets it anyway)

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple | None:
        item = read_item(self.base, index, self.on_bad_image)
        if item is None or self.dense:
            return item
        img, label = item
        assert self.transform is not None  # set for every dataset but the sink tasks
        return self.transform(img), label


def collate_supervised(batch: list[Any]) -> tuple[list[torch.Tensor], Any, int]:
    """([images], targets, number of unreadable images): targets are labels (B,) or (target, weight)."""
    good = [b for b in batch if b is not None]
    n_bad = len(batch) - len(good)
    if not good:
        return [], None, n_bad
    images = torch.stack([b[0] for b in good])
    if len(good[0]) == 3:
        return [images], (torch.stack([b[1] for b in good]), torch.stack([b[2] for b in good])), n_bad
    return [images], torch.tensor([b[1] for b in good]), n_bad


def to_device(targets: Any, device: torch.device) -> Any:
    if isinstance(targets, tuple):
        return tuple(t.to(device, non_blocking=True) for t in targets)
    return targets.to(device, non_blocking=True)


@torch.no_grad()
def evaluate(model: SupervisedModel, dataset: SupervisedSamples, device: torch.device, bf16: bool = False,
             max_items: int = 2048, batch_size: int = 256,
             embedded: list[Embedded] | None = None) -> dict[str, float]:
    """`val/loss` and `val/rel_error` (dense) or `val/top1`; `embedded` receives (embeddings, labels) per batch."""
    model.eval()
    n = min(len(dataset), max_items)
    total, still, count = 0.0, 0.0, 0
    for lo in range(0, n, batch_size):
        batch = [b for b in (dataset[i] for i in range(lo, min(n, lo + batch_size))) if b is not None]
        if not batch:
            continue
        [images], targets, _ = collate_supervised(batch)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            if model.head is None:
                out = model(images.to(device))
            else:  # model(images), with the embeddings kept
                feats = model.backbone(images.to(device))
                out = model.head(feats)
        on_device = to_device(targets, device)
        if embedded is not None and model.head is not None:
            embedded.append((feats, on_device))
        terms = supervised_loss(model, out, on_device)
        key = "acc" if model.head is not None else "loss"
        total += float(terms[key]) * len(batch)
        if model.head is None:  # the loss of changing nothing: the input patches as the prediction
            task = cast(SinkTask, dataset.base)  # dense: a sink task's items
            unchanged = torch.stack([task.to_patches(img) for img in images])
            still += float(dense_loss(unchanged, *targets)) * len(batch)
        count += len(batch)
    model.train()
    if model.head is not None:
        return {"val/top1": total / max(count, 1)}
    return {"val/loss": total / max(count, 1), "val/rel_error": total / max(still, 1e-12)}


@OBJECTIVES.register
class Supervised(Objective):
    """The dataset's own targets: logged `loss` (and `acc`); validated as `evaluate` (and the monitors)."""

    name = "supervised"
    bar_metric = "acc"

    def __init__(self, cfg: DictConfig, runtime: Runtime) -> None:
        super().__init__(cfg, runtime)
        if cfg.views.backend != "cpu":  # it trains on single images, not on the multi-crop views
            raise ConfigError(f"views.backend={cfg.views.backend} is for the multi-crop views of objective=lejepa; "
                              f"objective=supervised has none: leave views.backend=cpu")
        self.model: SupervisedModel | None = None  # set by build_model
        self._val: tuple[Dataset, SupervisedSamples] | None = None  # (split, its items), built once

    def train_samples(self, base: Dataset) -> SupervisedSamples:
        return SupervisedSamples(base, self.cfg.views.global_size, self.cfg.data.on_bad_image)

    def collate(self, items: list[Any]) -> Batch:
        return collate_supervised(items)

    def build_model(self, backbone: SinkViT, num_classes: int) -> nn.Module:
        self.model = SupervisedModel(backbone, num_classes)
        return self.model

    def loss_terms(self, net: nn.Module, inputs: list[torch.Tensor], targets: Any) -> StepTerms:
        with self.runtime.autocast():
            out = net(inputs[0].to(self.runtime.device, non_blocking=True))
        assert self.model is not None, "build_model comes first"
        terms = supervised_loss(self.model, out, to_device(targets, self.runtime.device))
        return terms["loss"], terms

    def val_view(self) -> Callable[[Any], torch.Tensor] | None:
        """The centre view of `SupervisedSamples`; none for the sink tasks (per-patch targets, no labelled images)."""
        return None if is_sink_task(self.cfg.data.name) else analysis_transform(self.cfg.views.global_size)

    def validate(self, model: nn.Module, val_set: Dataset) -> dict[str, float]:
        """`evaluate`'s metrics and the monitors' (classification); every rank validates every image."""
        if self._val is None or self._val[0] is not val_set:
            self._val = val_set, self.train_samples(val_set)
        embedded: list[Embedded] = []
        built = cast(SupervisedModel, model)  # what build_model made
        metrics = evaluate(built, self._val[1], self.runtime.device, self.runtime.bf16, embedded=embedded)
        return {**metrics, **(self.monitored(built.backbone, embedded) if embedded else {})}

