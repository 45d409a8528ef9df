"""The register neurons (`diagnostics.neurons`) recomputed in numpy from a library's own forward: the blocks' outputs
and the MLP activations that hooks on its modules saw (float64 arrays), independent of the views."""

from __future__ import annotations

import numpy as np


def outlier_patches(last: np.ndarray, k: float, prefix: int) -> np.ndarray:
    """(B, N) bool: the patches whose norm at the last block's output `last` (B, N, D) exceeds `k` x the image's
    median token norm."""
    norms = np.linalg.norm(last, axis=-1)
    mask = norms > k * np.median(norms, axis=-1, keepdims=True)
    mask[:, :prefix] = False
    return mask


def unit_scores(acts: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(H,): per unit of `acts` (B, N, H), the mean over the images with an outlier patch of its mean |activation|
    at those patches."""
    return np.mean([np.abs(acts[i, mask[i]]).mean(0) for i in np.flatnonzero(mask.any(-1))], axis=0)


def summary_rows(acts: list[np.ndarray], outs: list[np.ndarray], w_out: list[np.ndarray],
                 gamma: list[np.ndarray | None], k: float, prefix: int,
                 top: int) -> list[tuple[int, int, float, float]]:
    """(block, unit, score, norm_share) of each block's `top` units, highest score first: `summarize_neurons`.
    Per block: `acts` (B, N, H) its MLP activations, `outs` (B, N, D) its output, `w_out` (D, H) its MLP's output
    weight, `gamma` (D,) its LayerScale gain (None without). The share: the mean over the outlier patches of
    1 - |x - c| / |x|, x the block's output and c the top units' direct part of its MLP update."""
    mask = outlier_patches(outs[-1], k, prefix)
    rows = []
    for b, (a, x, w, g) in enumerate(zip(acts, outs, w_out, gamma, strict=True)):
        scores = unit_scores(a, mask)
        units = np.argsort(-scores, kind="stable")[:top]
        c = (a[mask][:, units] @ w[:, units].T) * (1.0 if g is None else g)
        xt = x[mask]
        share = float(np.mean(1 - np.linalg.norm(xt - c, axis=-1) / np.linalg.norm(xt, axis=-1)))
        rows += [(b, int(u), float(scores[u]), share) for u in units]
    return rows


def assert_table_equals(table: dict[str, np.ndarray], rows: list[tuple[int, int, float, float]]) -> None:
    """A `neurons` table (`diagnose(..., neurons=k)`) equals recomputed `summary_rows`: blocks and units exactly,
    scores and shares to 1e-5."""
    assert len(rows) > 0 and list(zip(table["block"], table["unit"], strict=True)) == [r[:2] for r in rows]
    np.testing.assert_allclose(table["score"], [r[2] for r in rows], rtol=1e-5)
    np.testing.assert_allclose(table["norm_share"], [r[3] for r in rows], rtol=1e-5, atol=1e-6)
