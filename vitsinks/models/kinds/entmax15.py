"""1.5-entmax attention (Peters, Niculae & Martins 2019, "Sparse Sequence-to-Sequence Models"), as "Vision
Transformers Need Better Token Interaction" (Su 2026, arXiv 2605.23868) puts it in place of softmax in a DINO ViT:
`entmax15(s)_j = [s_j / 2 - tau]_+^2` on the scaled scores s = scale q k^T, with tau the threshold that makes the row
sum to 1. Rows sum to 1 as under softmax, but keys whose half-score is at most tau get exactly 0, so a head need not
spread leftover attention over every key.

Computed by the `entmax` package's exact sort-based `entmax15` (and its backward) in float32 or wider. Hidden keys
(causal, a mask) score -inf and get exactly 0. No fused path: tau needs each query's whole sorted score row, so a
FlexAttention path would first materialise and sort the (B, heads, N, K) scores, the explicit path's own work, and
its kernel's scores, recomputed from q and k (cast to the values' dtype under autocast), would not be those tau came
from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vitsinks.models.kinds.kind import KINDS, AttentionKind
from vitsinks.utils.errors import BadValue

if TYPE_CHECKING:  # annotations only: the attention module imports the kinds
    from vitsinks.models.attention import SinkAttention


def _entmax15(s: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
    """1.5-entmax over the last dim in float32 or wider (kept so under autocast, as softmax's, else cast back to s's
    dtype), `hidden` keys at exactly 0; a row with no key left is 0, a row with a NaN or +inf score NaN (the package
    cannot take either: its threshold would index no key)."""
    try:
        from entmax import entmax15  # the attention kind's own dependency, imported where it is used
    except ImportError:
        raise BadValue("model.attn=entmax15 needs the entmax package: pip install entmax (vitsinks lists it; "
                       "reinstall with pip install -e .)") from None
    x = s.to(torch.promote_types(s.dtype, torch.float32))
    if hidden is not None:
        x = x.masked_fill(hidden, float("-inf"))
    top = x.amax(-1, keepdim=True)  # NaN if any score is NaN
    ok = torch.isfinite(top)
    p = entmax15(torch.where(ok, x, 0.0), dim=-1)
    p = torch.where(ok, p, torch.where(top == float("-inf"), 0.0, float("nan")))
    return p if torch.is_autocast_enabled(s.device.type) else p.to(s.dtype)


def entmax15_reference(s: torch.Tensor) -> torch.Tensor:
    """1.5-entmax of one row of finite scores `s` (K,) in float64, naively (Peters et al., Algorithm 2): with z = s / 2
    sorted in descending order, the support is the k whose threshold tau_k = mean_k - sqrt((1 - ss_k) / k) (mean_k,
    ss_k: the mean and the sum of squared deviations of the k largest) lies in [z_(k+1), z_(k)); then [z - tau]_+^2."""
    z = s.double() / 2
    top = z.sort(descending=True).values
    for k in range(1, len(top) + 1):
        mean = top[:k].mean()
        ss = ((top[:k] - mean) ** 2).sum()
        if ss > 1:
            break  # the k largest alone overshoot a unit sum: no larger support either
        tau = mean - ((1 - ss) / k).sqrt()
        if top[k - 1] > tau and (k == len(top) or top[k] <= tau):
            return (z - tau).clamp_min(0) ** 2
    raise ValueError(f"no 1.5-entmax threshold for the scores {s.tolist()}")  # unreachable for finite scores


@KINDS.register
class Entmax15(AttentionKind):
    name = "entmax15"
    sparse = True

    @staticmethod
    def matrix(attn: SinkAttention, s: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
        return _entmax15(s, future)

    @staticmethod
    def redirected(attn: SinkAttention, s: torch.Tensor, head: int, is_sink: torch.Tensor,
                   hidden: torch.Tensor) -> torch.Tensor:
        """1.5-entmax of the scores with the sink masked out (-inf): the row keeps its sum 1, its threshold drops,
        and the sink's share goes to the keys entmax then selects (keys at 0 may enter): no proportional rescale."""
        return _entmax15(s, is_sink | hidden)

    @classmethod
    def reference_redirected(cls, attn: SinkAttention, s: torch.Tensor, head: int, n: int,
                             sink: int | None) -> torch.Tensor:
        """`reference` of the row without the sink's score, the sink at 0 (a row with no key left: 0)."""
        if sink is None:
            return entmax15_reference(s)
        keep = torch.ones(len(s), dtype=torch.bool)
        keep[sink] = False
        out = torch.zeros(len(s), dtype=torch.float64)
        if keep.any():
            out[keep] = entmax15_reference(s[keep])
        return out

    @staticmethod
    def expected_redirect(attn: SinkAttention, a: torch.Tensor,
                          sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The redirect from A alone, on the rows where it is a function of A: where the sink has weight 0 (it is out
        of the support: the row is unchanged), and where every other key has weight > 0. There the weights give the
        other keys' half-scores up to the shift tau, u_j = sqrt(A_ij) = z_j - tau, and without the sink the new
        threshold t < 0 solves sum_j (u_j - t)^2 = old row sum (every key stays in the support). Elsewhere a key at 0
        may enter the support, and its score is unknown from A: no prediction (a causal row that sees the sink has
        such zeros; so has every row of a sparse head)."""
        a = a.double()
        batch = torch.arange(len(a), device=a.device)
        at_sink = a[batch, :, sink]  # (B, N)
        off = a.clone()
        off[batch, :, sink] = 0.0
        is_sink = torch.zeros_like(a, dtype=torch.bool)
        is_sink[batch, :, sink] = True
        full = ((off > 0) | is_sink).all(-1)
        u = off.sqrt()
        k = (off > 0).sum(-1, keepdim=True).clamp_min(1)
        su, lost = u.sum(-1, keepdim=True), at_sink.unsqueeze(-1)
        # the smaller root of k t^2 - 2 su t - lost = 0, written without cancellation (t = 0 when nothing is lost)
        t = -lost / (su + (su**2 + k * lost).sqrt()).clamp_min(1e-300)
        new = torch.where(off > 0, (u - t) ** 2, 0.0)
        unchanged = at_sink == 0
        return torch.where(unchanged.unsqueeze(-1), a, new), unchanged | (full & (at_sink > 0))

    @staticmethod
    def reference(attn: SinkAttention, s: torch.Tensor, head: int, n: int) -> torch.Tensor:
        return entmax15_reference(s)
