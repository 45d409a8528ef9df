"""How a head spreads its attention and how a block's heads share its update (docs/sinks.md), from one block's
explicit internals: `concentration` and `diag_mass` per (image, head) from A, `update_share` per (image, head) and
`head_util` per image from the input of the output projection; and their summary (`shape_summary`).

Shapes: A (B, H, N, K), queries i on dim -2 (the N tokens), keys j on dim -1 (the tokens, then any extra key slot).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from vitsinks.diagnostics.fields import head_output_gram

ATTENTION_FIELDS = ("concentration", "diag_mass", "dead", "neg_mass")  # per (image, head), from A


def median_last(x: torch.Tensor) -> torch.Tensor:
    """The median over the last dim, the mean of the two middle values for an even count (numpy's)."""
    s = x.sort(dim=-1).values
    n = s.shape[-1]
    return (s[..., (n - 1) // 2] + s[..., n // 2]) / 2


def attention_shape(attn: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per (image, head), (B, H), on the weights' magnitudes |A| (A itself unless the kind is signed):
    `concentration` max_j c_j / median_j c_j of the column sums c_j = sum_i |A_ij| over every key j (inf where the
    median is 0 and the maximum is not, NaN where every column is 0), `diag_mass` (1/N) sum_i |A_ii|, the mean
    attention a query pays itself, `dead` 1 where every weight is exactly 0 (the head attends to nothing) else 0, and
    `neg_mass` the share of sum |A_ij| on negative weights (0 unless the kind is signed; NaN for a dead head)."""
    attn = attn.float()
    mag = attn.abs()
    col = mag.sum(-2)  # (B, H, K)
    total = col.sum(-1)
    return {"concentration": col.amax(-1) / median_last(col),
            "diag_mass": mag.diagonal(dim1=-2, dim2=-1).mean(-1),
            "dead": (total == 0).float(),
            "neg_mass": (attn.clamp_max(0).abs().sum((-2, -1)) / total)}


def head_update_norms(y: torch.Tensor, w_o: torch.Tensor, num_heads: int, ls: torch.Tensor | None) -> torch.Tensor:
    """Per (image, head), (B, H): ||U_h||_F, U_h = ls * (y_h W_O^h^T) the head's term of the attention update over
    the N tokens, from the output projection's input `y` (B, N, H * hd) and weight `w_o` (dim, H * hd); `ls` the
    LayerScale gamma (dim,) or None. U_h is not formed: ||U_h||_F^2 = sum_i y_ih^T K_h y_ih with K_h = W_h'^T W_h'."""
    B, N, _ = y.shape
    gram = head_output_gram(w_o.float(), num_heads, None if ls is None else ls.float())  # (H, hd, hd)
    yh = y.float().view(B, N, num_heads, -1)
    return torch.einsum("bnhd,hde,bnhe->bh", yh, gram, yh).clamp_min(0).sqrt()


def update_shares(norms: torch.Tensor) -> dict[str, torch.Tensor]:
    """From the heads' update norms (B, H): `update_share` p_h = ||U_h|| / sum_g ||U_g|| (B, H) and `head_util`
    1 / (H sum_h p_h^2) (B,), 1 when every head writes as much, 1/H when one head writes everything; NaN for a
    block whose heads write nothing."""
    p = norms / norms.sum(-1, keepdim=True)
    return {"update_share": p, "head_util": 1 / (norms.shape[-1] * (p**2).sum(-1))}


@contextmanager
def projection_input(attn: Any) -> Iterator[list[torch.Tensor]]:
    """A list that receives the input of `attn.proj` (the output projection, an `nn.Module`) at each call made inside
    the block: what it multiplies, after any norm over the heads, the gate, or a quantiser's hook registered first."""
    seen: list[torch.Tensor] = []
    proj: nn.Module = attn.proj

    def keep(_module: nn.Module, args: tuple[Any, ...]) -> None:
        seen.append(args[0])

    handle = proj.register_forward_pre_hook(keep)
    try:
        yield seen
    finally:
        handle.remove()


def _finite_or_none(x: float) -> float | None:
    return float(np.round(x, 6)) if math.isfinite(x) else None


def shape_summary(d: dict[str, np.ndarray]) -> dict[str, list[float | None]]:
    """summary.json's `head_shape`, per block: the median over images and heads of `concentration` (NaN ones, heads
    whose attention is all 0, left out), the mean of `diag_mass`, the mean over images of `head_util` (NaN ones left
    out); null where a value is not finite (a null concentration is inf: a median column sum of 0)."""
    with warnings.catch_warnings():  # an all-NaN block is null, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        conc = np.nanmedian(d["concentration"].astype(np.float64), axis=(0, 2))
        util = np.nanmean(d["head_util"].astype(np.float64), axis=0)
        neg = np.nanmean(d["neg_mass"].astype(np.float64), axis=(0, 2)) if "neg_mass" in d else None
    return {"concentration_by_block": [_finite_or_none(x) for x in conc],
            "diag_mass_by_block": [_finite_or_none(x) for x in d["diag_mass"].astype(np.float64).mean(axis=(0, 2))],
            "head_util_by_block": [_finite_or_none(x) for x in util],
            **({"dead_by_block": [_finite_or_none(x) for x in d["dead"].astype(np.float64).mean(axis=(0, 2))]}
               if "dead" in d else {}),
            **({"neg_mass_by_block": [_finite_or_none(x) for x in neg]} if neg is not None else {})}
