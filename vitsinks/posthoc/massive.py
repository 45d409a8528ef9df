"""Massive activations fixed post hoc (Sun et al. 2024; docs/trainfree.md#mean_massive-and-zero_massive): at the block
where they appear, the largest channels of the residual stream set at each image's massive token to their mean over
the fit images (`mean_massive`) or to 0 (`zero_massive`), at the end of the block's MLP branch (`Block.mlp_out`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from vitsinks.configs.schema import TrainFreeConfig
from vitsinks.diagnostics.residual import block_stats, finite_norms
from vitsinks.models.passes import block_outputs_by_batch
from vitsinks.models.seam import Backbone, Block
from vitsinks.posthoc.applied import record, refuse_twice
from vitsinks.posthoc.method import METHODS, TrainFreeMethod
from vitsinks.utils.errors import BadValue

ONSET = 0.5  # the massive block: the first whose top / median ratio reaches this share of the largest one


@torch.no_grad()
def block_peaks(backbone: Backbone, images: torch.Tensor,
                batch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per image and block output h: `top` and `median` (n, L) the largest and median |h| (`residual.block_stats`),
    and per channel `peak_abs` (n, L, D) the largest |h| over tokens and `peak` the signed h at that token."""
    return peaks_of(block_outputs_by_batch(backbone, images, batch_size))


@torch.no_grad()
def peaks_of(batches: Iterable[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`block_peaks` of the block outputs of each batch (a list of (B, N, D) per block)."""
    parts: list[tuple[torch.Tensor, ...]] = []
    for outs in batches:
        per_block = []
        for x in outs:
            h = x.float()
            stats = block_stats(h)
            finite_norms(stats["norm"])  # NaN or inf anywhere in h makes its token's norm so
            peak_abs, token = h.abs().max(dim=1)  # (B, D)
            peak = h.gather(1, token[:, None]).squeeze(1)
            per_block.append((stats["top"][:, 0], stats["abs_median"].to(h.device), peak_abs, peak))
        parts.append(tuple(torch.stack(v, dim=1).cpu() for v in zip(*per_block, strict=True)))
    top, median, peak_abs, peak = (torch.cat(v) for v in zip(*parts, strict=True))
    return top, median, peak_abs, peak


def massive_block(top: torch.Tensor, median: torch.Tensor) -> tuple[int, list[float]]:
    """(the first block whose top / median |h| ratio reaches `ONSET` x the largest, every block's ratio)."""
    mt, mm = top.double().mean(0), median.double().mean(0)
    ratio = torch.where(mm > 0, mt / mm.clamp_min(torch.finfo(torch.float64).tiny), torch.inf)
    return int((ratio >= ONSET * ratio.max()).nonzero()[0]), ratio.tolist()


def massive_state(top: torch.Tensor, median: torch.Tensor, peak_abs: torch.Tensor, peak: torch.Tensor,
                  massive: int) -> dict[str, Any]:
    """`MassiveFix.fit`'s state: the massive block, its top `massive` channels and their mean h at the peak."""
    block, ratios = massive_block(top, median)
    n = min(int(massive), peak_abs.shape[-1])
    channels = peak_abs[:, block].double().mean(0).topk(n).indices
    means = peak[:, block][:, channels].double().mean(0)
    return {"block": block, "channels": channels.tolist(), "means": means.tolist(), "ratio_by_block": ratios}


def fix_channels(blk: Block, channels: list[int], values: list[float]) -> list[RemovableHandle]:
    """Hooks on `blk` (at `norm2`'s input and the MLP branch's output, `blk.mlp_out()`, which its forward and its
    explicit recomputation both run through) that set each of `channels` of the block's output at its massive token
    (the largest |h| in that channel) to the matching `values`. Returns the hooks' handles."""
    ch = torch.tensor(channels, dtype=torch.long)
    target = torch.tensor(values, dtype=torch.float64)
    seen: dict[str, torch.Tensor] = {}

    def keep_mid(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        seen["x"] = args[0]

    def edit(_module: nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
        i = ch.to(out.device)
        h = (seen.pop("x") + out)[:, :, i]  # (B, N, K) the block's output at the channels
        token = h.abs().argmax(dim=1)  # (B, K)
        current = h.gather(1, token[:, None]).squeeze(1)
        out = out.clone()
        rows = torch.arange(out.shape[0], device=out.device)[:, None]
        out[rows, token, i[None, :]] += target.to(out) - current
        return out

    return [blk.norm2.register_forward_pre_hook(keep_mid), blk.mlp_out().register_forward_hook(edit)]


class MassiveFix(TrainFreeMethod):
    """fit: `massive_state`; apply: `fix_channels` with the means (`mean_massive`) or 0 (`zero_massive`)."""

    to_zero: ClassVar[bool] = False

    @classmethod
    def fit(cls, backbone: Backbone, images: torch.Tensor, settings: TrainFreeConfig | Any) -> dict[str, Any]:
        return massive_state(*block_peaks(backbone, images), int(settings.massive))

    @classmethod
    def apply(cls, backbone: Backbone, state: dict[str, Any]) -> Backbone:
        refuse_twice(backbone, "massive")
        block, channels = int(state["block"]), [int(c) for c in state["channels"]]
        depth = len(backbone.blocks)
        width = int(backbone.blocks[0].attn.proj.weight.shape[0]) if depth else 0
        if not 0 <= block < depth or not all(0 <= c < width for c in channels):
            raise BadValue(f"the fitted massive activations (block {block}, channels {channels}) are not in this "
                           f"{depth}-block, {width}-wide model: the state belongs to another architecture")
        values = [0.0] * len(channels) if cls.to_zero else [float(v) for v in state["means"]]
        record(backbone, "massive", fix_channels(backbone.blocks[block], channels, values))
        return backbone


@METHODS.register
class MeanMassive(MassiveFix):
    """The massive activations set to their fitted mean (Sun et al.: the model keeps its accuracy)."""

    name = "mean_massive"
    label = "mean-fixed massive activations"


@METHODS.register
class ZeroMassive(MassiveFix):
    """The massive activations set to 0 (Sun et al.: the model breaks down)."""

    name = "zero_massive"
    label = "zeroed massive activations"
    to_zero = True
