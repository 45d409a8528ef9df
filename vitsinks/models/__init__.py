"""Models: the timm-based ViT builder, the attention-kind and block-mitigation registries, the model config."""

from vitsinks.models import timm_models  # noqa: F401 - registers the vitsinks ViTs with timm
from vitsinks.models.attention import AttnInternals, SinkAttention, attention_layer
from vitsinks.models.common_mode import CM_EPS, common_mode_penalty, common_mode_ratio, common_mode_terms
from vitsinks.models.config import ModelConfig, arch_keys, run_variant, variant_name
from vitsinks.models.kinds import ATTN_KINDS, FUSED_KINDS, KINDS, AttentionKind
from vitsinks.models.mitigations import MITIGATIONS, BlockMitigation, mitigation_columns
from vitsinks.models.mitigations.gate import GATES, Gate
from vitsinks.models.mitigations.global_pathway import (
    RECIPIENT_GATES,
    GlobalPathway,
    GlobalPathwayConfig,
    PathwayInternals,
)
from vitsinks.models.vit import SIZES, NoMLP, SinkBlock, SinkViT, build_vit, load_timm_state_dict, model_from_config

__all__ = ["ATTN_KINDS", "CM_EPS", "FUSED_KINDS", "GATES", "KINDS", "MITIGATIONS", "RECIPIENT_GATES", "SIZES",
           "AttentionKind", "AttnInternals", "BlockMitigation", "Gate", "GlobalPathway", "GlobalPathwayConfig",
           "ModelConfig", "NoMLP", "PathwayInternals", "SinkAttention", "SinkBlock", "SinkViT", "arch_keys",
           "attention_layer", "build_vit", "common_mode_penalty", "common_mode_ratio", "common_mode_terms",
           "load_timm_state_dict", "mitigation_columns", "model_from_config", "run_variant", "variant_name"]
