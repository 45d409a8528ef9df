"""The attention kinds: one module per kind in this package, each registering an `AttentionKind` (`kind.py`) with
`@KINDS.register`; everything else (`ATTN_KINDS`, the config enum, the variant names, the tests) derives from the
registry, so a new kind is one module here (docs/extending.md).
"""

from vitsinks.models.kinds.kind import (
    DEFAULT_KIND,
    KINDS,
    TINY,
    AttentionKind,
    HeadSpec,
    NoSettings,
    ScoreMod,
    flex_lse,
    kind_names,
)
from vitsinks.models.kinds.registered import ATTN_KINDS, FLEX_KINDS, FUSED_KINDS  # imports every kind's module

__all__ = ["ATTN_KINDS", "DEFAULT_KIND", "FLEX_KINDS", "FUSED_KINDS", "KINDS", "TINY", "AttentionKind", "HeadSpec",
           "NoSettings", "ScoreMod", "flex_lse", "kind_names"]
