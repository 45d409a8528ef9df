"""The attention kinds: one module per kind in this package, found and imported automatically.

A kind is an `AttentionKind` subclass (`kind.py`) registered with `@KINDS.register`; `registered.py` imports them
all. Adding a kind is one new module here (and, to train it, one `configs/exp/<name>.yaml`): `ATTN_KINDS`,
`FUSED_KINDS`, `FLEX_KINDS`, the config enum `Attn`, the variant names, the bench and the parametrised tests derive
from the registry.
"""

from vitsinks.models.kinds.kind import DEFAULT_KIND, KINDS, TINY, AttentionKind, ScoreMod, flex_lse, kind_names
from vitsinks.models.kinds.registered import ATTN_KINDS, FLEX_KINDS, FUSED_KINDS  # imports every kind's module

__all__ = ["ATTN_KINDS", "DEFAULT_KIND", "FLEX_KINDS", "FUSED_KINDS", "KINDS", "TINY", "AttentionKind", "ScoreMod",
           "flex_lse", "kind_names"]
