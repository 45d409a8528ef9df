"""Differential attention (Ye et al. 2024, "Differential Transformer", arXiv 2410.05258; the authors'
`multihead_diffattn.py`): each head's query and key are split into two halves of width hd/2 (consecutive, q1 | q2),
two softmax maps are formed and subtracted, A = softmax(q1 k1^T s) - lambda softmax(q2 k2^T s) with s = (hd/2)^-0.5,
so common-mode attention (a sink both maps share) cancels. The value keeps the head's full width hd.

lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, the four vectors of width hd/2
initialised N(0, 0.1) and, as in the authors' code, shared by the heads of a block; lambda_init = 0.8 - 0.6
exp(-0.3 block) with the 0-based block index (the paper's l - 1). Each head's output A v is normalised by an RMSNorm
over hd (eps 1e-5, a learnable weight shared by the heads, the code's `subln`) and scaled by 1 - lambda_init
(`head_output`). The head count stays the model's: each head is split, not halved as in the paper (docs/variants.md).

Fused, exactly: A v = SDPA(q1, k1, v) - lambda SDPA(q2, k2, v) (`fused_heads`). No FlexAttention path: each map is
plain softmax attention, which SDPA's kernels already run exactly (as for `softmax`); FlexAttention would add nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn

from vitsinks.models.kinds.kind import KINDS, AttentionKind, HeadSpec
from vitsinks.utils.errors import BadValue

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention

LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
NORM = "head_norm_weight"  # the RMSNorm's weight over a head's width
NORM_EPS = 1e-5
LAMBDA_STD = 0.1


def lambda_init(block: int) -> float:
    """lambda's fixed part for the block with 0-based index `block`: 0.8 - 0.6 exp(-0.3 block)."""
    return 0.8 - 0.6 * math.exp(-0.3 * block)


