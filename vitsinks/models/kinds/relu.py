"""ReLU attention, relu(s) / N: rows are not normalised, so no forced sink.

Fused, exactly: relu(s) = exp(w) with w = log s where s > 0, else -inf, so the heads' output is FlexAttention's out *
exp(lse - log N) (`flex_heads`; a row without a positive score gives 0, as relu's).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vitsinks.models.kinds.kind import KINDS, TINY, AttentionKind, flex_lse

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention


def log_relu(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
             kv_idx: torch.Tensor) -> torch.Tensor:
    """log relu(score), -inf where score <= TINY (the masked log's argument is 1 there: no NaN gradient)."""
    pos = score > TINY
    return torch.where(pos, torch.log(torch.where(pos, score, 1.0)), float("-inf"))


@KINDS.register
class ReLU(AttentionKind):
    name = "relu"
    normalised = False
    sparse = True
    flex = True

    @staticmethod
    def matrix(attn: SinkAttention, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        a = F.relu(s) / s.shape[-1]
        return a.masked_fill(future, 0.0) if future is not None else a

    @staticmethod
    def flex_heads(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, lse = flex_lse(q, k, v, attn.scale, log_relu)
        return (out * (lse - math.log(k.shape[-2])).exp().unsqueeze(-1)).to(v.dtype)

    @staticmethod
    def redirected(attn: SinkAttention, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """Column s zeroed and the row rescaled to its old sum; a row with no positive score off the sink stays 0."""
        a = (F.relu(s) / s.shape[-1]).masked_fill(hidden, 0.0)
        rest = a.masked_fill(is_sink, 0.0)
        total, kept = a.sum(-1, keepdim=True), rest.sum(-1, keepdim=True)
        return torch.where(kept == 0, 0.0, rest / kept * total)  # NaN stays NaN

    @staticmethod
    def reference(attn: SinkAttention, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        return torch.clamp(s, min=0) / n
