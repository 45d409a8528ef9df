"""Softmax off by one (Miller 2023, "Attention Is Off By One"): `exp(s_i) / (1 + sum_j exp(s_j))`, the sink-logit
kind with its null logit fixed at 0 and nothing learned. A head can switch off by scoring every token below 0; its
null key is the last slot of the key layout, with value 0."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from vitsinks.models.kinds.kind import KINDS
from vitsinks.models.kinds.sink_logit import SinkLogit

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention


@KINDS.register
class Softmax1(SinkLogit):
    name = "softmax1"

    @staticmethod
    def parameters(num_heads: int, device: torch.device | str | None = None,
                   dtype: torch.dtype | None = None) -> dict[str, nn.Parameter]:
        return {}

    @staticmethod
    def init_parameters(attn: SinkAttention) -> None:
        pass

    @staticmethod
    def null_logit(attn: SinkAttention) -> torch.Tensor:
        return attn.qkv.weight.new_zeros(attn.num_heads)
