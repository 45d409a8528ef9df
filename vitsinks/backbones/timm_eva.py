"""timm's `Eva` (DINOv3 in timm, EVA / EVA02, the `vit_*_rope_*` models): pre-norm `EvaBlock`s of `EvaAttention`
(fused or separate q, k, v, optional q/k norm, RoPE on the patches, scale norm, sigmoid gate), LayerScale `gamma_1` /
`gamma_2`. The embedding is timm's `_pos_embed`, whose RoPE the view keeps for the blocks (`GridRope`); the attention
view rotates q and k with timm's `apply_rot_embed_cat`. `EvaAttention` skips a fixed `num_prefix_tokens` in the
rotation, so the block view sets it to each sequence's prefix for the call (`prefix_tokens`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import torch
import torch.nn.functional as F
from timm.layers import apply_rot_embed_cat
from timm.models.eva import Eva, EvaAttention, EvaBlock
from torch import nn

from vitsinks.backbones.adapter import ADAPTERS, Adapter
from vitsinks.backbones.timm_vit import TimmAttention, TimmBlock, timm_backbone
from vitsinks.backbones.views import GridRope, LayerScaleView
from vitsinks.models.seam import Backbone, Block, LinearSite
from vitsinks.utils.errors import BadValue

ROPES = ("RotaryEmbeddingCat", "RotaryEmbeddingDinoV3")  # one (N, 2 * head_dim) sin|cos table for every block


@contextmanager
def prefix_tokens(attn: EvaAttention, prefix: int) -> Iterator[None]:
    """`attn.num_prefix_tokens` set to `prefix` for the duration (see the module docstring)."""
    kept = attn.num_prefix_tokens
    attn.num_prefix_tokens = prefix
    try:
        yield
    finally:
        attn.num_prefix_tokens = kept


class EvaAttentionView(TimmAttention):
    """timm's `EvaAttention`: q, k, v from the fused `qkv` Linear and its `q_bias` / `k_bias` / `v_bias` (or from
    `q_proj`, `k_proj`, `v_proj`), then `q_norm` / `k_norm`, then RoPE on the tokens after the prefix; `norm` (scale
    norm), the sigmoid `gate` and `proj` after the heads (`TimmAttention`)."""

    def __init__(self, attn: EvaAttention, rope: GridRope | None) -> None:
        super().__init__(attn)
        self.rope = rope

    def qkv_weight(self) -> torch.Tensor:
        m = self.module
        return m.qkv.weight if m.qkv is not None else torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight])

    def _qkv(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m, (B, N, _) = self.module, z.shape
        if m.qkv is not None:
            bias = None if m.q_bias is None else torch.cat((m.q_bias, m.k_bias, m.v_bias))
            qkv = F.linear(z, m.qkv.weight, bias).reshape(B, N, 3, self.num_heads, self.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q, k, v = (self.split_heads(p(z)) for p in (m.q_proj, m.k_proj, m.v_proj))
        q, k = m.q_norm(q), m.k_norm(k)
        if self.rope is not None:
            rope, npt = self.rope.get(N)
            half = getattr(m, "rotate_half", False)
            q, k = (torch.cat([t[:, :, :npt], apply_rot_embed_cat(t[:, :, npt:], rope, half=half)], dim=2).type_as(v)
                    for t in (q, k))
        return q, k, v


class EvaBlockView(TimmBlock):
    """timm's `EvaBlock`: x + gamma_1 * attn(norm1(x), rope), then x + gamma_2 * mlp(norm2(x))."""

    def __init__(self, block: EvaBlock, rope: GridRope | None) -> None:
        ls1 = None if block.gamma_1 is None else LayerScaleView(block.gamma_1)
        ls2 = nn.Identity() if block.gamma_2 is None else LayerScaleView(block.gamma_2)
        attn = cast(EvaAttention, block.attn)  # `check_eva`: timm's EvaAttention
        super().__init__(block, EvaAttentionView(attn, rope), ls1, ls2)
        self.rope = rope

    def linears(self) -> Mapping[str, LinearSite]:
        if self.block.attn.qkv is not None and self.block.attn.q_bias is not None:
            raise BadValue("timm's EvaAttention with a fused qkv and q/v biases (the DINOv3 _qkvb models) calls "
                           "F.linear on qkv.weight, never the qkv Linear: W8A8's input hook would miss every call")
        return super().linears()

    def real_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rope is None:
            return self.block(x)
        rope, prefix = self.rope.get(x.shape[1])
        with prefix_tokens(self.block.attn, prefix):
            return self.block(x, rope=rope)


def check_eva(model: Eva) -> None:
    """A `BadValue` naming the first option of `model` that the views do not cover."""
    if getattr(model, "rope_mixed", False) or (model.rope is not None and type(model.rope).__name__ not in ROPES):
        raise BadValue(f"an Eva with a {type(model.rope).__name__} rotary embedding (rope_type 'mixed' or 'mrope'): "
                       f"no adapter for it yet (covered: {', '.join(ROPES)})")
    blocks: Iterable[Any] = model.blocks  # the library's blocks, read by name
    for i, blk in enumerate(blocks):
        if type(blk).forward is not EvaBlock.forward:
            raise BadValue(f"block {i} is a {type(blk).__name__}, not timm's pre-norm EvaBlock (use_post_norm?): no "
                           f"adapter for it yet")
        if type(blk.attn).forward is not EvaAttention.forward:
            raise BadValue(f"block {i}'s attention is a {type(blk.attn).__name__}, not timm's EvaAttention "
                           f"(attn_type='rope'?): no adapter for it yet")
        if blk.attn.num_prefix_tokens != model.num_prefix_tokens:
            raise BadValue(f"block {i}'s attention skips {blk.attn.num_prefix_tokens} prefix tokens in its RoPE, the "
                           f"model has {model.num_prefix_tokens}: an unknown token layout")


@ADAPTERS.register
class TimmEva(Adapter):
    family = "timm_eva"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, Eva)

    @classmethod
    def adapt(cls, model: nn.Module) -> Backbone:
        model = cast(Eva, model)  # `matches` recognised it
        check_eva(model)
        rope = None if model.rope is None else GridRope(model.num_prefix_tokens + 1)  # + 1: a test-time register

        def embed(images: torch.Tensor) -> torch.Tensor:
            """Tokens entering block 0, as `Eva.forward_features` (its RoPE kept in `rope`)."""
            x, rot = model._pos_embed(model.patch_embed(images))
            if rope is not None:
                assert rot is not None  # timm computes it for a model with a rope
                rope.set(rot, rot.shape[-2])
            return model.norm_pre(x)

        blocks: list[Block] = [EvaBlockView(cast(EvaBlock, b), rope) for b in model.blocks]  # `check_eva`
        registers = 0 if model.reg_token is None else int(model.reg_token.shape[1])
        return timm_backbone(model, cls.family, blocks, embed, registers)
