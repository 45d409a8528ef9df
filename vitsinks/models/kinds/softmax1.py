"""Softmax off by one (Miller 2023, "Attention Is Off By One"): `exp(s_i) / (1 + sum_j exp(s_j))`, the sink-logit
kind with its null logit fixed at 0 and nothing learned."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vitsinks.models.kinds.kind import KINDS, AttentionKind
from vitsinks.models.kinds.sink_logit import SinkLogit

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention


@KINDS.register
class Softmax1(SinkLogit):
    name = "softmax1"
    parameters = staticmethod(AttentionKind.parameters)  # none: the null logit is 0
    init_parameters = staticmethod(AttentionKind.init_parameters)

    @staticmethod
    def null_logit(attn: SinkAttention) -> torch.Tensor:
        return attn.qkv.weight.new_zeros(attn.num_heads)
