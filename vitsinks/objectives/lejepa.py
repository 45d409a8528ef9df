"""The LeJEPA objective (lightly's SIGReg + invariance term) and the model it trains, and the common-mode penalty
that any objective can add (docs/fidelity.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch
from lightly.loss.lejepa_loss import SIGReg, lejepa_invariance_loss
from lightly.models.modules import LeJEPAProjectionHead
from torch import nn

from vitsinks.configs.schema import ObjectiveConfig
from vitsinks.models import SinkBlock, SinkViT
from vitsinks.models.pathway import CM_EPS
from vitsinks.utils.distributed import differentiable_sum, is_distributed
from vitsinks.utils.errors import BadValue


class LossTerms(NamedTuple):
    """The total loss and its parts (kept apart for logging and for NaN reports)."""

    loss: torch.Tensor
    sigreg: torch.Tensor
    invariance: torch.Tensor


class LeJEPAObjective(nn.Module):
    """`lamb * SIGReg(all views) + (1 - lamb) * invariance(all views, global views)`.

    Equal to `lightly.loss.LeJEPALoss` when there are local views; written from lightly's two parts so that the
    paper recipe (global views only) and its own lambda / slice count work too.

    `objective.sigreg` chooses what SIGReg tests for Gaussianity: `per_view_global` (lightly's on (V, N, D): one
    statistic per view over the global batch's N samples, averaged over views; the statistic's sums all-reduced
    under DDP) or `pooled_per_rank` (the reference's: the V x N projections of a rank pooled into one statistic of
    V x N samples, no all-reduce; DDP then averages the gradients). The statistic grows with its sample count,
    so the two differ in scale as well as in what must be Gaussian.
    """

    def __init__(self, cfg: ObjectiveConfig, gather_distributed: bool = False) -> None:
        super().__init__()
        if not 0.0 <= cfg.lamb <= 1.0:
            raise BadValue(f"objective.lamb must be in [0, 1], got {cfg.lamb}")
        self.lamb = cfg.lamb
        self.pooled = str(getattr(cfg, "sigreg", "per_view_global")) == "pooled_per_rank"
        self.sigreg = SIGReg(knots=cfg.knots, num_vectors=cfg.slices,
                             gather_distributed=gather_distributed and not self.pooled)

    def forward(self, global_proj: torch.Tensor, local_proj: torch.Tensor | None = None) -> LossTerms:
        """`global_proj` (Vg, B, D) and optional `local_proj` (Vl, B, D) projections."""
        all_proj = global_proj if local_proj is None else torch.cat([global_proj, local_proj], dim=0)
        sig = self.sigreg(all_proj.reshape(1, -1, all_proj.shape[-1]) if self.pooled else all_proj)
        inv = lejepa_invariance_loss(all_proj=all_proj, global_proj=global_proj)
        return LossTerms(self.lamb * sig + (1.0 - self.lamb) * inv, sig, inv)


def online_probe(dim: int, num_classes: int) -> nn.Sequential:
    """The online linear probe of LeJEPA runs: LayerNorm + Linear on the final-norm [CLS]."""
    return nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))


class LeJEPAModel(nn.Module):
    """Backbone + LeJEPA projector + online probe (LayerNorm + Linear on the detached final-norm [CLS])."""

    def __init__(self, backbone: SinkViT, cfg: ObjectiveConfig, num_classes: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = LeJEPAProjectionHead(backbone.embed_dim, cfg.proj_hidden, cfg.proj_out, cfg.proj_layers)
        self.probe = online_probe(backbone.embed_dim, num_classes)

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


class CommonModePenalty:
    """`lambda_B * mean_l pen_l`, the mean over the blocks after `cm_skip_blocks` (as the reference's ViT trainer),
    pen_l = E(mean_i o_i) / (E(o) + 1e-12) of block
    l's attention update o over the global batch: each term is averaged over the step's forward passes (LeJEPA's
    global and local views) and, under DDP, over the ranks (a differentiable all-reduce) before the ratio, so several
    ranks compute what one process would on the whole batch."""

    def __init__(self, blocks: Iterable[SinkBlock], cfg: ObjectiveConfig) -> None:
        self.blocks = list(blocks)
        if cfg.cm_penalty < 0:
            raise BadValue(f"objective.cm_penalty must be >= 0, got {cfg.cm_penalty}")
        if not 0 <= cfg.cm_skip_blocks < len(self.blocks):
            raise BadValue(f"objective.cm_skip_blocks={cfg.cm_skip_blocks} leaves no block to penalise (the model "
                             f"has {len(self.blocks)}): use 0..{len(self.blocks) - 1}")
        self.lamb, self.skip = cfg.cm_penalty, cfg.cm_skip_blocks
        for blk in self.blocks:
            blk.collect_cm, blk.cm_pre_gate = True, cfg.cm_pre_gate

    def reset(self) -> None:
        for blk in self.blocks:
            blk.cm_terms.clear()

    def __call__(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(lambda_B * the penalty to add to the loss, logged terms: `cm_penalty` and `cm/block<l>`); resets."""
        if any(not blk.cm_terms for blk in self.blocks):
            raise RuntimeError("the common-mode penalty was read before a forward pass with gradients recorded it")
        terms = torch.stack([torch.stack(blk.cm_terms).mean(0) for blk in self.blocks])  # (blocks, 2)
        self.reset()
        if is_distributed():
            terms = differentiable_sum(terms) / torch.distributed.get_world_size()
        per_block = terms[:, 0] / (terms[:, 1] + CM_EPS)
        total = per_block[self.skip :].mean()
        return self.lamb * total, {"cm_penalty": total, **{f"cm/block{i}": p for i, p in enumerate(per_block)}}
