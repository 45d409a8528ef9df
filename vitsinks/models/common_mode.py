"""The common-mode share of an attention update o (B, N, dim): E(mean_i o_i) / (E(o) + CM_EPS), E the mean squared
entry: 0 for an update of zero mean over tokens, 1 for the same update at every token. The one implementation, for
the penalty, the diagnostics and the synthetic tasks."""

from __future__ import annotations

import torch

CM_EPS = 1e-12  # keeps the ratio of an all-zero update finite (0)


def common_mode_terms(o: torch.Tensor) -> torch.Tensor:
    """(E(mean_i o_i), E(o)) of an update o (B, N, dim) as a float32 tensor (2,), differentiable, kept apart so
    that they can be summed over ranks (or images) before the ratio."""
    o = o.float()
    # the mean of o**2 (the reference's form): pairwise summation, ~1e-7 of float64 where a squared norm is ~1e-5 off
    return torch.stack([o.mean(dim=1).square().mean(), o.square().mean()])


def common_mode_terms_per_image(o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same two terms of each image's update separately: (E_image(mean_i o_i), E_image(o)), each (B,)."""
    o = o.float()
    return o.mean(dim=1).square().mean(-1), o.square().mean(dim=(1, 2))


def common_mode_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """The ratio of (summed or averaged) common-mode terms, with the one epsilon."""
    return num / (den + CM_EPS)


def common_mode_penalty(o: torch.Tensor) -> torch.Tensor:
    """E(mean_i o_i) / (E(o) + 1e-12) of an update o (B, N, dim), in float32, differentiable through both terms."""
    num, den = common_mode_terms(o)
    return common_mode_ratio(num, den)
