"""open_clip's image towers: `open_clip.transformer.VisionTransformer` of the default `ResidualAttentionBlock`s
(`nn.MultiheadAttention` with a fused `in_proj_weight`, optional LayerScale `ls_1` / `ls_2`), alone or as the `visual`
of a `CLIP` / `CustomTextCLIP`; a `TimmModel` tower's trunk goes to the timm adapter. open_clip is never imported here:
a model is recognised by its class's module and name. Layout: a [CLS] then the patches; the embedding is the tower's
own `_embeds`, the readout `ln_post` over every token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from vitsinks.backbones.adapter import ADAPTERS, Adapter
from vitsinks.backbones.timm_vit import TimmViT
from vitsinks.backbones.views import AttentionView, BlockView
from vitsinks.models.mlp import MLPParts, plain_mlp
from vitsinks.models.seam import Backbone, LinearSite
from vitsinks.utils.errors import BadValue

if TYPE_CHECKING:  # annotations only
    from vitsinks.models.attention import SinkAttention


def _is(model: object, module: str, *names: str) -> bool:
    return type(model).__module__ == module and type(model).__name__ in names


def visual(model: nn.Module) -> Any:
    """The image tower (typed loosely): `model.visual` of a CLIP model, else `model`."""
    return model.visual if _is(model, "open_clip.model", "CLIP", "CustomTextCLIP") else model


class MHAView(AttentionView):
    """`nn.MultiheadAttention` (self-attention, batch first): q, k, v from `in_proj_weight`, `out_proj` after."""

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn or not mha.batch_first:
            raise BadValue("an nn.MultiheadAttention with separate q/k/v weights, bias_k / bias_v, add_zero_attn or "
                           "sequence-first inputs: no adapter for it yet")
        super().__init__(mha.num_heads, mha.head_dim, mha.out_proj)
        self.module = mha

    def qkv_weight(self) -> torch.Tensor:
        return self.module.in_proj_weight

    def _qkv(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = nn.functional.linear(z, self.module.in_proj_weight, self.module.in_proj_bias)
        q, k, v = qkv.chunk(3, dim=-1)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def through_proj(self, _mha: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                     _out: Any) -> tuple[torch.Tensor, None]:
        """A forward hook on the `nn.MultiheadAttention`: its output recomputed with `out_proj` called as a module
        (the fused path applies its weight functionally), so that a hook on `out_proj` sees its input."""
        q, k, v = (args[i] if i < len(args) else kwargs.get(name) for i, name in enumerate(("query", "key", "value")))
        if not (k is q and v is q) or kwargs.get("attn_mask") is not None or kwargs.get("key_padding_mask") is not None:
            raise BadValue("W8A8 on an open_clip block covers its self-attention without masks only")
        # the kinds take a `SinkAttention` (softmax reads nothing off it)
        heads = self.kind.fused_heads(cast("SinkAttention", self), *self._qkv(cast(torch.Tensor, q)), 0.0)
        return self.combine(heads, None), None


class Handles:
    """Several hook handles, removed together."""

    def __init__(self, *handles: RemovableHandle) -> None:
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@dataclass(frozen=True)
class InProj:
    """`nn.MultiheadAttention`'s `in_proj_weight` as a linear layer for W8A8: its input hooked at the block's `ln_1`."""

    attn: MHAView
    norm: nn.Module

    @property
    def weight(self) -> torch.Tensor:
        return self.attn.module.in_proj_weight

    def register_forward_pre_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        def on_output(module: nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor | None:
            new = hook(module, (out,))
            return None if new is None else new[0]
        return self.norm.register_forward_hook(on_output)


@dataclass(frozen=True)
class OutProj:
    """`nn.MultiheadAttention.out_proj` for W8A8: while hooked, the attention's output is recomputed through it."""

    attn: MHAView

    @property
    def weight(self) -> torch.Tensor:
        return self.attn.proj.weight

    def register_forward_pre_hook(self, hook: Callable[..., Any]) -> Handles:
        return Handles(self.attn.proj.register_forward_pre_hook(hook),
                       self.attn.module.register_forward_hook(self.attn.through_proj, with_kwargs=True))


class ResidualBlockView(BlockView):
    """open_clip's `ResidualAttentionBlock`: x + ls_1(attn(ln_1(x))), then x + ls_2(mlp(ln_2(x)))."""

    attn: MHAView
    mlp: nn.Module

    def __init__(self, block: nn.Module) -> None:
        b: Any = block  # open_clip's block, its submodules read by name
        super().__init__(block, MHAView(b.attn), b.ln_1, b.ls_1, b.mlp, b.ls_2)
        self.norm2, self.ls2 = b.ln_2, b.ls_2

    def mlp_parts(self) -> MLPParts | None:
        return plain_mlp(self.mlp, ("c_fc", "gelu", "c_proj"), getattr(self.ls2, "gamma", None))

    def linears(self) -> Mapping[str, LinearSite]:
        """W8A8's layers by a `SinkBlock`'s names: `InProj`, `OutProj`, the MLP's `c_fc` and `c_proj`."""
        mlp = self.block.mlp
        return {"attn.qkv": InProj(self.attn, self.block.ln_1), "attn.proj": OutProj(self.attn), "mlp.fc1": mlp.c_fc,
                "mlp.fc2": mlp.c_proj}


@ADAPTERS.register
class OpenClipViT(Adapter):
    family = "open_clip"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        v = visual(model)
        return _is(v, "open_clip.transformer", "VisionTransformer") or _is(v, "open_clip.timm_model", "TimmModel")

    @classmethod
    def adapt(cls, model: nn.Module) -> Backbone:
        v = visual(model)
        if _is(v, "open_clip.timm_model", "TimmModel"):
            if not TimmViT.matches(v.trunk):
                raise BadValue(f"open_clip's timm tower is a {type(v.trunk).__name__}: no adapter for it yet")
            return TimmViT.adapt(v.trunk)
        if not getattr(v.transformer, "batch_first", True):
            raise BadValue("an open_clip tower with sequence-first blocks: no adapter for it yet")
        for i, blk in enumerate(v.transformer.resblocks):
            if not _is(blk, "open_clip.transformer", "ResidualAttentionBlock") or hasattr(blk, "ln_1_kv"):
                raise BadValue(f"block {i} is a {type(blk).__name__} (open_clip block_type='custom'?): no adapter "
                               f"for it yet")
        if v.attn_pool is not None:
            raise BadValue("an open_clip tower with attentional pooling: no adapter for it yet")
        rows, cols = v.conv1.kernel_size  # an nn.Conv2d's
        patch = (int(rows), int(cols))
        return Backbone(model, cls.family, [ResidualBlockView(b) for b in v.transformer.resblocks], v._embeds,
                       v.ln_post, patch, 0, 1, None, type(model).__name__)
