"""The residual side of sinks (docs/residual.md): token norms, high-norm tokens and massive activations at each
block's output; `block_stats` inside the diagnosis loop (torch), the rest on the per-image arrays it leaves (numpy)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from vitsinks.utils.errors import BadValue, NonFinite

TOP = 3  # the largest activation magnitudes kept per image and block
HIST_BINS = 40  # log-spaced bins of the token-norm histograms
QUANTILES = {"q50": 0.5, "q90": 0.9, "q99": 0.99, "max": 1.0}


@torch.no_grad()
def block_stats(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per image of one block's output `x` (B, N, dim): `norm` (B, N) every token's L2 norm, `top` (B, TOP) the
    largest |h|, `abs_median` (B,) the lower median |h|, `top_channel` / `top_token` (B,) where the largest sits."""
    h = x.float()
    flat = h.abs().flatten(1)  # (B, N * dim), token-major
    top, arg = flat.topk(min(TOP, flat.shape[1]), dim=1)
    dim = h.shape[-1]
    return {"norm": h.norm(dim=-1), "top": top, "abs_median": lower_median(flat),
            "top_channel": arg[:, 0] % dim, "top_token": arg[:, 0] // dim}


def lower_median(flat: torch.Tensor, selection: bool | None = None) -> torch.Tensor:
    """Per row of `flat` (B, n), the ((n - 1) // 2)-th smallest value (torch's median). On the CPU (`selection`
    None) by numpy's selection (`np.partition`), about 15x faster there than torch's median; elsewhere torch's."""
    if selection is None:
        selection = flat.device.type == "cpu"
    if not selection:
        return flat.median(dim=1).values
    mid = (flat.shape[1] - 1) // 2
    return torch.from_numpy(np.partition(flat.numpy(), mid, axis=1)[:, mid].copy())


Norms = TypeVar("Norms", np.ndarray, torch.Tensor)


def finite_norms(norms: Norms) -> Norms:
    """`norms` (numpy or torch) unchanged; `NonFinite` if any is NaN or inf."""
    ok = bool(torch.isfinite(norms).all()) if isinstance(norms, torch.Tensor) else bool(np.isfinite(norms).all())
    if not ok:
        raise NonFinite("the residual token norms hold NaN or inf: the model's activations are broken; use a "
                        "checkpoint of a run that did not diverge")
    return norms


def norm_quantiles(norms: np.ndarray) -> dict[str, np.ndarray]:
    """Per block, the quantiles (`QUANTILES`) of the token norms `norms` (images, L, N) over images x tokens."""
    flat = np.moveaxis(finite_norms(norms), 1, 0).reshape(norms.shape[1], -1)  # (L, images * N)
    return {name: np.quantile(flat, q, axis=1) for name, q in QUANTILES.items()}


def log_edges(norms: np.ndarray, bins: int = HIST_BINS) -> np.ndarray:
    """`bins + 1` log-spaced edges from the smallest positive norm to the largest (a decade wide when all equal)."""
    pos = finite_norms(norms)[norms > 0]
    if pos.size == 0:
        raise BadValue("every residual token norm is 0: the model's residual stream is empty; check its weights")
    lo, hi = float(pos.min()), float(pos.max())
    if hi <= lo * (1 + 1e-9):
        lo, hi = lo / math.sqrt(10), hi * math.sqrt(10)
    return np.geomspace(lo, hi, bins + 1)


def norm_histogram(norms: np.ndarray, bins: int = HIST_BINS) -> tuple[np.ndarray, np.ndarray]:
    """`log_edges` and per block the token counts (L, bins); a norm of 0 counts in the first bin."""
    edges = log_edges(norms, bins)
    clipped = np.clip(norms, edges[0], edges[-1])
    counts = np.stack([np.histogram(clipped[:, b].ravel(), bins=edges)[0] for b in range(norms.shape[1])])
    return edges, counts


def sink_tokens(sink_idx: np.ndarray, events: np.ndarray, n_tokens: int) -> np.ndarray:
    """(images, L, N) bool: the tokens that are a sink event's dominant key (an extra key slot marks none)."""
    out = np.zeros((*sink_idx.shape[:2], n_tokens), dtype=bool)
    i, b, h = np.nonzero(events)
    s = sink_idx[i, b, h]
    token = s < n_tokens
    out[i[token], b[token], s[token]] = True
    return out


def high_norm(norms: np.ndarray, k: float, name: str = "diagnostics.high_norm_k") -> np.ndarray:
    """(..., N) bool: the tokens whose norm exceeds `k` x the median of their image and block (`name`: k's setting)."""
    (k,) = check_ks([k], name)
    return finite_norms(norms) > k * np.median(norms, axis=-1, keepdims=True)


def entering_norms(norms: np.ndarray, norm_in: np.ndarray | None) -> np.ndarray:
    """(images, L, N): the norms entering each block (block b - 1's output; block 0: `norm_in`, NaN without it)."""
    first = np.full_like(norms[:, :1], np.nan) if norm_in is None else norm_in[:, None].astype(norms.dtype)
    return np.concatenate([first, norms[:, :-1]], axis=1)


def high_norm_stats(norms: np.ndarray, k: float, token_loc: np.ndarray, is_sink: np.ndarray,
                    entering: np.ndarray, n_locations: int = 3) -> dict[str, np.ndarray]:
    """Per block at threshold `k` (docs/residual.md): `per_image` (L,) high-norm tokens of the block's output per
    image, `by_location` (n_locations, L) the same by `token_loc` (N,), and `sink_share` (L,) the share of the
    high-norm tokens *entering* the block (`entering_norms`) that are its sinks (`is_sink`); NaN where none enters."""
    hi = high_norm(norms, k)
    n_img = norms.shape[0]
    per_loc = np.stack([hi[..., token_loc == c].sum(axis=(0, 2)) / n_img for c in range(n_locations)])
    known = ~np.isnan(entering).any(axis=(0, 2))
    hi_in = high_norm(np.nan_to_num(entering, nan=0.0), k) & known[None, :, None]
    total_in = hi_in.sum(axis=(0, 2))
    share = np.where(total_in > 0, (hi_in & is_sink).sum(axis=(0, 2)) / np.maximum(total_in, 1), np.nan)
    return {"per_image": hi.sum(axis=(0, 2)) / n_img, "by_location": per_loc, "sink_share": share}


def top_activation_stats(top: np.ndarray, abs_median: np.ndarray, channel: np.ndarray,
                         token_loc: np.ndarray) -> dict[str, np.ndarray]:
    """Per block from the per-image `block_stats` arrays ((images, L, TOP) / (images, L); `token_loc` the top token's
    location code): the means `top` (L, TOP) and `median` (L,), `ratio` mean top-1 / mean median (inf where the
    median is 0), and the `channel` and `location` of the top-1 on most images (ties: the smallest)."""
    mt, mm = top.mean(axis=0), abs_median.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(mm > 0, mt[:, 0] / np.where(mm > 0, mm, 1), np.inf)
    mode = [np.bincount(col).argmax() for col in channel.T]
    loc = [np.bincount(col, minlength=3).argmax() for col in token_loc.T]
    return {"top": mt, "median": mm, "ratio": ratio, "channel": np.array(mode), "location": np.array(loc)}


def k_key(k: float) -> str:
    """How a threshold is named in summary.json's `high_norm` (2 -> '2.0')."""
    return str(float(k))


def check_ks(ks: Sequence[float], name: str = "diagnostics.high_norm_k") -> list[float]:
    """The thresholds `ks` as distinct floats, each finite and > 1; `name`: the setting they came from."""
    out = []
    for k in ks:
        k = float(k)
        if not (math.isfinite(k) and k > 1):
            raise BadValue(f"{name} must hold finite multiples > 1 of the median token norm, got {k:g}")
        if k not in out:
            out.append(k)
    return out
