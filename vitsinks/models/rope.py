"""The 2D rotary position embedding of the patch tokens (`model.rope`), as ViT-5 (Wang et al. 2026, "ViT-5: Vision
Transformers for The Mid-2020s", arXiv 2602.08071) uses it beside the absolute position embedding: axial, the first
half of each head's channels turned by the patch's row, the second half by its column, adjacent channel pairs turned
together by position * 10000^(-i / (head_dim / 4)), i < head_dim / 4 (timm's `RotaryEmbeddingCat`, applied with
`apply_rot_embed_cat`). [CLS] and the registers are not turned. A patch grid other than the model's (a multi-crop
view) is mapped onto the model's: positions i * (model rows / rows), as ViT-5 and EVA rescale them.

A block sees tokens, not the grid: the `SinkViT` tells its one `PatchRope` the grid of every batch it embeds
(`set_grid`), and every block's attention turns the last rows * cols tokens of its q and k with it. The grid is
looked up by the sequence's length first, so that blocks recomputed later (gradient checkpointing, after the
model embedded views of another size) turn their tokens as the forward did.
"""

from __future__ import annotations

import torch
from timm.layers import RotaryEmbeddingCat, apply_rot_embed_cat
from torch import nn

from vitsinks.utils.errors import BadValue

ROPE_THETA = 10000.0  # ViT-5's base frequency for the patches (timm's `temperature`)
KEPT = 8  # grids (by sequence length) and sin | cos tables kept


class PatchRope(nn.Module):
    """The RoPE of the patch tokens of one model (heads of `head_dim` channels, trained on a `grid` of patches),
    shared by all its blocks. It keeps no weights: a state dict is the same with or without it."""

    def __init__(self, head_dim: int, grid: tuple[int, int], theta: float = ROPE_THETA) -> None:
        super().__init__()
        if head_dim % 4:
            raise BadValue(f"model.rope turns pairs of channels by row and by column: it needs a head width divisible "
                           f"by 4, got {head_dim} (embed_dim / num_heads): change model.embed_dim or model.num_heads")
        self.head_dim = int(head_dim)
        self.embed = RotaryEmbeddingCat(head_dim, temperature=theta, in_pixels=False, ref_feat_shape=list(grid))
        self.grid = (int(grid[0]), int(grid[1]))  # the patch grid of the batch embedded last
        self.max_prefix: int | None = None  # at most this many tokens before its patches (None: any)
        self._grids: dict[int, tuple[int, int]] = {}  # sequence length as embedded -> its grid
        self._tables: dict[tuple, torch.Tensor] = {}

    def set_grid(self, grid: tuple[int, int], prefix: int) -> None:
        """The patch grid (rows, cols) of the batch being embedded, after `prefix` tokens ([CLS], registers)."""
        self.grid, self.max_prefix = (int(grid[0]), int(grid[1])), int(prefix)
        self._grids.pop(prefix + self.grid[0] * self.grid[1], None)
        self._grids[prefix + self.grid[0] * self.grid[1]] = self.grid
        while len(self._grids) > KEPT:
            self._grids.pop(next(iter(self._grids)))

    def grid_of(self, n: int) -> tuple[tuple[int, int], int]:
        """(the patch grid, the tokens before the patches) of a sequence of `n` tokens: the grid of an embedded
        sequence that long, else the last grid embedded (with tokens added or dropped before its patches)."""
        grid = self._grids.get(n, self.grid)
        prefix = n - grid[0] * grid[1]
        if prefix < 0 or (n not in self._grids and self.max_prefix is not None and prefix > self.max_prefix):
            raise BadValue(f"the rotary position embedding holds the {grid[0]}x{grid[1]} patch grid of the images "
                           f"embedded last, not a sequence of {n} tokens: embed the images with the model "
                           f"(embed_tokens) before running its blocks")
        return grid, prefix

    def table(self, grid: tuple[int, int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The sin | cos table (rows * cols, 2 * head_dim) of `grid`."""
        key = (grid, device, dtype, self.embed.bands.dtype, torch.is_inference_mode_enabled())
        if key not in self._tables:
            if len(self._tables) >= KEPT:
                self._tables.clear()
            self._tables[key] = self.embed.get_embed(list(grid), dtype=dtype).to(device)
        return self._tables[key]

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k (B, heads, N, head_dim) of N tokens whose last rows * cols are the patches, those turned."""
        grid, prefix = self.grid_of(q.shape[-2])
        emb = self.table(grid, q.device, torch.promote_types(q.dtype, torch.float32))
        q, k = (torch.cat([t[..., :prefix, :], apply_rot_embed_cat(t[..., prefix:, :], emb)], dim=-2) for t in (q, k))
        return q, k
