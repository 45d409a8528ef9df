"""Explicit attention biases (Sun et al. 2024, "Massive Activations in Large Language Models", Sec. 4.3): one learnable
key k' and value v' per head in every block, an extra key every query can attend to (the key layout's slot `bias`),

    Attention(Q, K, V; k', v') = softmax(Q [K; k'^T]^T / sqrt(d_h)) [V; v'^T]

k' and v' normal with std 0.02 as the paper's code; k' enters after the key norm (it is a parameter, not a token's
projection). Config: `model.attn_bias=true|false`; state dict: `attn.attn_bias.{k,v}` (1, heads, 1, head_dim).
"""

from __future__ import annotations

import torch
from torch import nn

from vitsinks.models.mitigations.mitigation import MITIGATIONS, SwitchMitigation

INIT_STD = 0.02  # the paper's code: torch.nn.init.normal_(k_bias / v_bias, std=0.02)


class AttentionBias(nn.Module):
    """k' and v' of every head, (1, heads, 1, head_dim) each."""

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.k = nn.Parameter(torch.empty(1, num_heads, 1, head_dim))
        self.v = nn.Parameter(torch.empty(1, num_heads, 1, head_dim))
        self.init_weights()

    def init_weights(self) -> None:
        """Normal, std 0.02 (the paper's init)."""
        nn.init.normal_(self.k, std=INIT_STD)
        nn.init.normal_(self.v, std=INIT_STD)

    def keys(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k', v') for a batch, each (batch, heads, 1, head_dim)."""
        return self.k.expand(batch, -1, -1, -1), self.v.expand(batch, -1, -1, -1)


@MITIGATIONS.register
class AttentionBiasMitigation(SwitchMitigation):
    name = "attn_bias"
    site = "keys"
    attr = "attn_bias"
    slots = ("bias",)
    # v' is the same in every image: a donor's, a shuffled or a held-out mean v' is v' itself
    slot_edits = ("zero_sink_value", "noise_sink_value", "donor_nonsink_value")

    @classmethod
    def build(cls, setting: bool, dim: int, num_heads: int) -> AttentionBias:
        return AttentionBias(num_heads, dim // num_heads)
