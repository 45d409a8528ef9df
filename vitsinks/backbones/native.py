"""vitsinks' own `SinkViT`: its blocks already are the seam's (`SinkBlock`), so the backbone reads the model itself. A
test-time register goes into the model itself (`add_register`), so that every reader of the model sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from vitsinks.backbones.adapter import ADAPTERS, Adapter
from vitsinks.models import SinkViT
from vitsinks.models.seam import AddedRegister, Backbone, Block
from vitsinks.utils.errors import BadValue


def sinkvit_backbone(model: SinkViT, head: nn.Module | None = None) -> Backbone:
    """`model` as a `Backbone`: its blocks, `embed_tokens`, the final norm, [CLS] then its registers, named by its
    `variant`. `head`: a classifier on the final-norm [CLS] after `fc_norm` (a checkpoint's online probe or supervised
    head, `train.checkpoint.classifier_from_state`); without one, the model's own head where it has classes."""
    classifier: Callable[[torch.Tensor], torch.Tensor] | None = model.forward_head if model.num_classes else None
    if head is not None:
        if model.global_pool != "token":
            raise BadValue(f"a classifier on the [CLS] token needs a ViT that pools with it; this one pools with "
                           f"{model.global_pool!r}")
        head.eval()

        def classifier(final: torch.Tensor) -> torch.Tensor:
            return head(model.fc_norm(final[:, 0]))

    def add(label: str) -> AddedRegister:
        return add_register(model, label, head)

    return Backbone(model, Native.family, cast("list[Block]", list(model.blocks)), model.embed_tokens, model.norm,
                    tuple(model.patch_embed.patch_size), model.num_reg_tokens, 1, classifier, model.variant,
                    add_register=add)


class Restore:
    """Takes a test-time register off a `SinkViT` again (`add_register`): its parameters and counts as before."""

    def __init__(self, model: SinkViT) -> None:
        self.model = model
        self.kept = (model.reg_token, model.pos_embed, model.num_reg_tokens, model.num_prefix_tokens, len(model.edits))

    def remove(self) -> None:
        m = self.model
        m.reg_token, m.pos_embed, m.num_reg_tokens, m.num_prefix_tokens, n = self.kept
        del m.edits[n:]


def add_register(model: SinkViT, label: str, head: nn.Module | None = None) -> AddedRegister:
    """Append one zero register without position embedding after [CLS] and the trained registers of `model`, named
    `label` in its `variant`. Returns the edited model's backbone, how many tokens its embedding made last (a hook on
    `norm_pre`; before any forward, the count at the model's image size) and the handles that take it off."""
    restore = Restore(model)
    r, dim = model.num_reg_tokens, model.embed_dim
    ref = model.cls_token
    assert ref is not None  # a SinkViT always has a [CLS]
    zero = torch.zeros(1, 1, dim, device=ref.device, dtype=ref.dtype)
    reg = zero if model.reg_token is None else torch.cat([model.reg_token.detach(), zero], dim=1)
    model.reg_token = nn.Parameter(reg)
    if model.pos_embed is not None and model.register_pos_embed:
        # the position embedding covers [CLS] + registers + patches: a zero row, i.e. none
        pe = model.pos_embed.detach()
        model.pos_embed = nn.Parameter(torch.cat([pe[:, : 1 + r], pe.new_zeros(1, 1, dim), pe[:, 1 + r :]], dim=1))
    model.num_reg_tokens = r + 1
    model.num_prefix_tokens += 1
    model.edits.append((label, 1))
    seen = {"n": model.tokens_per_image()}

    def keep(_module: nn.Module, _args: Any, out: torch.Tensor) -> None:
        seen["n"] = out.shape[1]

    counter = model.norm_pre.register_forward_hook(keep)
    return AddedRegister(sinkvit_backbone(model, head), lambda: seen["n"], [counter, restore])


@ADAPTERS.register
class Native(Adapter):
    family = "vitsinks"
    priority = 0  # a SinkViT is also a timm VisionTransformer

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, SinkViT)

    @classmethod
    def adapt(cls, model: nn.Module) -> Backbone:
        assert isinstance(model, SinkViT)
        return sinkvit_backbone(model)
