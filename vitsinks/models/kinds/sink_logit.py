"""Softmax with one extra, always-present key of zero value and a learnable per-head logit c: a head can put its mass
on the null key (the key layout's last slot) instead of on a token.

Fused, exactly: A_ij = softmax_j(s_ij) * sigmoid(lse_i - c), so the heads' output is FlexAttention's softmax output
times sigmoid(lse - c) (`flex_heads`); the SDPA path appends the zero key and a dense bias (`fused_heads`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn

from vitsinks.models.kinds.kind import KINDS, AttentionKind, HeadSpec, flex_lse

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention


@KINDS.register
class SinkLogit(AttentionKind):
    name = "sink_logit"
    fused = True
    flex = True
    null_key = True

    @staticmethod
    def parameters(spec: HeadSpec) -> dict[str, nn.Parameter]:
        return {"sink_logit": nn.Parameter(torch.zeros(spec.num_heads, device=spec.device, dtype=spec.dtype))}

    @staticmethod
    def init_parameters(attn: SinkAttention) -> None:
        nn.init.zeros_(cast(nn.Parameter, attn.sink_logit))  # registered by `parameters`

    @staticmethod
    def null_logit(attn: SinkAttention) -> torch.Tensor:
        """The null key's logit per head, (heads,)."""
        return cast(nn.Parameter, attn.sink_logit)

    @classmethod
    def matrix(cls, attn: SinkAttention, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        """Softmax over [scores, per-head null logit]: the null key's column last."""
        if future is not None:
            s = s.masked_fill(future, float("-inf"))
        null = cls.null_logit(attn).to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        return torch.cat([s, null], dim=-1).softmax(dim=-1)

    @classmethod
    def fused_heads(cls, attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    dropout_p: float) -> torch.Tensor:
        # one extra key with zero value; q . 0 = 0, so an additive bias on that column sets its logit
        B, H, N, D = k.shape
        zeros = k.new_zeros(B, H, 1, D)
        bias = torch.cat([k.new_zeros(1, H, 1, N), cls.null_logit(attn).to(k.dtype).view(1, H, 1, 1)], dim=-1)
        return F.scaled_dot_product_attention(
            q, torch.cat([k, zeros], dim=2), torch.cat([v, zeros], dim=2), attn_mask=bias, dropout_p=dropout_p
        )

    @classmethod
    def flex_heads(cls, attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, lse = flex_lse(q, k, v, attn.scale)
        keep = torch.sigmoid(lse - cls.null_logit(attn).to(lse.dtype).view(1, -1, 1))  # 1 - the null key's share
        return (out * keep.unsqueeze(-1)).to(v.dtype)

    @classmethod
    def redirected(cls, attn: SinkAttention, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """The softmax over [scores, null logit] with the sink key (a token or the null key) masked out."""
        null = cls.null_logit(attn)[head].to(s.dtype).expand(*s.shape[:-1], 1)
        return torch.cat([s, null], dim=-1).masked_fill(is_sink | hidden, float("-inf")).softmax(dim=-1)

    @classmethod
    def reference(cls, attn: SinkAttention, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        full = torch.cat([s, cls.null_logit(attn)[head : head + 1].to(s.dtype)])
        e = torch.exp(full - full.max())
        return e / e.sum()  # the null key's share last
