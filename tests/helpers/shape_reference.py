"""The float64 truth of the attention-shape and persistence fields (concentration, diagonal mass, update shares and
head utilisation, massive emergence, sink lifetimes): any model's views run in float64 on a float64 copy, each field
written out with plain loops and numpy, independent of the diagnosis' code (a head's update comes from the block's
own head merge, one head kept at a time, not from the output projection's input)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from vitsinks.backbones import adapt
from vitsinks.models.seam import Backbone


@torch.no_grad()
def float64_pass(model: nn.Module | Backbone, images: torch.Tensor) -> dict[str, np.ndarray]:
    """Per image, block and head of a float64 copy of `model`: `attn` (images, L, H, N, K), `head_norm` (images, L, H)
    the Frobenius norm of each head's term of the attention update ls1 * merge(heads) (the merge with one head kept,
    less the merge of none: exact for a merge affine in the heads), and `res_norm` (images, L, N) the token norms at
    each block's output."""
    backbone = adapt(copy.deepcopy(adapt(model).model).double().eval())
    h = backbone.embed_tokens(images.double())
    attn, head_norm, res_norm = [], [], []
    for blk in backbone.blocks:
        it = blk.attn.internals(blk.norm1(h))
        heads = it.attn @ it.v  # (B, H, N, hd): the heads' outputs
        none = blk.ls1(blk.attn.combine(torch.zeros_like(heads), it.gate))
        norms = []
        for j in range(heads.shape[1]):
            only = torch.zeros_like(heads)
            only[:, j] = heads[:, j]
            norms.append((blk.ls1(blk.attn.combine(only, it.gate)) - none).flatten(1).norm(dim=1))
        attn.append(it.attn)
        head_norm.append(torch.stack(norms, 1))
        h = blk(h)
        res_norm.append(h.norm(dim=-1))
    return {"attn": torch.stack(attn, 1).numpy(), "head_norm": torch.stack(head_norm, 1).numpy(),
            "res_norm": torch.stack(res_norm, 1).numpy()}


def attention_reference(attn: np.ndarray) -> dict[str, np.ndarray]:
    """Per (image, block, head) of float64 attention (images, L, H, N, K), on the weights' magnitudes: `sink_idx`
    argmax of the column means, `mass` and `routed_frac` its mean and the share of queries with |A_is| >= 0.5,
    `concentration` max / numpy median of the column sums, `diag_mass` the mean of |A_ii| over the N queries, `dead`
    1 where every weight is 0 and `neg_mass` the share of the absolute weight on negative weights (NaN if dead)."""
    n, n_blocks, heads, n_q, _ = attn.shape
    names = ("sink_idx", "mass", "routed_frac", "concentration", "diag_mass", "dead", "neg_mass")
    out = {k: np.zeros((n, n_blocks, heads)) for k in names}
    for idx in np.ndindex(n, n_blocks, heads):
        a = np.abs(attn[idx])
        col = a.sum(axis=0)
        s = int(col.argmax())
        out["sink_idx"][idx] = s
        out["mass"][idx] = a[:, s].mean()
        out["routed_frac"][idx] = float((a[:, s] >= 0.5).mean())
        with np.errstate(invalid="ignore", divide="ignore"):
            out["concentration"][idx] = col.max() / np.median(col)
            out["neg_mass"][idx] = sum(-w for w in attn[idx].ravel() if w < 0) / a.sum()
        out["diag_mass"][idx] = np.mean([a[i, i] for i in range(n_q)])
        out["dead"][idx] = float(not a.any())
    out["sink_idx"] = out["sink_idx"].astype(int)
    return out


def shares_reference(head_norm: np.ndarray) -> dict[str, np.ndarray]:
    """`update_share` p_h = n_h / sum n and `head_util` 1 / (H sum p_h^2) from the heads' update norms (..., H)."""
    p = head_norm / head_norm.sum(axis=-1, keepdims=True)
    return {"update_share": p, "head_util": 1 / (head_norm.shape[-1] * (p**2).sum(axis=-1))}


def emergence_reference(norms: np.ndarray, k: float) -> dict[str, np.ndarray]:
    """Per (image, block) of token norms (images, L, N), token by token: the tokens first above k x the median norm of
    their image and block there, and the mean over them of np.std / np.mean of their norms from there to the last
    block (NaN without any, or at the last block)."""
    n, n_blocks, n_tokens = norms.shape
    new = np.zeros((n, n_blocks), dtype=int)
    cvs: dict[tuple[int, int], list[float]] = {}
    for i in range(n):
        for t in range(n_tokens):
            above = [b for b in range(n_blocks) if norms[i, b, t] > k * np.median(norms[i, b])]
            if above:
                b = above[0]
                new[i, b] += 1
                later = norms[i, b:, t]
                cvs.setdefault((i, b), []).append(np.std(later) / np.mean(later) if len(later) > 1 else np.nan)
    cv = np.full((n, n_blocks), np.nan)
    for (i, b), vals in cvs.items():
        cv[i, b] = np.mean(vals)
    return {"massive_new": new, "massive_cv": cv}


def lifetime_reference(sink_idx: np.ndarray, events: np.ndarray) -> dict[str, np.ndarray]:
    """Per (image, block, head): the first and last block in which the head's dominant key is the dominant key of
    some head with an event on the image (-1 if never), key by key."""
    first, last = np.full(sink_idx.shape, -1), np.full(sink_idx.shape, -1)
    for i, b, h in np.ndindex(*sink_idx.shape):
        key = sink_idx[i, b, h]
        blocks = [c for c in range(sink_idx.shape[1]) if (events[i, c] & (sink_idx[i, c] == key)).any()]
        if blocks:
            first[i, b, h], last[i, b, h] = blocks[0], blocks[-1]
    return {"sink_first": first, "sink_last": last}
