"""ReLU attention, relu(s) / N: rows are not normalised, so no forced sink."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitsinks.models.kinds import AttentionKind, register_kind


@register_kind
class ReLU(AttentionKind):
    name = "relu"
    normalised = False

    @staticmethod
    def matrix(attn: nn.Module, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        a = F.relu(s) / s.shape[-1]
        return a.masked_fill(future, 0.0) if future is not None else a

    @staticmethod
    def redirected(attn: nn.Module, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """Column s zeroed and the row rescaled to its old sum. relu's zeros are exact: a row with no positive
        score off the sink stays 0."""
        a = (F.relu(s) / s.shape[-1]).masked_fill(hidden, 0.0)
        rest = a.masked_fill(is_sink, 0.0)
        total, kept = a.sum(-1, keepdim=True), rest.sum(-1, keepdim=True)
        return torch.where(kept == 0, 0.0, rest / kept * total)  # NaN stays NaN

    @staticmethod
    def reference(attn: nn.Module, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        return torch.clamp(s, min=0) / n
