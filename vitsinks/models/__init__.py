"""Models: the timm-based ViT builder, the attention module family and the global pathway."""

from vitsinks.models.attention import ATTN_KINDS, GATES, AttnInternals, SinkAttention
from vitsinks.models.pathway import RECIPIENT_GATES, GlobalPathway, common_mode_penalty
from vitsinks.models.vit import (
    SIZES,
    SinkBlock,
    SinkViT,
    build_vit,
    load_timm_state_dict,
    model_from_config,
    run_variant,
    variant_name,
)

__all__ = [
    "ATTN_KINDS",
    "GATES",
    "RECIPIENT_GATES",
    "SIZES",
    "AttnInternals",
    "GlobalPathway",
    "SinkAttention",
    "SinkBlock",
    "SinkViT",
    "build_vit",
    "common_mode_penalty",
    "load_timm_state_dict",
    "model_from_config",
    "run_variant",
    "variant_name",
]
