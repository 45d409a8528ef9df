"""Causal interventions on sink heads (docs/interventions.md): `intervene` (`causal`, `engine`, the edits in `edits`)
and `report` (tables, summary, figure); `python -m vitsinks.intervene` is the command line."""

from vitsinks.diagnostics.rules import SinkRules
from vitsinks.interventions.causal import Result, intervene, stage_one
from vitsinks.interventions.edits import EDITS, EditCheckFailed

__all__ = ["EDITS", "EditCheckFailed", "Result", "SinkRules", "intervene", "stage_one"]
