"""The open_clip adapter (small random towers, no hub): views of open_clip's `VisionTransformer` reproduce it and
give the same diagnostics as vitsinks' own ViT on the converted weights, and the same attention and fields as a
float64 recomputation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.adapter_checks import assert_fields_equal_own, assert_fields_match_attention
from tests.helpers.open_clip_models import images, own_twin, tower
from tests.helpers.requirements import require
from vitsinks.diagnostics.core import diagnose_tokens
from vitsinks.pretrained import adapt, diagnose

open_clip = require("open_clip")


@pytest.mark.parametrize("ls", (0.1, None))
@torch.no_grad()
def test_views_reproduce_and_equal_vitsinks_own(ls: float | None) -> None:
    v = tower(ls)
    f, x = adapt(v), images()
    assert f.family == "open_clip" and (f.num_cls, f.num_registers) == (1, 0)
    t = f.embed(x)
    for blk in f.blocks:
        out, _ = blk.forward_explicit(t)
        t = blk(t)
        assert (out - t).abs().max() <= 1e-5 * t.abs().max()
    pooled = f.readout(t)[:, 0] @ v.proj
    torch.testing.assert_close(pooled, v(x), rtol=1e-5, atol=1e-5)

    assert_fields_equal_own(f, own_twin(v, ls), x)


@torch.no_grad()
def test_clip_model_and_timm_tower() -> None:
    clip = open_clip.model.CLIP(16, {"image_size": 32, "patch_size": 8, "width": 48, "layers": 2, "head_width": 16},
                                {"context_length": 8, "vocab_size": 50, "width": 32, "heads": 2, "layers": 1}).eval()
    tabs = diagnose(clip, images(2))
    assert tabs["checks"]["recompute_error"].max() < 1e-4 and len(set(tabs["heads"]["block"])) == 2
    timm_tower = open_clip.model.CLIP(16, {"image_size": 32, "timm_model_name": "vit_tiny_patch16_224",
                                           "timm_model_pretrained": False, "timm_pool": "", "timm_proj": "linear"},
                                      {"context_length": 8, "vocab_size": 50, "width": 32, "heads": 2, "layers": 1})
    assert adapt(timm_tower).family == "timm"


def reference_attention(blk: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """open_clip block `blk`'s attention (B, H, N, N) written out in float64 from its parameters: ln_1, then
    `in_proj_weight` / `in_proj_bias` split into q, k per head, softmax(q k^T / sqrt(head_dim))."""
    a = blk.attn
    H, d = a.num_heads, {k: v.double() for k, v in blk.state_dict().items()}
    z = F.layer_norm(x.double(), (x.shape[-1],), d["ln_1.weight"], d["ln_1.bias"], blk.ln_1.eps)
    qkv = z @ d["attn.in_proj_weight"].T + d["attn.in_proj_bias"]
    B, N, _ = qkv.shape
    q, k, _ = qkv.view(B, N, 3, H, -1).permute(2, 0, 3, 1, 4)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    e = (s - s.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


@torch.no_grad()
def test_attention_and_fields_equal_a_float64_recomputation() -> None:
    v = tower()
    f, x = adapt(v), images()
    t = f.blocks[0](f.embed(x))  # block 1's input
    ref = reference_attention(v.transformer.resblocks[1], t)
    assert (f.blocks[1].attn.internals(f.blocks[1].norm1(t)).attn.double() - ref).abs().max() < 1e-5
    assert_fields_match_attention(diagnose_tokens(f.blocks[1:], t, num_prefix=f.num_prefix), ref, f.num_prefix)
