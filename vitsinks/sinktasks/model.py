"""A minimal sequence transformer for the synthetic tasks: the ViTs' `SinkBlock`s, attention-only (no MLP), so that
every token-to-token computation goes through attention and the diagnostics see it."""

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
    """Linear embedding -> `depth` attention-only `SinkBlock`s -> linear readout; `out_dim=None` freezes the embedding
    to an orthonormal map and reads the whole stream out, so "unchanged" means an attention output of exactly zero."""

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
        """The model as the seam, in eval mode; `num_prefix` leading tokens count as the [CLS] slot."""
        self.eval()
        blocks = cast("list[Block]", list(self.blocks))
        return Backbone(self, "sequence", blocks, self.embed, self.head, num_cls=int(num_prefix), name="sequence model",
                        causal=self.causal)


def train(model: SeqModel, batch_fn: Callable[[torch.Generator], Batch], steps: int, lr: float = 3e-3,
          seed: int = 0, weight_decay: float = 0.0, cosine: bool = True,
          penalty: Callable[[], tuple[torch.Tensor, dict[str, torch.Tensor]]] | None = None) -> list[float]:
    """Train with AdamW on weighted MSE over fresh `batch_fn(generator)` batches seeded by `seed`; the loss curve."""
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
