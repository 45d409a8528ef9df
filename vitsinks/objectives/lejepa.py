"""The LeJEPA objective (`objective=lejepa`, the default): lightly's SIGReg + invariance term on multi-crop views, the
model it trains (backbone + projector + online probe) and the probe's validation."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from lightly.loss.lejepa_loss import SIGReg, lejepa_invariance_loss
from lightly.models.modules import LeJEPAProjectionHead
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import Dataset

from vitsinks.configs.schema import ObjectiveConfig
from vitsinks.data import is_sink_task
from vitsinks.data.crops import SeededViews, collate_views, view_transform
from vitsinks.data.device_crops import CropFlipViews, DeviceViews, ViewBatch, collate_crops, view_specs
from vitsinks.data.selection import selection_transform
from vitsinks.models import SinkViT
from vitsinks.objectives.monitors import Embedded, ProbeBatch, embed, probe_batches
from vitsinks.objectives.objective import OBJECTIVES, Batch, Objective, Runtime, StepTerms
from vitsinks.utils.distributed import all_reduce_sum, rank_world, sync_batchnorm
from vitsinks.utils.errors import ConfigError


class LossTerms(NamedTuple):
    """The total loss and its parts (kept apart for logging and for NaN reports)."""

    loss: torch.Tensor
    sigreg: torch.Tensor
    invariance: torch.Tensor


class LeJEPALoss(nn.Module):
    """`lamb * SIGReg(all views) + (1 - lamb) * invariance(all views, global views)`, from lightly's two parts;
    `objective.sigreg` and `objective.loss_in_autocast` choose lightly's or the reference's form (docs/fidelity.md)."""

    def __init__(self, cfg: ObjectiveConfig, gather_distributed: bool = False) -> None:
        super().__init__()
        self.lamb = cfg.lamb
        self.pooled = cfg.sigreg == "pooled_per_rank"
        self.in_autocast = bool(cfg.loss_in_autocast)
        if self.in_autocast and not self.pooled:
            raise ConfigError(f"objective.loss_in_autocast=true is the reference's loss: it needs "
                              f"objective.sigreg=pooled_per_rank (got {cfg.sigreg})")
        self.sigreg = SIGReg(knots=cfg.knots, num_vectors=cfg.slices,
                             gather_distributed=gather_distributed and not self.pooled)

    def forward(self, global_proj: torch.Tensor, local_proj: torch.Tensor | None = None) -> LossTerms:
        """`global_proj` (Vg, B, D) and optional `local_proj` (Vl, B, D) projections, inside the run's autocast."""
        if self.in_autocast:
            return self._terms(global_proj, local_proj)
        kind = global_proj.device.type
        # out of the caller's autocast (a device without autocast, e.g. the meta tensors of `bench.flops`, has none)
        with torch.autocast(kind, enabled=False) if torch.amp.is_autocast_available(kind) else nullcontext():
            return self._terms(global_proj.float(), None if local_proj is None else local_proj.float())

    def _terms(self, global_proj: torch.Tensor, local_proj: torch.Tensor | None) -> LossTerms:
        all_proj = global_proj if local_proj is None else torch.cat([global_proj, local_proj], dim=0)
        # the invariance term first, as the reference's trainer: autograd then sums the gradient parts of the
        # projections in the reference's order (bitwise under bf16, not only equal up to the last bit)
        inv = lejepa_invariance_loss(all_proj=all_proj, global_proj=global_proj)
        sig = self.sigreg(all_proj.reshape(1, -1, all_proj.shape[-1]) if self.pooled else all_proj)
        return LossTerms(self.lamb * sig + (1.0 - self.lamb) * inv, sig, inv)


def online_probe(dim: int, num_classes: int) -> nn.Sequential:
    """The online linear probe of LeJEPA runs: LayerNorm + Linear on the final-norm [CLS]."""
    return nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))


class LeJEPAModel(nn.Module):
    """Backbone + LeJEPA projector + online probe (`online_probe`, on the detached final-norm [CLS])."""

    def __init__(self, backbone: SinkViT, cfg: ObjectiveConfig, num_classes: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = LeJEPAProjectionHead(backbone.embed_dim, cfg.proj_hidden, cfg.proj_out, cfg.proj_layers)
        self.probe = online_probe(backbone.embed_dim, num_classes)

    def forward(self, views: list[torch.Tensor], n_global: int) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                          torch.Tensor]:
        """Views -> (global projections (Vg, B, D), local ones or None, probe logits (Vg*B, C))."""
        B = views[0].shape[0]
        emb_g = self.backbone(torch.cat(views[:n_global]))
        proj_g = self.projector(emb_g).view(n_global, B, -1)
        proj_l = None
        if len(views) > n_global:
            emb_l = self.backbone(torch.cat(views[n_global:]))
            proj_l = self.projector(emb_l).view(len(views) - n_global, B, -1)
        return proj_g, proj_l, self.probe(emb_g.detach())


