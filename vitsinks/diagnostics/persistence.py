"""What persists over depth (docs/sinks.md, docs/residual.md): the blocks in which a key is a sink (`key_lifetimes`,
`head_lifetimes`, `lifetime_summary`) and the block where each massive token first appears and how constant its
norm stays afterwards (`massive_emergence`, `emergence_summary`). Pure numpy on a diagnosis' per-image arrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vitsinks.diagnostics.residual import high_norm

MASSIVE_K = 10.0  # a token is massive at a block when its norm exceeds this multiple of its image's median norm there


def key_lifetimes(sink_idx: np.ndarray, events: np.ndarray, n_keys: int,
                  blocks: Sequence[int] | np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images, n_keys) each: the first and the last block in which key j is the dominant key `sink_idx` of a head
    with a sink event (`events`, (images, L, H)) on the image; -1 where it never is. `blocks`: the model indices of
    the L diagnosed blocks (default 0..L-1)."""
    n, n_blocks = sink_idx.shape[:2]
    ids = np.arange(n_blocks) if blocks is None else np.asarray(blocks)
    is_sink = np.zeros((n, n_blocks, n_keys), dtype=bool)
    i, b, h = np.nonzero(events)
    is_sink[i, b, sink_idx[i, b, h]] = True
    ever = is_sink.any(axis=1)
    first = np.where(ever, ids[is_sink.argmax(axis=1)], -1)
    last = np.where(ever, ids[n_blocks - 1 - is_sink[:, ::-1].argmax(axis=1)], -1)
    return first, last


def head_lifetimes(sink_idx: np.ndarray, events: np.ndarray, n_keys: int,
                   blocks: Sequence[int] | np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per (image, block, head): `sink_first` / `sink_last`, the lifetime (`key_lifetimes`) of the head's dominant key
    on that image (-1 where that key is never a sink)."""
    first, last = key_lifetimes(sink_idx, events, n_keys, blocks)
    rows = np.arange(sink_idx.shape[0])[:, None, None]
    return {"sink_first": first[rows, sink_idx], "sink_last": last[rows, sink_idx]}


def _mean(x: np.ndarray) -> float | None:
    return float(np.round(x.mean(), 6)) if x.size else None


def lifetime_summary(sink_idx: np.ndarray, events: np.ndarray, n_keys: int, locations: Sequence[str],
                     key_location: np.ndarray) -> dict[str, Any]:
    """summary.json's `sink_lifetime`: over every (image, key) that is a sink in some block, `keys_per_image` (distinct
    sink keys per image), `mean_span` (last - first + 1 blocks, null without any), `span_by_location` (the same by
    where the key sits: `key_location`, codes into `locations` per key), and per block the sink keys per image whose
    lifetime starts (`starts_by_block`) or ends (`ends_by_block`) there."""
    first, last = key_lifetimes(sink_idx, events, n_keys)
    n, n_blocks = sink_idx.shape[:2]
    sink = first >= 0
    span = (last - first + 1)[sink]
    loc = np.broadcast_to(key_location[None, :], sink.shape)[sink]
    return {
        "keys_per_image": float(np.round(sink.sum() / n, 6)),
        "mean_span": _mean(span),
        "span_by_location": {name: _mean(span[loc == c]) for c, name in enumerate(locations)},
        "starts_by_block": [float(np.round((first == b).sum() / n, 6)) for b in range(n_blocks)],
        "ends_by_block": [float(np.round((last == b).sum() / n, 6)) for b in range(n_blocks)],
    }


def massive_emergence(norms: np.ndarray, k: float = MASSIVE_K) -> dict[str, np.ndarray]:
    """Per (image, block) from the token norms `norms` (images, L, N) at each block's output: `massive_new` (int), the
    tokens massive there (norm > `k` x the median norm of their image and block) and at no earlier block; and
    `massive_cv`, the mean over those tokens of the coefficient of variation (std / mean, population std) of each one's
    norm over the blocks from its emergence to the last (NaN where no token emerges, and at the last block)."""
    norms = norms.astype(np.float64)
    n, n_blocks, _ = norms.shape
    hi = high_norm(norms, k, "the massive-token threshold")
    ever = hi.any(axis=1)  # (images, N)
    first = np.where(ever, hi.argmax(axis=1), n_blocks)  # n_blocks: never
    after = np.arange(n_blocks)[None, :, None] >= first[:, None, :]  # (images, L, N)
    count = after.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = (norms * after).sum(axis=1) / count
        std = np.sqrt((((norms - mean[:, None]) ** 2) * after).sum(axis=1) / count)
        cv = np.where(count >= 2, std / mean, np.nan)  # (images, N)
    new = np.stack([(first == b).sum(axis=1) for b in range(n_blocks)], axis=1)
    out_cv = np.full((n, n_blocks), np.nan)
    for b in range(n_blocks - 1):
        mask = first == b
        with np.errstate(invalid="ignore"):
            out_cv[:, b] = np.where(mask.any(axis=1), np.where(mask, cv, 0).sum(axis=1) / mask.sum(axis=1), np.nan)
    return {"massive_new": new, "massive_cv": out_cv}


def emergence_summary(new: np.ndarray, cv: np.ndarray, k: float = MASSIVE_K) -> dict[str, Any]:
    """summary.json's `massive_emergence` from `massive_emergence`'s arrays: `k`; `images_with` the share of images
    with a massive token; `first_block` the median over those images of the block where their first massive token
    appears (null without any); per block the massive tokens per image that appear there (`new_by_block`) and their
    mean coefficient of variation afterwards over every such token of every image (`cv_by_block`, null where none);
    `cv` the same over every token that appears before the last block."""
    n, n_blocks = new.shape
    has = new.sum(axis=1) > 0
    first = new.astype(bool).argmax(axis=1)[has]
    weights = np.where(np.isnan(cv), 0, new)  # each image's block mean, weighted by its number of tokens
    tok_cv = np.where(np.isnan(cv), 0.0, cv) * weights

    def weighted(sl: slice | int) -> float | None:
        w = weights[:, sl].sum()
        return float(np.round(tok_cv[:, sl].sum() / w, 6)) if w > 0 else None

    return {
        "k": float(k),
        "images_with": float(np.round(has.mean(), 6)) if n else 0.0,
        "first_block": float(np.median(first)) if first.size else None,
        "new_by_block": [float(np.round(x, 6)) for x in new.mean(axis=0)],
        "cv_by_block": [weighted(b) for b in range(n_blocks)],
        "cv": weighted(slice(None)),
    }
