"""Head-wise RMSNorm (Li, Jiang, Sun and Hu 2026, "The Structural Origin of Attention Sink: Variance Discrepancy,
Super Neurons, and Dimension Disparity", arXiv 2605.06611): every head's output o = A v of every token divided by
its root mean square over the head's channels, times a learned gain, before the output projection,

    o'_h = g_h * o_h / sqrt(mean_c(o_h,c^2) + eps)

The paper traces sinks to the variance discrepancy of value aggregation, amplified by the feed-forward layers' super
neurons, and proposes this norm to restore the parity of the heads' outputs across positions. Its code is not public:
each head has its own RMSNorm over its head_dim channels (`torch.nn.RMSNorm(head_dim)` per head), gain g_h (head_dim,)
initialised to 1, eps 1e-6, computed in at least float32. An `outputs`-site mitigation: after the attention kind's
`head_output`, before the gate. Config: `model.headnorm=true|false`; state dict: `attn.headnorm.weight` (heads,
head_dim).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitsinks.models.mitigations.mitigation import MITIGATIONS, SwitchMitigation

EPS = 1e-6


class HeadRMSNorm(nn.Module):
    """RMSNorm of each head's output over its head_dim channels with a gain per head: (B, heads, N, hd) -> same."""

    def __init__(self, num_heads: int, head_dim: int, eps: float = EPS) -> None:
        super().__init__()
        self.eps = float(eps)
        self.num_heads = num_heads
        # flat (heads * head_dim,): 1-D like every norm gain, so the optimiser spares it from weight decay
        self.weight = nn.Parameter(torch.empty(num_heads * head_dim))
        self.init_weights()

    def init_weights(self) -> None:
        """Every gain 1: at init the norm only rescales."""
        nn.init.ones_(self.weight)

    def forward(self, heads_out: torch.Tensor) -> torch.Tensor:
        x = heads_out.to(torch.promote_types(heads_out.dtype, torch.float32))
        gain = self.weight.to(x.dtype).view(self.num_heads, 1, -1)
        y = F.rms_norm(x, (x.shape[-1],), eps=self.eps) * gain
        return y.to(heads_out.dtype)


@MITIGATIONS.register
class HeadNormMitigation(SwitchMitigation):
    name = "headnorm"
    site = "outputs"
    attr = "headnorm"
    hub_tag = "head-rmsnorm"

    @classmethod
    def build(cls, setting: bool, dim: int, num_heads: int) -> HeadRMSNorm:
        return HeadRMSNorm(num_heads, dim // num_heads)
