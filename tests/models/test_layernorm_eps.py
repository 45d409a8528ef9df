"""LayerNorm eps: the reference's ViT (src/blocks.py Block, src/vit.py VisionTransformer) uses nn.LayerNorm's default
eps 1e-5; `recipe=paper` sets `model.norm_eps=1e-5`, every other preset keeps timm's 1e-6 (DINOv2's own)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vitsinks.configs.schema import load_config, to_container
from vitsinks.models import arch_keys, model_from_config
from vitsinks.train.checkpoint import CheckpointMismatch, check_compatible

# recipe=paper shrunk to a model that runs in milliseconds (everything else is the recipe's)
TINY_PAPER = ["recipe=paper", "model.embed_dim=48", "model.depth=2", "model.num_heads=3", "model.img_size=32",
              "model.patch_size=8", "data.image_size=32", "views.global_size=32"]


def _layer_norms(model: nn.Module) -> list[nn.LayerNorm]:
    return [m for m in model.modules() if isinstance(m, nn.LayerNorm)]


def reference_block(x: torch.Tensor, p: dict[str, torch.Tensor], heads: int) -> torch.Tensor:
    """The reference's `Block.forward` (no gate, no pathway, eval mode) written out from its definition:
    x + ls1 * proj(softmax(q k^T / sqrt(d_h)) v) with q, k, v from qkv(LayerNorm(x), eps 1e-5), then
    x + ls2 * fc2(GELU(fc1(LayerNorm(x), eps 1e-5)))."""
    B, N, D = x.shape
    hd = D // heads
    h = F.layer_norm(x, (D,), p["norm1.weight"], p["norm1.bias"], eps=1e-5)
    qkv = F.linear(h, p["attn.qkv.weight"], p.get("attn.qkv.bias"))
    q, k, v = qkv.reshape(B, N, 3, heads, hd).permute(2, 0, 3, 1, 4)
    a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(hd), dim=-1)
    o = (a @ v).transpose(1, 2).reshape(B, N, D)
    x = x + p["ls1.gamma"] * F.linear(o, p["attn.proj.weight"], p["attn.proj.bias"])
    h = F.layer_norm(x, (D,), p["norm2.weight"], p["norm2.bias"], eps=1e-5)
    m = F.linear(F.gelu(F.linear(h, p["mlp.fc1.weight"], p["mlp.fc1.bias"])), p["mlp.fc2.weight"], p["mlp.fc2.bias"])
    return x + p["ls2.gamma"] * m


def test_the_paper_recipe_builds_every_layernorm_with_the_references_eps() -> None:
    model = model_from_config(load_config(TINY_PAPER).model)
    norms = _layer_norms(model)
    assert len(norms) == 2 * 2 + 1  # norm1, norm2 of both blocks and the final norm
    assert all(n.eps == 1e-5 for n in norms)


@pytest.mark.parametrize("overrides", [[], ["model=dinov2_small", "model.pretrained=null"]])
def test_the_other_presets_keep_timms_eps(overrides: list[str]) -> None:
    cfg = load_config([*overrides, "model.depth=1"])
    assert cfg.model.norm_eps is None
    assert {n.eps for n in _layer_norms(model_from_config(cfg.model))} == {1e-6}


def test_a_paper_block_computes_the_references_block_on_the_same_weights() -> None:
    torch.manual_seed(0)
    model = model_from_config(load_config(TINY_PAPER).model).eval()
    block = model.blocks[0]
    with torch.no_grad():  # LayerScale at 1e-4 would hide the branches: give them weight
        for p in (block.ls1.gamma, block.ls2.gamma, block.norm1.weight, block.norm2.weight):
            p.copy_(0.5 + torch.rand_like(p))
    params = {k: v.detach() for k, v in block.state_dict().items()}
    assert "attn.qkv.bias" not in params  # the sweep's qkv has no bias
    # token features of the scale they have at init (position embedding trunc-normal 0.02): the eps is then ~1% of
    # the variance, so that 1e-6 and 1e-5 differ far beyond float32 rounding
    x = 0.02 * torch.randn(2, 17, 48)
    with torch.no_grad():
        got, want = block(x), reference_block(x, params, heads=3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_norm_eps_is_an_architecture_field_a_checkpoint_of_the_other_eps_is_refused(tmp_path) -> None:
    assert "norm_eps" in arch_keys()
    old = to_container(load_config([]))
    del old["model"]["norm_eps"]  # a checkpoint written before the field: timm's 1e-6, as it was trained
    check_compatible(old, to_container(load_config([])), tmp_path / "last.pt")
    with pytest.raises(CheckpointMismatch, match="norm_eps"):
        check_compatible(old, to_container(load_config(["model.norm_eps=1e-5"])), tmp_path / "last.pt")
