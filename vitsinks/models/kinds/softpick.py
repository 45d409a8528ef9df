"""Softpick attention (Zuhri et al. 2025, arXiv 2504.20966): `softpick(s)_i = relu(exp(s_i) - 1) / sum_j
|exp(s_j) - 1|`. Rows sum to at most 1 and a head can attend to nothing, so softmax's forced sink is gone.

Computed as the paper's reference: with m the row maximum (clamped at 0, so very negative rows do not overflow),
numerator relu(exp(s_i - m) - exp(-m)), denominator sum_j |exp(s_j - m) - exp(-m)| + EPS. Fused (`flex_heads`): two
FlexAttention passes with the log weights log relu(expm1 s) and log |expm1 s| give (out1, lse1) and lse2 = log D,
and sum_j A_ij v_j = out1 exp(lse1) / (exp(lse2) + EPS e^m), with e^m replaced by 1 + exp(lse1) (both in [1, 1 + D]:
exact to float32 rounding; FlexAttention gives no row maximum on CPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vitsinks.models.kinds.kind import KINDS, TINY, AttentionKind, flex_lse

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention

EPS = 1e-8  # the reference implementation's: only matters when every score is exactly 0


def _shifted(s: torch.Tensor, hidden: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(exp(s - m) - exp(-m), with `hidden` keys at 0, m) for scores `s`, without cancellation at small |s|: exp(-m)
    expm1(s) for s <= 0, -exp(s - m) expm1(-s) for s > 0; each branch gets 0 where the other is taken (no inf * 0)."""
    if hidden is not None:
        s = s.masked_fill(hidden, float("-inf"))  # before exp: a hidden score above m must not overflow
    m = s.amax(-1, keepdim=True).clamp_min(0.0)
    pos = s > 0
    sp, sn = torch.where(pos, s, 0.0), torch.where(pos, 0.0, s)
    e = torch.where(pos, -torch.exp(sp - m) * torch.expm1(-sp), torch.exp(-m) * torch.expm1(sn))
    return (e.masked_fill(hidden, 0.0) if hidden is not None else e), m


def _log_abs_expm1(score: torch.Tensor, positive: bool) -> torch.Tensor:
    """log |exp(s) - 1| = relu(s) + log(-expm1(-|s|)) (no overflow at large s), -inf where |s| <= TINY and, with
    `positive`, where s <= 0 (log relu(expm1 s)); masked logs take 1, so their gradients are never NaN."""
    a = score.abs()
    keep = (score > TINY) if positive else (a > TINY)
    return torch.where(keep, torch.relu(score) + torch.log(-torch.expm1(-torch.where(keep, a, 1.0))), float("-inf"))


def _log_numerator(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
                   kv_idx: torch.Tensor) -> torch.Tensor:
    return _log_abs_expm1(score, positive=True)


def _log_denominator(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
                     kv_idx: torch.Tensor) -> torch.Tensor:
    return _log_abs_expm1(score, positive=False)


@KINDS.register
class Softpick(AttentionKind):
    name = "softpick"
    normalised = False
    sparse = True
    flex = True

    @staticmethod
    def matrix(attn: SinkAttention, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        e, _ = _shifted(s, future)
        return F.relu(e) / (e.abs().sum(-1, keepdim=True) + EPS)

    @staticmethod
    def flex_heads(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, lse1 = flex_lse(q, k, v, attn.scale, _log_numerator)
        _, lse2 = flex_lse(q, k, v, attn.scale, _log_denominator)
        # numerator and denominator divided by D = exp(lse2), which overflows float32 for scores above ~88; a row
        # without a positive score (lse1 = -inf, out 0) gives 0, not exp(-inf - -inf)
        lse2 = torch.where(lse1 == float("-inf"), 0.0, lse2)
        ratio = (lse1 - lse2).exp()  # sum of the numerators / D, in [0, 1]
        scale = ratio / (1 + EPS * ((-lse2).exp() + ratio))
        return (out * scale.unsqueeze(-1)).to(v.dtype)

    @staticmethod
    def redirected(attn: SinkAttention, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """Column s zeroed and the row rescaled to its old sum (as relu), the other keys' weights recomputed shifted
        by their own maximum (off a strong sink they underflow to 0 in A). A row with no positive score off the sink
        stays 0."""
        e, _ = _shifted(s, hidden)
        total = F.relu(e).sum(-1, keepdim=True) / (e.abs().sum(-1, keepdim=True) + EPS)
        rest, _ = _shifted(s, is_sink | hidden)
        rest = F.relu(rest)
        kept = rest.sum(-1, keepdim=True)
        return torch.where(kept == 0, 0.0, rest / kept * total)  # NaN stays NaN

    @staticmethod
    def reference(attn: SinkAttention, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        e = torch.exp(s) - 1
        return torch.relu(e) / e.abs().sum()
