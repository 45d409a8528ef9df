"""Per-head sink fields (docs/fidelity.md) from one block's explicit attention internals, and the QK spectrum.
Shapes: A (B, H, N, N), queries on dim -2, keys on dim -1; v (B, H, N, hd); `w_o` (dim, H * hd); `ls` (dim,) or None.
"""

from __future__ import annotations

import torch

FIELDS = ("sink_idx", "mass", "routed_frac", "min_a", "ratio_head", "ratio_out", "stable_rank")


def _ratio_to_others(norms: torch.Tensor, s: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """||x_s|| / mean_{j != s} ||x_j|| for norms (B, H, K) of every key and sink indices s (B, H), the others being
    the `n_tokens` tokens (the first keys; extra key slots after them are no token: a sink there is measured
    against the tokens' mean)."""
    at_s = norms.gather(-1, s.unsqueeze(-1)).squeeze(-1)
    on_token = s < n_tokens
    n_others = (n_tokens - on_token.int()).clamp_min(1)
    others = (norms[..., :n_tokens].sum(-1) - torch.where(on_token, at_s, 0.0)) / n_others
    return at_s / others


def head_output_weight(w_o: torch.Tensor, num_heads: int, ls: torch.Tensor | None) -> torch.Tensor:
    """W_h' = diag(ls) W_O^h per head, (H, dim, hd): the map from a head's value v_j to its update u_j = W_h' v_j."""
    dim = w_o.shape[0]
    hd = w_o.shape[1] // num_heads
    w = w_o.view(dim, num_heads, hd).permute(1, 0, 2)
    return w * ls.view(1, dim, 1) if ls is not None else w


def head_output_gram(w_o: torch.Tensor, num_heads: int, ls: torch.Tensor | None) -> torch.Tensor:
    """K_h = W_h'^T W_h' (H, hd, hd) with W_h' = diag(ls) W_O^h: then u_j = W_h' v_j and ||u_j||^2 = v_j^T K_h v_j."""
    w = head_output_weight(w_o, num_heads, ls)
    return w.transpose(1, 2) @ w


def stable_rank(U: torch.Tensor) -> torch.Tensor:
    """||U||_F^2 / ||U||_2^2 over the last two dims; NaN where U = 0 (undefined)."""
    gram = U @ U.transpose(-1, -2) if U.shape[-2] <= U.shape[-1] else U.transpose(-1, -2) @ U
    return _gram_stable_rank(gram)


def _gram_stable_rank(gram: torch.Tensor) -> torch.Tensor:
    """trace / largest eigenvalue of a PSD Gram matrix (= the stable rank of the matrix it came from)."""
    gram = gram.double()
    top = torch.linalg.eigvalsh(gram)[..., -1]
    fro2 = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    return torch.where(top > 0, fro2 / top.clamp_min(1e-300), torch.nan).float()


def head_fields(attn: torch.Tensor, v: torch.Tensor, w_o: torch.Tensor, ls: torch.Tensor | None,
                signed: bool = False) -> dict[str, torch.Tensor]:
    """The diagnostics fields (docs/fidelity.md) of every (image, head) of one block, each shaped (B, H). With
    `signed` (a kind whose weights may be negative) the sink's column, mass, routed share and min_a read the weights'
    magnitudes |A| (a strongly negative column is a sink too); the stable rank reads A itself.

    u_j = ls * (W_O^h v_j) and U = A u are never formed: with K_h = W_h'^T W_h' (hd x hd), ||u_j||^2 =
    v_j^T K_h v_j, and U = (A v) W_h'^T has the Gram matrix C^T (A v)^T (A v) C (hd x hd, K_h = C C^T) with the
    same nonzero eigenvalues as U^T U, so the stable rank needs only hd x hd eigenvalues.
    """
    attn, v = attn.float(), v.float()
    read = attn.abs() if signed else attn
    s = read.mean(-2).argmax(-1)  # dominant column: argmax_j mean_i A_ij
    col = read.gather(-1, s[..., None, None].expand(*attn.shape[:-1], 1)).squeeze(-1)  # A_is over queries i
    K = head_output_gram(w_o.float(), attn.shape[1], None if ls is None else ls.float())
    u_norm = torch.einsum("bhnd,hde,bhne->bhn", v, K, v).clamp_min(0).sqrt()
    evals, evecs = torch.linalg.eigh(K.double())
    C = (evecs * evals.clamp_min(0).sqrt().unsqueeze(-2)).float()  # K = C C^T
    m = (attn @ v) @ C.unsqueeze(0)  # (B, H, N, hd): U's row space, rotated
    return {
        "sink_idx": s,
        "mass": col.mean(-1),
        "routed_frac": (col >= 0.5).float().mean(-1),
        "min_a": col.amin(-1),
        "ratio_head": _ratio_to_others(v.norm(dim=-1), s, attn.shape[-2]),  # queries are the tokens
        "ratio_out": _ratio_to_others(u_norm, s, attn.shape[-2]),
        "stable_rank": _gram_stable_rank(m.transpose(-1, -2) @ m),  # the head update U = A u, before the gate
    }


def qk_singular_values(qkv_weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Per head, the nonzero singular values (descending, (H, hd)) of Theta_h = W_Q^h (W_K^h)^T = W_q^T W_k.

    Theta_h is dim x dim of rank <= hd; its nonzero singular values are those of R_q R_k^T, with W_q^T = Q_q R_q
    and W_k^T = Q_k R_k thin QR factorisations (hd x hd), which is much cheaper than an SVD of Theta.
    """
    dim = qkv_weight.shape[1]
    hd = dim // num_heads
    w = qkv_weight.detach().double()
    wq, wk = w[:dim].view(num_heads, hd, dim), w[dim : 2 * dim].view(num_heads, hd, dim)
    rq = torch.linalg.qr(wq.transpose(1, 2)).R  # (H, hd, hd)
    rk = torch.linalg.qr(wk.transpose(1, 2)).R
    return torch.linalg.svdvals(rq @ rk.transpose(1, 2))


def qk_spectrum(qkv_weight: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, (sigma_1 / sum sigma, sigma_1 / sigma_2) of Theta_h (see `qk_singular_values`)."""
    sv = qk_singular_values(qkv_weight, num_heads)
    frac = sv[:, 0] / sv.sum(-1).clamp_min(1e-300)
    gap = sv[:, 0] / sv[:, 1].clamp_min(1e-300) if sv.shape[1] > 1 else torch.full_like(frac, torch.inf)
    return frac.float().cpu(), gap.float().cpu()  # cpu: the callers turn them into numpy arrays
