"""Small randomly initialised timm ViTs in the layouts pretrained ones have (DINOv2-reg-like, DeiT, registers inside
the position embedding, gated attention), vitsinks' own twin of each, images of their size and a planted sink."""

from __future__ import annotations

from typing import Any

import torch
from timm.layers import Attention
from timm.models.vision_transformer import VisionTransformer

from vitsinks.models import SinkViT, load_timm_state_dict


class GatedAttention(Attention):
    """timm's `Attention(gated=True)`: a sigmoid gate of the heads' outputs, elementwise (`VisionTransformer` has no
    flag for it; its `attn_layer` takes this class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, gated=True, **kwargs)


SHAPE = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 2, "num_heads": 3, "qkv_bias": True,
         "num_classes": 5}
CONFIGS = {
    "dinov2_reg": {"reg_tokens": 4, "no_embed_class": True, "qk_norm": True, "init_values": 0.1},  # DINOv2-reg-like
    "deit": {},  # [CLS] with its own position embedding, no registers, no LayerScale
    "layerscale_reg_pos": {"reg_tokens": 2, "init_values": 1e-2},  # registers inside the position embedding
    "gated": {"attn_layer": GatedAttention, "reg_tokens": 2, "init_values": 0.1},  # vitsinks' gate="elementwise"
}


def timm_vit(cfg: dict[str, Any], seed: int = 0) -> VisionTransformer:
    """A small randomly initialised timm ViT with sharpened attention and non-trivial prefix tokens and LayerScale."""
    torch.manual_seed(seed)
    m = VisionTransformer(**SHAPE, **cfg).eval()
    with torch.no_grad():
        for blk in m.blocks:
            blk.attn.qkv.weight.mul_(4.0)
            for ls in (blk.ls1, blk.ls2):
                if hasattr(ls, "gamma"):
                    ls.gamma.uniform_(0.05, 1.0)
        for token in (m.cls_token, m.reg_token):
            if token is not None:
                token.normal_(0, 1.0)
    return m


def own_twin(m: VisionTransformer, cfg: dict[str, Any]) -> SinkViT:
    """vitsinks' own ViT of the same shape with `m`'s weights converted (`load_timm_state_dict`)."""
    own_cfg = {k: v for k, v in cfg.items() if k not in ("no_embed_class", "attn_layer")}
    if cfg.get("attn_layer") is GatedAttention:
        own_cfg["gate"] = "elementwise"
    own = SinkViT(**SHAPE, **own_cfg, register_pos_embed=bool(cfg.get("reg_tokens")) and not cfg.get("no_embed_class"))
    load_timm_state_dict(own, m.state_dict())
    return own.eval()


def images(n: int = 3) -> torch.Tensor:
    """`n` seeded standard-normal images at the models' size."""
    return torch.randn(n, 3, SHAPE["img_size"], SHAPE["img_size"], generator=torch.Generator().manual_seed(1))


def plant_sink(m: VisionTransformer, block: int, head: int, channel: int = 5, token: str = "cls") -> None:
    """Head `head` of block `block` (no q/k norm) attends to [CLS] (`token` "reg": to register 0) from every query:
    every query is one vector u, and only that token (massive in `channel`) has a key along u."""
    a, dim = m.blocks[block].attn, m.embed_dim
    rows = slice(head * a.head_dim, (head + 1) * a.head_dim)
    u = torch.randn(a.head_dim, generator=torch.Generator().manual_seed(2))
    u = u / u.norm()
    with torch.no_grad():
        a.qkv.weight[rows] = 0
        a.qkv.bias[rows] = 3 * u
        k_rows = slice(dim + rows.start, dim + rows.stop)
        a.qkv.weight[k_rows] = 0
        a.qkv.weight[k_rows, channel] = 10 * u
        a.qkv.bias[k_rows] = 0
        (m.cls_token if token == "cls" else m.reg_token)[0, 0, channel] = 50.0
