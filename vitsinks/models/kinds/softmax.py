"""Softmax attention, the ViT default: rows sum to 1, so a head that should do nothing needs a sink."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vitsinks.models.kinds.kind import KINDS, AttentionKind

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention


@KINDS.register
class Softmax(AttentionKind):
    name = "softmax"
    fused = True

    @staticmethod
    def matrix(attn: SinkAttention, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        if future is not None:
            s = s.masked_fill(future, float("-inf"))
        return s.softmax(dim=-1)

    @staticmethod
    def fused_heads(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    dropout_p: float) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)

    @staticmethod
    def redirected(attn: SinkAttention, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """The softmax of the scores with the sink key masked out (-inf)."""
        masked = s.masked_fill(is_sink | hidden, float("-inf"))
        empty = masked.amax(-1, keepdim=True) == float("-inf")
        return torch.where(empty, 0.0, masked.softmax(dim=-1))

    @staticmethod
    def reference(attn: SinkAttention, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        e = torch.exp(s - s.max())
        return e / e.sum()
