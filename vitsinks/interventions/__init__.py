"""Causal interventions on sink heads (docs/fidelity.md): `intervene(backbone, images, ...)` (`causal`) edits one head
at a time with its attention held fixed and measures what moves (`engine`, the edits in `edits`); `report` turns the
rows into tables, the summary and the figure. `python -m vitsinks.intervene` is the command line."""

from vitsinks.diagnostics.rules import SinkRules
from vitsinks.interventions.causal import Result, intervene, stage_one
from vitsinks.interventions.edits import EDITS, EditCheckFailed

__all__ = ["EDITS", "EditCheckFailed", "Result", "SinkRules", "intervene", "stage_one"]
