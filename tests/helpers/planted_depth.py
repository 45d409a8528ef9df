"""Planted models whose attention-shape and persistence fields are known in closed form.

`two_heads(s)`: one block, 4 tokens, 2 heads. Head 0 gives key 0 a score lead s over the others at every query
(A_i0 = e^s / (e^s + 3)): its column sums are 4 A_i0 and 4 (1 - A_i0) / 3 three times, so concentration = e^s, and its
diagonal mass is (A_00 + 3 (1 - A_00) / 3) / 4 = 1/4. Head 1 gives each query a lead s on itself: every column sums
to 1 (concentration 1) and the diagonal mass is e^s / (e^s + 3). Every value of head 0 is (3, 0, 0, 0) and of head 1
(0, 4, 0, 0), so A v is that vector at every query whatever A; the output projection is the identity and LayerScale
halves channel 5: the heads write 3 and 2 per token, shares 3/5 and 2/5, utilisation 1 / (2 (9 + 4) / 25) = 25/26.

`persistent()`: tiny_vit's blocks made (almost) the identity on unit-norm tokens, 3 of them. Block 1's head 0 sends
every query to token 3, its heads 1 and 2 and all of block 2's to token 9 (sink events); block 0's MLP adds 30 to
channel 17 of token 9 and block 1's MLP 30 more there and 15 to channel 5 of token 5. Token 9 is massive (norm > 10 x
the median 1) from block 0, token 5 from block 1; token 9 is a sink in blocks 1..2, token 3 in block 1 only.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from tests.helpers.tiny import near_identity, tiny_vit
from vitsinks.models import SinkBlock

D, N, C = 48, 17, 200.0  # tiny_vit's width and tokens; the sink heads' query scale: scores +-C / 4 = +-50
A = 1 / math.sqrt(D)  # every entry of the planted input is +-A: every token has norm 1
SINKS = {1: (3, 9, 9), 2: (9, 9, 9)}  # block -> each head's sink token
FLAG = {9: 1, 3: 2}  # sink token -> the channel that marks it (+A there, -A at every other token)
PLANTS = {0: {9: (17, 30.0)}, 1: {9: (17, 30.0), 5: (5, 15.0)}}  # block -> token -> (channel, added to its MLP output)


def two_heads(s: float) -> tuple[SinkBlock, torch.Tensor]:
    """The block and its input (1, 4, 8) of `two_heads` in the module docstring."""
    blk = SinkBlock(8, 2, qkv_bias=False, init_values=1.0)
    blk.norm1 = nn.Identity()
    x = torch.cat([torch.eye(4), torch.ones(4, 1), torch.zeros(4, 3)], dim=1)  # token t: e_t, and 1 in channel 4
    w = torch.zeros(24, 8)
    w[0, 4] = 2 * s  # head 0: q = (2s, 0, 0, 0) everywhere, k = (is token 0, ...): score s at key 0 (scale 1/2)
    w[8, 0] = 1.0
    for d in range(4):  # head 1: q = 2s e_t, k = e_t: score s at the query itself
        w[4 + d, d] = 2 * s
        w[12 + d, d] = 1.0
    w[16, 4] = 3.0  # head 0's value (3, 0, 0, 0), head 1's (0, 4, 0, 0) at every token
    w[21, 4] = 4.0
    gamma = torch.ones(8)
    gamma[5] = 0.5
    with torch.no_grad():
        blk.attn.qkv.weight.copy_(w)
        blk.attn.proj.weight.copy_(torch.eye(8))
        blk.attn.proj.bias.zero_()
        blk.ls1.gamma.copy_(gamma)
    return blk, x[None]


def planted_norm(v: float) -> float:
    """The norm of a unit-norm planted token after adding `v` to one of its +A entries."""
    return math.sqrt(1 - A**2 + (A + v) ** 2)


def persistent(images: int = 2) -> tuple[list[nn.Module], torch.Tensor]:
    """The blocks and input (images, N, D) of `persistent` in the module docstring."""
    torch.manual_seed(0)
    blocks = list(tiny_vit(depth=3).blocks)
    near_identity(blocks)
    with torch.no_grad():
        for b, keys in SINKS.items():
            blk = blocks[b]
            blk.norm1 = nn.Identity()
            w = torch.zeros_like(blk.attn.qkv.weight)
            w[2 * D:] = blk.attn.qkv.weight[2 * D:]  # values stay random
            for h, key in enumerate(keys):
                w[h * 16, 0] = C / A  # q = (C, 0, ...) at every token (channel 0 is +A everywhere)
                w[D + h * 16, FLAG[key]] = 1 / A  # k = (+1 at the head's sink, -1 elsewhere)
            blk.attn.qkv.weight.copy_(w)
            blk.attn.qkv.bias.zero_()
    for b, plants in PLANTS.items():
        blocks[b].mlp.register_forward_hook(_adder(plants))
    g = torch.Generator().manual_seed(1)
    x = (torch.randint(0, 2, (images, N, D), generator=g) * 2 - 1).float()
    x[..., 0] = 1
    for token, c in FLAG.items():
        x[..., c] = -1
        x[:, token, c] = 1
    for plants in PLANTS.values():
        for t, (c, _) in plants.items():
            x[:, t, c] = 1  # the plant adds to +A: |h| = A + V
    return blocks, x * A


def _adder(plants: dict[int, tuple[int, float]]) -> Any:
    def add(_module: nn.Module, _inputs: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        for t, (c, v) in plants.items():
            out[:, t, c] += v
        return out

    return add
