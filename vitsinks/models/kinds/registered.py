"""Every kind of this package registered, and the names derived from the registry: `ATTN_KINDS` (the default first),
`FUSED_KINDS` and `FLEX_KINDS` (those with an SDPA / a FlexAttention path)."""

from vitsinks.models.kinds.kind import kind_names
from vitsinks.utils.registry import import_members

import_members("vitsinks.models.kinds")

ATTN_KINDS: tuple[str, ...] = kind_names()
FUSED_KINDS: tuple[str, ...] = kind_names("fused")
FLEX_KINDS: tuple[str, ...] = kind_names("flex")