def probe_top1(probe: nn.Module, embedded: list[Embedded], runtime: Runtime, shard: tuple[int, int] = (0, 1)) -> float:
    """Top-1 of `probe` on embedded batches (`embed`) in the run's autocast (a collective over a `shard`'s ranks)."""
    correct = torch.zeros((), dtype=torch.long, device=runtime.device)  # read once, at the end
    for f, y in embedded:
        with runtime.autocast():
            logits = probe(f)
        correct += (logits.argmax(-1) == y).sum()
    counts = torch.stack([correct, torch.tensor(sum(len(y) for _, y in embedded), device=runtime.device)])
    if shard[1] > 1:
        counts = all_reduce_sum(counts)
    correct, total = counts.tolist()
    return correct / max(total, 1)


@torch.no_grad()
def probe_accuracy(model: LeJEPAModel, val_set: Dataset, cfg: DictConfig, runtime: Runtime,
                   max_images: int = 2048, shard: tuple[int, int] = (0, 1),
                   batches: list[ProbeBatch] | None = None) -> float:
    """Top-1 of the online probe on up to `max_images` validation images (`probe_batches`, or the kept `batches`)."""
    model.eval()
    if batches is None:
        batches = probe_batches(val_set, cfg, max_images, shard)
    return probe_top1(model.probe, embed(model.backbone, batches, runtime.device, runtime.autocast), runtime, shard)


@OBJECTIVES.register
class LeJEPA(Objective):
    """LeJEPA on multi-crop views with the online probe on the detached [CLS]: logged `loss`, `sigreg`,
    `invariance`, `probe_loss`, `probe_acc`; validation `val/probe_acc`."""

    name = "lejepa"
    probe_prefixes = ("probe.",)
    bar_metric = "probe_acc"
    nan_advice = "Lower train.lr (or raise objective.lamb)"

    def __init__(self, cfg: DictConfig, runtime: Runtime) -> None:
        super().__init__(cfg, runtime)
        if is_sink_task(cfg.data.name):
            raise ConfigError(f"data={cfg.data.name} has per-patch targets, not images for LeJEPA views: train it "
                              "with objective=supervised")
        self.loss = LeJEPALoss(cfg.objective, gather_distributed=runtime.world > 1).to(runtime.device)
        # views.backend=device: the workers crop and flip, the photometric part runs here (vitsinks.data.device_crops)
        self.device_views = (DeviceViews(view_specs(cfg.views), runtime.device) if cfg.views.backend == "device"
                             else None)
        self._val: tuple[Dataset, list[ProbeBatch]] | None = None  # (split, this rank's decoded share), kept

    def train_samples(self, base: Dataset) -> Dataset:
        v = self.cfg.views
        transform = view_transform(v) if self.device_views is None else CropFlipViews(view_specs(v))
        return SeededViews(base, transform, self.cfg.seed, self.cfg.data.on_bad_image)

    def collate(self, items: list[Any]) -> Batch:
        return collate_views(items) if self.device_views is None else collate_crops(items)  # type: ignore[return-value]

    def device_views_of(self, inputs: list[torch.Tensor] | ViewBatch) -> list[torch.Tensor]:
        """A batch's views on the device, normalised (`views.backend=device`: the photometric part applied there)."""
        if isinstance(inputs, ViewBatch):
            assert self.device_views is not None, "a ViewBatch comes from views.backend=device"
            return self.device_views(inputs)
        return [v.to(self.runtime.device, non_blocking=True) for v in inputs]

    def build_model(self, backbone: SinkViT, num_classes: int) -> nn.Module:
        model = LeJEPAModel(backbone, self.cfg.objective, num_classes)
        if self.cfg.objective.projector_bn == "global_batch":  # per_rank: BatchNorm per GPU
            sync_batchnorm(model, self.runtime.device)
        return model

    def loss_terms(self, net: nn.Module, inputs: list[torch.Tensor], targets: Any) -> StepTerms:
        """The LeJEPA loss plus the online probe's cross-entropy (the probe sees detached embeddings only)."""
        n_global = self.cfg.views.n_global
        views = self.device_views_of(inputs)
        labels = targets.to(self.runtime.device, non_blocking=True).repeat(n_global)
        with self.runtime.autocast():
            proj_g, proj_l, logits = net(views, n_global)
            terms = self.loss(proj_g, proj_l)  # in fp32 unless objective.loss_in_autocast
        probe_loss = F.cross_entropy(logits.float(), labels)
        acc = (logits.argmax(-1) == labels).float().mean()
        return terms.loss + probe_loss, {"loss": terms.loss, "sigreg": terms.sigreg, "invariance": terms.invariance,
                                         "probe_loss": probe_loss, "probe_acc": acc}

    def val_view(self) -> Callable[[Any], torch.Tensor]:
        return selection_transform(self.cfg.views.global_size, self.cfg.selection)

    @torch.no_grad()
    def validate(self, model: nn.Module, val_set: Dataset) -> dict[str, float]:
        """`val/probe_acc` and the monitors, sharded over the ranks (each decodes its share once per run)."""
        shard = rank_world() if self.runtime.world > 1 else (0, 1)
        if self._val is None or self._val[0] is not val_set:
            self._val = val_set, probe_batches(val_set, self.cfg, shard=shard, pin=self.runtime.device.type == "cuda")
        model.eval()
        built = cast(LeJEPAModel, model)  # what build_model made
        embedded = embed(built.backbone, self._val[1], self.runtime.device, self.runtime.autocast)
        return {"val/probe_acc": probe_top1(built.probe, embedded, self.runtime, shard),
                **self.monitored(built.backbone, embedded, shard)}
