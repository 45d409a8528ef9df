"""Analysis passes over a backbone: evaluation mode for the length of a pass, and every block's output, batch by
batch."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from vitsinks.models.seam import Backbone


@contextmanager
def eval_mode(model: nn.Module | Backbone) -> Iterator[torch.device]:
    """`model` (a module or `Backbone`) in evaluation mode inside, its flag restored after; yields its device."""
    was_training = model.training
    model.eval()
    try:
        yield next(model.parameters()).device
    finally:
        model.train(was_training)


def block_outputs_by_batch(backbone: Backbone, images: torch.Tensor,
                           batch_size: int) -> Iterator[list[torch.Tensor]]:
    """For each batch of `images` (moved to the model's device), every block's output tokens [L x (B, N, D)], in
    evaluation mode. Gradients follow the caller's mode: call it under `torch.no_grad()` for an analysis."""
    with eval_mode(backbone) as device:
        for lo in range(0, len(images), batch_size):
            x = backbone.embed_tokens(images[lo : lo + batch_size].to(device))
            outs = []
            for i in range(len(backbone.blocks)):
                x = backbone.block(i, x)
                outs.append(x)
            yield outs
