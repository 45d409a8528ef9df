"""Sigmoid attention, sigmoid(s - log N): rows are not normalised, so no forced sink."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vitsinks.models.kinds import AttentionKind, register_kind


@register_kind
class Sigmoid(AttentionKind):
    name = "sigmoid"
    normalised = False

    @staticmethod
    def matrix(attn: nn.Module, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        a = torch.sigmoid(s - math.log(s.shape[-1]))
        return a.masked_fill(future, 0.0) if future is not None else a

    @staticmethod
    def redirected(attn: nn.Module, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """Column s zeroed and the row rescaled to its old sum, in log space (log A = logsigmoid, sums by
        logsumexp), so rows whose other weights underflow are still right."""
        log_a = F.logsigmoid(s - math.log(s.shape[-1])).masked_fill(hidden, float("-inf"))
        log_total = log_a.logsumexp(-1, keepdim=True)
        log_rest = log_a.masked_fill(is_sink, float("-inf"))
        log_kept = log_rest.logsumexp(-1, keepdim=True)
        return torch.where(log_kept == float("-inf"), 0.0, (log_rest + log_total - log_kept).exp())

    @staticmethod
    def reference(attn: nn.Module, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        return 1 / (1 + torch.exp(-(s - math.log(n))))
