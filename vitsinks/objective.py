"""The LeJEPA objective (lightly's SIGReg + invariance term) and the model it trains."""

from __future__ import annotations

from typing import NamedTuple

import torch
from lightly.loss.lejepa_loss import SIGReg, lejepa_invariance_loss
from lightly.models.modules import LeJEPAProjectionHead
from torch import nn

from vitsinks.config import ObjectiveConfig
from vitsinks.models import SinkViT


class LossTerms(NamedTuple):
    """The total loss and its parts (kept apart for logging and for NaN reports)."""

    loss: torch.Tensor
    sigreg: torch.Tensor
    invariance: torch.Tensor


class LeJEPAObjective(nn.Module):
    """`lamb * SIGReg(all views) + (1 - lamb) * invariance(all views, global views)`.

    Equal to `lightly.loss.LeJEPALoss` when there are local views; written from lightly's two parts so that the
    paper recipe (global views only) and its own lambda / slice count work too.
    """

    def __init__(self, cfg: ObjectiveConfig, gather_distributed: bool = False) -> None:
        super().__init__()
        if not 0.0 <= cfg.lamb <= 1.0:
            raise ValueError(f"objective.lamb must be in [0, 1], got {cfg.lamb}")
        self.lamb = cfg.lamb
        self.sigreg = SIGReg(knots=cfg.knots, num_vectors=cfg.slices, gather_distributed=gather_distributed)

    def forward(self, global_proj: torch.Tensor, local_proj: torch.Tensor | None = None) -> LossTerms:
        """`global_proj` (Vg, B, D) and optional `local_proj` (Vl, B, D) projections."""
        all_proj = global_proj if local_proj is None else torch.cat([global_proj, local_proj], dim=0)
        sig = self.sigreg(all_proj)
        inv = lejepa_invariance_loss(all_proj=all_proj, global_proj=global_proj)
        return LossTerms(self.lamb * sig + (1.0 - self.lamb) * inv, sig, inv)


class LeJEPAModel(nn.Module):
    """Backbone + LeJEPA projector + online probe (LayerNorm + Linear on the detached final-norm [CLS])."""

    def __init__(self, backbone: SinkViT, cfg: ObjectiveConfig, num_classes: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = LeJEPAProjectionHead(backbone.embed_dim, cfg.proj_hidden, cfg.proj_out, cfg.proj_layers)
        self.probe = nn.Sequential(nn.LayerNorm(backbone.embed_dim), nn.Linear(backbone.embed_dim, num_classes))

    def forward(self, views: list[torch.Tensor], n_global: int) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                          torch.Tensor]:
        """Views (each (B, 3, h, w)) -> (global projections (Vg, B, D), local ones or None, probe logits (Vg*B, C)).

        Views of one resolution go through the backbone together (global views, then local views).
        """
        B = views[0].shape[0]
        emb_g = self.backbone(torch.cat(views[:n_global]))
        proj_g = self.projector(emb_g).view(n_global, B, -1)
        proj_l = None
        if len(views) > n_global:
            emb_l = self.backbone(torch.cat(views[n_global:]))
            proj_l = self.projector(emb_l).view(len(views) - n_global, B, -1)
        return proj_g, proj_l, self.probe(emb_g.detach())
