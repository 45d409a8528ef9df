"""A small randomly initialised open_clip vision tower, vitsinks' own twin of it (its weights converted) and images
of its size. Importing this module skips the tests that do when open_clip is missing (except under CI: `require`)."""

from __future__ import annotations

import torch
from torch import nn

from tests.helpers.requirements import require
from vitsinks.models import SinkViT, load_timm_state_dict

open_clip = require("open_clip")

TOWER = {"image_size": 32, "patch_size": 8, "width": 48, "layers": 2, "heads": 3, "mlp_ratio": 2.0}


def tower(ls: float | None = 0.1) -> nn.Module:
    """A small open_clip vision tower (LayerScale `ls`, None: none) with sharpened attention and a non-trivial [CLS]."""
    torch.manual_seed(0)
    v = open_clip.transformer.VisionTransformer(**TOWER, ls_init_value=ls, output_dim=16)
    with torch.no_grad():
        for blk in v.transformer.resblocks:
            blk.attn.in_proj_weight[:48].mul_(4.0)
            for s in (blk.ls_1, blk.ls_2):
                if hasattr(s, "gamma"):
                    s.gamma.uniform_(0.05, 1.0)
        v.class_embedding.normal_(0, 1.0)
    return v.eval()


def images(n: int = 3) -> torch.Tensor:
    """`n` seeded standard-normal images at the tower's size."""
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def timm_state_dict(v: nn.Module) -> dict[str, torch.Tensor]:
    """An open_clip tower as a timm `VisionTransformer` (pre-norm) state dict."""
    sd = v.state_dict()
    out = {"cls_token": sd["class_embedding"].view(1, 1, -1), "pos_embed": sd["positional_embedding"][None],
           "patch_embed.proj.weight": sd["conv1.weight"]}  # no bias: timm's pre-norm ViTs have none either
    for w in ("weight", "bias"):
        out[f"norm_pre.{w}"], out[f"norm.{w}"] = sd[f"ln_pre.{w}"], sd[f"ln_post.{w}"]
        for i in range(TOWER["layers"]):
            h, t = f"transformer.resblocks.{i}.", f"blocks.{i}."
            out[t + f"attn.qkv.{w}"] = sd[h + f"attn.in_proj_{w}"]
            for a, b in (("attn.out_proj", "attn.proj"), ("ln_1", "norm1"), ("ln_2", "norm2"), ("mlp.c_fc", "mlp.fc1"),
                         ("mlp.c_proj", "mlp.fc2")):
                out[t + f"{b}.{w}"] = sd[h + f"{a}.{w}"]
    for i in range(TOWER["layers"]):
        for a, b in (("ls_1", "ls1"), ("ls_2", "ls2")):
            if f"transformer.resblocks.{i}.{a}.gamma" in sd:
                out[f"blocks.{i}.{b}.gamma"] = sd[f"transformer.resblocks.{i}.{a}.gamma"]
    return out


def own_twin(v: nn.Module, ls: float | None) -> SinkViT:
    """vitsinks' own (pre-norm) ViT with the tower `v`'s weights converted (`timm_state_dict`)."""
    own = SinkViT(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0, qkv_bias=True,
                  num_classes=0, pre_norm=True, init_values=ls, norm_eps=1e-5)
    load_timm_state_dict(own, timm_state_dict(v))
    return own.eval()
