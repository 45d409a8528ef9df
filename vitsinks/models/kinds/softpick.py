"""Softpick attention (Zuhri et al. 2025, arXiv 2504.20966): `softpick(s)_i = relu(exp(s_i) - 1) / sum_j
|exp(s_j) - 1|`. Rows sum to at most 1 and a head can attend to nothing (every score <= 0 gives a zero row), so
softmax's forced sink is gone; the paper reports no sinks and no massive activations.

Computed stably as the paper's reference implementation: with m the row maximum, numerator relu(exp(s_i - m) -
exp(-m)) and denominator sum_j |exp(s_j - m) - exp(-m)| + EPS, future keys of a causal query left out of both. m is
clamped at 0: for m >= 0 this is the reference's computation; a row of very negative scores would otherwise
overflow exp(-m) (and give NaN gradients), while without a positive score exp(s) <= 1 needs no shift.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitsinks.models.kinds import AttentionKind, register_kind

EPS = 1e-8  # the reference implementation's: only matters when every score is exactly 0


def _shifted(s: torch.Tensor, hidden: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(exp(s - m) - exp(-m), with hidden keys at 0, m) for scores `s`; `hidden` marks keys left out."""
    if hidden is not None:
        s = s.masked_fill(hidden, float("-inf"))  # before exp: a hidden score above m must not overflow
    m = s.amax(-1, keepdim=True).clamp_min(0.0)
    e = torch.exp(s - m) - torch.exp(-m)
    return (e.masked_fill(hidden, 0.0) if hidden is not None else e), m


@register_kind
class Softpick(AttentionKind):
    name = "softpick"
    normalised = False

    @staticmethod
    def matrix(attn: nn.Module, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        e, _ = _shifted(s, future)
        return F.relu(e) / (e.abs().sum(-1, keepdim=True) + EPS)

    @staticmethod
    def redirected(attn: nn.Module, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """Column s zeroed and the row rescaled to its old sum (as relu). The other keys' weights are recomputed
        shifted by their own maximum, not the sink's: off a strong sink they underflow to exactly 0 in float32
        A, but their proportions relu(exp(s_j) - 1) survive in the scores. A row with no positive score off the
        sink stays 0."""
        e, _ = _shifted(s, hidden)
        total = F.relu(e).sum(-1, keepdim=True) / (e.abs().sum(-1, keepdim=True) + EPS)
        rest, _ = _shifted(s, is_sink | hidden)
        rest = F.relu(rest)
        kept = rest.sum(-1, keepdim=True)
        return torch.where(kept == 0, 0.0, rest / kept * total)  # NaN stays NaN

    @staticmethod
    def reference(attn: nn.Module, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        e = torch.exp(s) - 1
        return torch.relu(e) / e.abs().sum()
