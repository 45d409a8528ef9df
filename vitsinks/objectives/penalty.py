"""The common-mode penalty (docs/fidelity.md), which any objective can add: hooks on the backbone's blocks record
the common-mode terms of their attention updates during the forward passes of a training step."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import torch

from vitsinks.configs.schema import ObjectiveConfig
from vitsinks.models import SinkBlock, common_mode_ratio, common_mode_terms
from vitsinks.utils.distributed import differentiable_sum, is_distributed
from vitsinks.utils.errors import BadValue


class CommonModePenalty:
    """`lambda_B * mean_l pen_l` over the blocks after `cm_skip_blocks`, pen_l = E(mean_i o_i) / (E(o) + 1e-12) of block
    l's attention update o over the step's forward passes with gradients (and DDP ranks; docs/fidelity.md)."""

    def __init__(self, blocks: Iterable[SinkBlock], cfg: ObjectiveConfig) -> None:
        self.blocks = list(blocks)
        if not 0 <= cfg.cm_skip_blocks < len(self.blocks):
            raise BadValue(f"objective.cm_skip_blocks={cfg.cm_skip_blocks} leaves no block to penalise (the model "
                           f"has {len(self.blocks)}): use 0..{len(self.blocks) - 1}")
        self.lamb, self.skip, self.pre_gate = cfg.cm_penalty, cfg.cm_skip_blocks, cfg.cm_pre_gate
        self.terms: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        self.handles = [blk.register_update_hook(partial(self._record, i)) for i, blk in enumerate(self.blocks)]

    def _record(self, index: int, block: SinkBlock, update: torch.Tensor,
                pre_gate: Callable[[], torch.Tensor]) -> None:
        if torch.is_grad_enabled():
            self.terms[index].append(common_mode_terms(pre_gate() if self.pre_gate else update))

    def reset(self) -> None:
        for terms in self.terms:
            terms.clear()

    def remove(self) -> None:
        """Take the hooks off the blocks."""
        for handle in self.handles:
            handle.remove()

    def __call__(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(lambda_B * the penalty to add to the loss, logged terms: `cm_penalty` and `cm/block<l>`); resets."""
        if any(not t for t in self.terms):
            raise RuntimeError("the common-mode penalty was read before a forward pass with gradients recorded it")
        terms = torch.stack([torch.stack(t).mean(0) for t in self.terms])  # (blocks, 2)
        self.reset()
        if is_distributed():
            terms = differentiable_sum(terms) / torch.distributed.get_world_size()
        per_block = common_mode_ratio(terms[:, 0], terms[:, 1])
        total = per_block[self.skip :].mean()
        return self.lamb * total, {"cm_penalty": total, **{f"cm/block{i}": p for i, p in enumerate(per_block)}}
