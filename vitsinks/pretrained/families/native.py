"""vitsinks' own `SinkViT`: its blocks already are the protocol, so the view is the model itself."""

from __future__ import annotations

from torch import nn

from vitsinks.models import SinkViT
from vitsinks.pretrained.families import Adapter, register_adapter
from vitsinks.pretrained.views import Foreign


@register_adapter
class Native(Adapter):
    family = "vitsinks"
    priority = 0  # a SinkViT is also a timm VisionTransformer

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, SinkViT)

    @classmethod
    def adapt(cls, model: nn.Module) -> Foreign:
        head = model.forward_head if model.num_classes else None
        return Foreign(model, cls.family, list(model.blocks), model.embed_tokens, model.norm,  # type: ignore[arg-type]
                       tuple(model.patch_embed.patch_size), model.num_reg_tokens, 1, head, model.variant)