def halves(x: torch.Tensor) -> torch.Tensor:
    """(..., N, hd) -> (..., 2, N, hd/2): the two consecutive halves of each query or key as two maps."""
    return x.unflatten(-1, (2, x.shape[-1] // 2)).transpose(-3, -2)


@KINDS.register
class Diff(AttentionKind):
    name = "diff"
    normalised = False  # rows sum to 1 - lambda
    signed = True
    fused = True

    @staticmethod
    def parameters(spec: HeadSpec) -> dict[str, nn.Parameter]:
        if spec.head_dim % 2:
            raise BadValue(f"attention kind 'diff' splits each head in two halves: head width {spec.head_dim} "
                           f"(embed_dim / num_heads) is odd; choose an embed_dim and num_heads with an even ratio")
        params = {name: nn.Parameter(torch.zeros(spec.head_dim // 2, device=spec.device, dtype=spec.dtype))
                  for name in LAMBDAS}
        return {**params, NORM: nn.Parameter(torch.ones(spec.head_dim, device=spec.device, dtype=spec.dtype))}

    @staticmethod
    def init_parameters(attn: SinkAttention) -> None:
        for name in LAMBDAS:
            nn.init.normal_(cast(nn.Parameter, getattr(attn, name)), mean=0.0, std=LAMBDA_STD)
        nn.init.ones_(cast(nn.Parameter, getattr(attn, NORM)))

    @staticmethod
    def lam(attn: SinkAttention, at_least: torch.dtype = torch.float32) -> torch.Tensor:
        """lambda (a 0-d tensor in the parameters' dtype, `at_least` as wide), shared by the block's heads."""
        q1, k1, q2, k2 = (getattr(attn, name) for name in LAMBDAS)
        wide = torch.promote_types(q1.dtype, at_least)
        dot = (q1.to(wide) * k1.to(wide)).sum(), (q2.to(wide) * k2.to(wide)).sum()
        return dot[0].exp() - dot[1].exp() + lambda_init(attn.block)

    @staticmethod
    def scale(attn: SinkAttention) -> float:
        """The scores' scale (hd/2)^-0.5, for the halves' width."""
        return float((attn.head_dim // 2) ** -0.5)

    @classmethod
    def scores(cls, attn: SinkAttention, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """(B, heads, 2, N, K'): s q1 k1^T and s q2 k2^T."""
        return (halves(q) * cls.scale(attn)) @ halves(k).transpose(-2, -1)

    @classmethod
    def matrix(cls, attn: SinkAttention, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        """softmax(s1) - lambda softmax(s2), hidden keys out of both maps."""
        if future is not None:
            s = s.masked_fill(future, float("-inf"))
        p = s.softmax(dim=-1)
        return p[..., 0, :, :] - cls.lam(attn).to(p.dtype) * p[..., 1, :, :]

    @classmethod
    def head_output(cls, attn: SinkAttention, heads_out: torch.Tensor) -> torch.Tensor:
        """RMSNorm over each head's width (float32 or wider), its weight, then times 1 - lambda_init."""
        x = heads_out.to(torch.promote_types(heads_out.dtype, torch.float32))
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + NORM_EPS)
        weight = cast(nn.Parameter, getattr(attn, NORM)).to(x.dtype)
        return (y * weight * (1 - lambda_init(attn.block))).to(heads_out.dtype)

    @classmethod
    def fused_heads(cls, attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    dropout_p: float) -> torch.Tensor:
        """Each map through SDPA with its halves of q and k padded with zeros to the value's width: the zeros add
        exactly 0 to every score, and SDPA's flash kernels (CPU and CUDA) need q, k and v of one width. One dropout
        mask per map (the explicit path drops entries of A itself): the same in expectation."""
        half, scale = q.shape[-1] // 2, cls.scale(attn)
        first, second = (F.scaled_dot_product_attention(F.pad(qm, (0, half)), F.pad(km, (0, half)), v,
                                                        dropout_p=dropout_p, scale=scale)
                         for qm, km in zip(q.chunk(2, dim=-1), k.chunk(2, dim=-1), strict=True))
        return first - cls.lam(attn).to(first.dtype) * second

    @classmethod
    def redirected(cls, attn: SinkAttention, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """The sink key masked out of both maps (each softmax renormalised over the other keys), combined with the
        same lambda. A row with no key left is 0."""
        masked = s.masked_fill((is_sink | hidden).unsqueeze(-3), float("-inf"))
        empty = masked.amax(-1, keepdim=True) == float("-inf")
        p = torch.where(empty, 0.0, masked.softmax(dim=-1))
        return p[..., 0, :, :] - cls.lam(attn).to(p.dtype) * p[..., 1, :, :]

    @classmethod
    def reference_redirected(cls, attn: SinkAttention, s: torch.Tensor, head: int, n: int,
                             sink: int | None) -> torch.Tensor:
        """Both maps' rows (2, K) recomputed without the key at `sink`, combined with lambda, in float64."""
        if sink is None:
            return cls.reference(attn, s, head, n)
        keep = torch.ones(s.shape[-1], dtype=torch.bool, device=s.device)
        keep[sink] = False
        out = torch.zeros_like(s, dtype=torch.float64)
        if keep.any():
            e = torch.exp(s[:, keep].double() - s[:, keep].double().amax(-1, keepdim=True))
            out[:, keep] = e / e.sum(-1, keepdim=True)
        return out[0] - cls.lam(attn, torch.float64) * out[1]

    @staticmethod
    def expected_redirect(attn: SinkAttention, a: torch.Tensor,
                          sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """No rows: A = P1 - lambda P2 does not determine its two maps (nor lambda), and the redirect renormalises
        each map on its own, so A alone predicts no row of it; the built-in check covers 0 rows of this kind."""
        return torch.zeros_like(a, dtype=torch.float64), torch.zeros(a.shape[:2], dtype=torch.bool, device=a.device)

    @classmethod
    def reference(cls, attn: SinkAttention, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        """One query's two rows of scores (2, K) -> its row of A in float64."""
        e = torch.exp(s.double() - s.double().amax(-1, keepdim=True))
        p = e / e.sum(-1, keepdim=True)
        return p[0] - cls.lam(attn, torch.float64) * p[1]
