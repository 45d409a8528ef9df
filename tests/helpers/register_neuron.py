"""A planted register neuron (used by the register-neuron and test-time register tests): one MLP unit of a tiny
ViT that fires at one patch only and writes a massive vector there."""

from __future__ import annotations

import torch

from vitsinks.models import SinkViT

C0 = 0  # the channel only the planted token carries into the register block
PATCH = 5  # the planted patch (sequence index 1 + PATCH without registers)
UNIT = 17  # the planted MLP unit
THRESHOLD, GAIN, WRITE = 2.5, 8.0, 50.0  # unit fires above THRESHOLD in LayerNorm units; writes WRITE x median norm


@torch.no_grad()
def plant_register_neuron(model: SinkViT, x: torch.Tensor, block: int = 1) -> SinkViT:
    """Edit `model` in place: channel C0 of the residual stream is 0 at every token but patch PATCH, where it holds
    6 x the typical per-channel spread (the stream measured on `x`), up to `block`; unit UNIT of `block` reads C0
    through its LayerNorm (it fires only at PATCH) and writes there a vector of WRITE x the median token norm."""
    model.eval()
    model.patch_embed.proj.weight[C0] = 0
    model.patch_embed.proj.bias[C0] = 0
    model.cls_token[..., C0] = 0
    model.pos_embed[..., C0] = 0
    for b in range(block + 1):
        blk = model.blocks[b]
        blk.attn.proj.weight[C0] = 0
        blk.attn.proj.bias[C0] = 0
        if b < block:
            blk.mlp.fc2.weight[C0] = 0
            blk.mlp.fc2.bias[C0] = 0
    t = model.embed_tokens(x)
    for blk in model.blocks[:block]:
        t = blk(t)
    spread = t.std().item()
    model.pos_embed[0, 1 + PATCH, C0] = 6 * spread
    blk = model.blocks[block]
    blk.mlp.fc1.weight[UNIT] = 0
    blk.mlp.fc1.weight[UNIT, C0] = GAIN
    blk.mlp.fc1.bias[UNIT] = -GAIN * THRESHOLD
    seen = {}
    handle = blk.mlp.act.register_forward_hook(lambda _m, _i, out: seen.update(a=out[:, 1 + PATCH, UNIT]))
    t = model.embed_tokens(x)
    for b in model.blocks[: block + 1]:
        t = b(t)
    handle.remove()
    median = t.norm(dim=-1).median().item()
    v = torch.randn(model.embed_dim, generator=torch.Generator().manual_seed(1))
    v[C0] = 0
    blk.mlp.fc2.weight[:, UNIT] = v / v.norm() * WRITE * median / seen["a"].mean().item()
    return model


def last_norms(model: SinkViT, x: torch.Tensor) -> torch.Tensor:
    """The token norms (B, N) at the output of the last block, before the final norm."""
    with torch.no_grad():
        t = model.embed_tokens(x)
        for blk in model.blocks:
            t = blk(t)
    return t.norm(dim=-1)
