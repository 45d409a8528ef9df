"""timm's `VisionTransformer` (DeiT, AugReg, DINOv2 and its register models, CLIP / SigLIP towers in timm, ...):
pre-norm `Block`s of timm's `Attention` (fused qkv, optional q/k norm, output norm and sigmoid gate, LayerScale).
The layout: `cls_token` (or none), `num_reg_tokens` registers, the patches; the embedding is timm's own."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from timm.layers import Attention
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from vitsinks.backbones.adapter import ADAPTERS, Adapter
from vitsinks.backbones.views import AttentionView, BlockView
from vitsinks.models import SinkViT
from vitsinks.models.mlp import MLPParts, timm_mlp_parts
from vitsinks.models.seam import Backbone
from vitsinks.models.seam import Block as SeamBlock
from vitsinks.utils.errors import BadValue

if TYPE_CHECKING:  # annotations only
    from timm.models.eva import EvaAttention


class TimmAttention(AttentionView):
    """timm's `Attention`: fused `qkv`, `q_norm` / `k_norm`; `norm`, the sigmoid `gate` and `proj` after the heads."""

    def __init__(self, attn: Attention | EvaAttention) -> None:
        super().__init__(attn.num_heads, attn.head_dim, attn.proj, attn.scale, attn.norm)
        self.module: Any = attn  # timm's attention, its submodules read by name (`EvaAttention`'s differ)
        self.gate = attn.gate

    def qkv_weight(self) -> torch.Tensor:
        return self.module.qkv.weight

    def _qkv(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, N, _ = z.shape
        qkv = self.module.qkv(z).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        return self.module.q_norm(q), self.module.k_norm(k), v

    def _gate(self, z: torch.Tensor) -> torch.Tensor | None:
        if self.gate is None:
            return None
        return self.gate(z).sigmoid().view(*z.shape[:2], self.num_heads, self.head_dim)


class TimmBlock(BlockView):
    """timm's `Block` (and `EvaBlock`): x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x)))."""

    mlp: nn.Module  # a timm block always has its MLP

    def __init__(self, block: nn.Module, attn: AttentionView, ls1: nn.Module | None, ls2: nn.Module) -> None:
        b: Any = block  # timm's `Block` or `EvaBlock`
        super().__init__(block, attn, b.norm1, ls1, b.mlp, b.drop_path2)
        self.norm2, self.ls2 = b.norm2, ls2

    def mlp_parts(self) -> MLPParts | None:
        return timm_mlp_parts(self)  # the view has timm's names, `mlp` and `ls2`

    def mlp_residual(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def check_block(i: int, block: nn.Module) -> None:
    """A `BadValue` unless block `i` runs timm's own `Block.forward` over timm's own `Attention.forward`."""
    if type(block).forward is not Block.forward:
        raise BadValue(f"block {i} is a {type(block).__name__}, not timm's pre-norm Block: no adapter for it yet")
    if not isinstance(block.attn, Attention) or type(block.attn).forward is not Attention.forward:
        raise BadValue(f"block {i}'s attention is a {type(block.attn).__name__}, not timm's Attention: no adapter "
                       f"for it yet")


@ADAPTERS.register
class TimmViT(Adapter):
    family = "timm"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, VisionTransformer) and not isinstance(model, SinkViT)

    @classmethod
    def adapt(cls, model: nn.Module) -> Backbone:
        model = cast(VisionTransformer, model)  # `matches` recognised it
        for i, blk in enumerate(model.blocks):
            check_block(i, blk)

        def embed(images: torch.Tensor) -> torch.Tensor:
            """Tokens entering block 0, as `VisionTransformer.forward_features`."""
            return model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))

        timm_blocks: list[Any] = list(model.blocks)  # `check_block`: timm's Blocks of timm's Attention
        blocks: list[SeamBlock] = [TimmBlock(b, TimmAttention(b.attn), b.ls1, b.ls2) for b in timm_blocks]
        return timm_backbone(model, cls.family, blocks, embed, model.num_reg_tokens)


def timm_backbone(model: Any, family: str, blocks: list[SeamBlock], embed: Callable[[torch.Tensor], torch.Tensor],
                  registers: int) -> Backbone:
    """The `Backbone` of a timm model (`VisionTransformer`, `Eva`): its final norm, patch size, head and name, a [CLS]
    where it has `cls_token`; a `BadValue` where timm's `num_prefix_tokens` is not [CLS] + `registers`."""
    num_cls = int(model.cls_token is not None)
    if model.num_prefix_tokens != num_cls + registers:
        raise BadValue(f"timm reports {model.num_prefix_tokens} prefix tokens for {num_cls} [CLS] and "
                       f"{registers} registers: an unknown token layout")
    name = getattr(model, "pretrained_cfg", {}).get("architecture") or type(model).__name__
    head = model.forward_head if model.num_classes else None
    return Backbone(model, family, blocks, embed, model.norm, tuple(model.patch_embed.patch_size), registers, num_cls,
                    head, name)
