"""A minimal sequence transformer for the synthetic tasks, built from the same `SinkBlock`s as the ViTs.

Blocks are attention-only (the MLP is switched off) so that every token-to-token computation goes through
attention and the diagnostics see it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from vitsinks.models import SinkBlock
from vitsinks.models.seam import Backbone, Block
from vitsinks.models.vit import NoMLP

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class SeqModel(nn.Module):
    """Linear embedding -> `depth` attention-only `SinkBlock`s -> linear readout.

    `out_dim=None` fixes the embedding to an orthonormal map of the features into the residual stream and reads
    the whole stream out (targets are embedded the same way, see `embed_target`): every residual dimension is
    then constrained, so "leave this token unchanged" means an attention output of exactly zero, as it does
    for a real residual stream that later layers read.
    """

    def __init__(self, in_dim: int, out_dim: int | None, dim: int = 32, depth: int = 1, heads: int = 1,
                 attn: str = "softmax", causal: bool = False, pathway: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.causal = causal
        self.embed = nn.Linear(in_dim, dim, bias=out_dim is not None)
        if out_dim is None:
            nn.init.orthogonal_(self.embed.weight)
            self.embed.weight.requires_grad_(False)
        self.blocks = nn.ModuleList(
            SinkBlock(dim, heads, attn=attn, qkv_bias=False, proj_bias=False, mlp_layer=NoMLP, global_pathway=pathway)
            for _ in range(depth))
        self.head = nn.Linear(dim, out_dim) if out_dim is not None else nn.Identity()

    def embed_target(self, y: torch.Tensor) -> torch.Tensor:
        """Targets in feature space -> targets of the model's output (embedded when the whole stream is read)."""
        return self.embed(y).detach() if isinstance(self.head, nn.Identity) else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for blk in self.blocks:
            h = blk(h, is_causal=self.causal)
        return self.head(h)

    def backbone(self, num_prefix: int = 0) -> Backbone:
        """The model as the interventions and diagnostics read it (`vitsinks.models.seam.Backbone`, `causal` as the
        model is): features -> tokens (`embed`), its blocks, `head` as the readout; `num_prefix` (0 or 1) leading
        tokens (the BOS of the NOP task) are no content, counted as the [CLS] slot. Evaluation mode."""
        self.eval()
        blocks = cast("list[Block]", list(self.blocks))
        return Backbone(self, "sequence", blocks, self.embed, self.head, num_cls=int(num_prefix), name="sequence model",
                        causal=self.causal)


def train(model: SeqModel, batch_fn: Callable[[torch.Generator], Batch], steps: int, lr: float = 3e-3,
          seed: int = 0, weight_decay: float = 0.0, cosine: bool = True,
          penalty: Callable[[], tuple[torch.Tensor, dict[str, torch.Tensor]]] | None = None) -> list[float]:
    """AdamW on weighted MSE over fresh batches `batch_fn(generator) -> (x, y, weight)`; returns the loss curve.

    The batches depend on `seed` only, so models trained with one seed see the same batches. `penalty` (e.g.
    `vitsinks.objectives.penalty.CommonModePenalty`) adds its term after every forward pass.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps) if cosine else None
    curve = []
    for _ in range(steps):
        x, y, w = batch_fn(gen)
        loss = (((model(x) - model.embed_target(y)) ** 2).mean(-1) * w).sum() / w.sum()
        total = loss + penalty()[0] if penalty is not None else loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        if sched is not None:
            sched.step()
        curve.append(loss.item())
    return curve
