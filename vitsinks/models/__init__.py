"""Models: the timm-based ViT builder and the attention module family."""

from vitsinks.models.attention import ATTN_KINDS, GATES, AttnInternals, SinkAttention
from vitsinks.models.vit import (
                                 SIZES,
                                 SinkBlock,
                                 SinkViT,
                                 build_vit,
                                 load_timm_state_dict,
                                 model_from_config,
                                 variant_name,
)

__all__ = [
    "ATTN_KINDS",
    "GATES",
    "SIZES",
    "AttnInternals",
    "SinkAttention",
    "SinkBlock",
    "SinkViT",
    "build_vit",
    "load_timm_state_dict",
    "model_from_config",
    "variant_name",
]
