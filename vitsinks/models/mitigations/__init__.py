"""The block mitigations: one module per mitigation in this package, found and imported automatically.

A mitigation is a `BlockMitigation` subclass (`mitigation.py`, which says what it declares) registered with
`@MITIGATIONS.register`. `ModelConfig`, `build_vit`, `SinkBlock`, `checkpoint.ARCH_KEYS`, the variant names, the
diagnostics summary, the interventions and the leaderboard's columns (`mitigation_columns`) derive from the
registry, so a new mitigation is one module here plus its exp config.
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
