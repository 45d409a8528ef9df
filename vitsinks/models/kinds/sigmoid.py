"""Sigmoid attention, sigmoid(s - log N): rows are not normalised, so no forced sink. Fused, exactly: with the score
mod logsigmoid(s - log N) the heads' output is FlexAttention's out * exp(lse) (`flex_heads`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vitsinks.models.kinds.kind import KINDS, AttentionKind, ScoreMod, flex_lse

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention


def log_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """logsigmoid(x) = min(x, 0) - log1p(exp(-|x|)) from elementwise primitives (score mods lower them on every
    backend); exp's argument is a branch (x or -x), not |x|, so the gradient at 0 is 1/2, never NaN."""
    neg = x < 0
    return torch.where(neg, x, 0.0) - torch.log1p(torch.exp(torch.where(neg, x, -x)))


def _score_mod(n: int, like: torch.Tensor) -> ScoreMod:
    """The log weights of `n` keys (on `like`'s device, float32 or wider). log n is a 0-d tensor, not a float: under
    an outer `torch.compile` seeing several lengths a float becomes an unbacked symbol FlexAttention rejects."""
    shift = torch.full((), math.log(n), dtype=torch.promote_types(like.dtype, torch.float32), device=like.device)
    return lambda score, b, h, q_idx, kv_idx: log_sigmoid(score - shift)


@KINDS.register
class Sigmoid(AttentionKind):
    name = "sigmoid"
    normalised = False
    flex = True

    @staticmethod
    def matrix(attn: SinkAttention, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        a = torch.sigmoid(s - math.log(s.shape[-1]))
        return a.masked_fill(future, 0.0) if future is not None else a

    @staticmethod
    def flex_heads(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, lse = flex_lse(q, k, v, attn.scale, _score_mod(k.shape[-2], k))
        return (out * lse.exp().unsqueeze(-1)).to(v.dtype)

    @staticmethod
    def redirected(attn: SinkAttention, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """Column s zeroed and the row rescaled to its old sum, in log space (underflow-safe)."""
        log_a = F.logsigmoid(s - math.log(s.shape[-1])).masked_fill(hidden, float("-inf"))
        log_total = log_a.logsumexp(-1, keepdim=True)
        log_rest = log_a.masked_fill(is_sink, float("-inf"))
        log_kept = log_rest.logsumexp(-1, keepdim=True)
        return torch.where(log_kept == float("-inf"), 0.0, (log_rest + log_total - log_kept).exp())

    @staticmethod
    def reference(attn: SinkAttention, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        return 1 / (1 + torch.exp(-(s - math.log(n))))
