"""The block mitigations: one module per mitigation in this package, found and imported automatically; each registers
a `BlockMitigation` (`mitigation.py`) with `@MITIGATIONS.register`. Everything else derives from the registry, so a new
mitigation is one module here plus its exp config (docs/extending.md).
"""

from vitsinks.models.mitigations.mitigation import (
    MITIGATIONS,
    SINK_VALUE_EDITS,
    SITES,
    BlockMitigation,
    Site,
    SwitchMitigation,
    at_site,
    brought_edits,
    mitigation_columns,
    mitigation_fields,
    settings,
    slot_edits,
)
from vitsinks.utils.registry import import_members

import_members(__name__)  # each mitigation's module registers it

__all__ = ["MITIGATIONS", "SINK_VALUE_EDITS", "SITES", "BlockMitigation", "Site", "SwitchMitigation", "at_site",
           "brought_edits", "mitigation_columns", "mitigation_fields", "settings", "slot_edits"]
