"""Clipped softmax (Bondarenko, Nagel & Blankevoort 2023, "Quantizable Transformers: Removing Outliers by Helping
Attention Heads Do Nothing", arXiv 2306.12929): `clip((zeta - gamma) * softmax(s) + gamma, 0, 1)`. With gamma < 0 a
weight below -gamma / (zeta - gamma) is exactly 0, so a head reaches "attend to nothing" (a no-op) at finite scores
instead of pushing its scores towards a sink; rows sum to less (or, with zeta > 1, more) than 1.

Hidden keys (causal, a mask-site mitigation's) weigh 0: the softmax runs over the visible keys and gamma applies to
them only. Fused (`flex_heads`), exactly: pass 1 gives lse = log sum_j exp(s_j), pass 2 the log weights
log clip((zeta - gamma) exp(s - lse) + gamma, 0, 1) (-inf where clipped to 0), whose out * exp(lse2) is
sum_j A_ij v_j.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from vitsinks.models.kinds.kind import KINDS, TINY, AttentionKind, ScoreMod, flex_lse
from vitsinks.utils.errors import BadValue

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention


@dataclass(frozen=True)
class ClipSettings:
    """The stretch of the softmax before the clip: weights (zeta - gamma) p + gamma, gamma <= 0 and zeta >= 1. A
    uniform row of T keys (a ViT's rows at initialisation) keeps its weights while gamma > -1 / (T - 1): the default
    -0.01 up to T = 100; the paper's BERT gamma, -0.025, clips them all from T = 41 on (a head dead from its first
    step, clipped weights pass no gradient)."""

    gamma: float = -0.01
    zeta: float = 1.0

    def __post_init__(self) -> None:
        if not (self.gamma <= 0 and self.zeta >= 1):
            raise BadValue(f"model.kind_settings: clipped_softmax needs gamma <= 0 and zeta >= 1 (got gamma="
                           f"{self.gamma}, zeta={self.zeta}); e.g. model.kind_settings.gamma=-0.01")


def _dead_at_uniform(settings: ClipSettings, n_keys: int) -> str | None:
    """The warning for settings that clip every weight of a uniform row of `n_keys` keys, else None."""
    bound = -settings.zeta / max(n_keys - 1, 1)
    if settings.gamma > bound:
        return None
    return (f"clipped_softmax at gamma={settings.gamma:g} clips every weight of a uniform row of {n_keys} keys to 0: "
            f"a ViT's rows start nearly uniform, so every head is dead from step 0 and clipped weights pass no "
            f"gradient; choose gamma > {bound:.4g} (e.g. model.kind_settings.gamma={bound / 2:.2g})")


def _stretch(attn: SinkAttention) -> tuple[float, float]:
    """(zeta - gamma, gamma) of the module's settings."""
    st = attn.kind_settings
    return st.zeta - st.gamma, st.gamma


def clip_stretched(p: torch.Tensor, stretch: float, gamma: float) -> torch.Tensor:
    """clip(stretch * p + gamma, 0, 1): the clipped weights of the probabilities p."""
    return (stretch * p + gamma).clamp(0.0, 1.0)


def _clipped(s: torch.Tensor, stretch: float, gamma: float, hidden: torch.Tensor | None) -> torch.Tensor:
    """The clipped softmax of the scores over the keys not `hidden`, which weigh 0; a row with no key left is 0."""
    if hidden is None:
        return clip_stretched(s.softmax(-1), stretch, gamma)
    masked = s.masked_fill(hidden, float("-inf"))
    empty = masked.amax(-1, keepdim=True) == float("-inf")
    return torch.where(hidden | empty, 0.0, clip_stretched(masked.softmax(-1), stretch, gamma))


def _log_weights(lse: torch.Tensor, stretch: float, gamma: float) -> ScoreMod:
    """The score mod of pass 2: log clip(stretch exp(score - lse) + gamma, 0, 1), -inf where the weight is <= TINY
    (its log's argument masked to 1 there, so the gradient is never NaN). The constants are 0-d tensors, not floats:
    a float becomes an unbacked symbol FlexAttention rejects once its graph is traced with dynamic shapes."""
    c, g = (torch.full((), x, dtype=lse.dtype, device=lse.device) for x in (stretch, gamma))

    def mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
            kv_idx: torch.Tensor) -> torch.Tensor:
        w = (c * torch.exp(score - lse[b, h, q_idx]) + g).clamp(max=1.0)
        keep = w > TINY
        return torch.where(keep, torch.log(torch.where(keep, w, 1.0)), float("-inf"))

    return mod


@KINDS.register
class ClippedSoftmax(AttentionKind):
    name = "clipped_softmax"
    normalised = False
    sparse = True
    flex = True
    Settings: ClassVar[type] = ClipSettings
    problem = staticmethod(_dead_at_uniform)

    @staticmethod
    def matrix(attn: SinkAttention, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        return _clipped(s, *_stretch(attn), future)

    @staticmethod
    def flex_heads(attn: SinkAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        _, lse = flex_lse(q, k, v, attn.scale)
        out, lse2 = flex_lse(q, k, v, attn.scale, _log_weights(lse, *_stretch(attn)))
        return (out * lse2.exp().unsqueeze(-1)).to(v.dtype)  # a row clipped to nothing: out 0, lse2 -inf

    @staticmethod
    def redirected(attn: SinkAttention, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """The clipped softmax of the scores with the sink key masked out: the softmax renormalised over the other
        keys, then stretched and clipped again (weights that were clipped may come back, others may now clip)."""
        return _clipped(s, *_stretch(attn), is_sink | hidden)

    @classmethod
    def reference_redirected(cls, attn: SinkAttention, s: torch.Tensor, head: int, n: int,
                             sink: int | None) -> torch.Tensor:
        if sink is None:
            return cls.reference(attn, s, head, n)
        out = torch.zeros_like(s)
        rest = torch.ones_like(s, dtype=torch.bool)
        rest[sink] = False
        if rest.any():
            out[rest] = cls.reference(attn, s[rest], head, n)
        return out

    @staticmethod
    def expected_redirect(attn: SinkAttention, a: torch.Tensor,
                          sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """On the rows where no weight is clipped (0 < A_ij < 1 for every key) the softmax is A's own,
        p = (A - gamma) / (zeta - gamma): renormalised off the sink, stretched and clipped again. Rows with a
        clipped (or hidden) key are not predicted: their softmax is not in A."""
        stretch, gamma = _stretch(attn)
        a = a.double()
        rows = ((a > 0) & (a < 1)).all(-1)
        p = (a - gamma) / stretch
        p[torch.arange(len(a), device=a.device), :, sink] = 0.0
        rest = p.sum(-1, keepdim=True)  # the softmax's mass off the sink, summed (no 1 - p_sink cancellation)
        expected = clip_stretched(p / rest.where(rest > 0, 1.0), stretch, gamma)
        expected[torch.arange(len(a), device=a.device), :, sink] = 0.0
        return expected, rows & (rest.squeeze(-1) > 0)

    @staticmethod
    def reference(attn: SinkAttention, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        st = attn.kind_settings
        e = torch.exp(s - s.max())
        return torch.clamp((st.zeta - st.gamma) * e / e.sum() + st.gamma, 0.0, 1.0)
