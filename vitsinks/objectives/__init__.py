"""Training objectives, one module each behind `objective.Objective`, selected by `objective.name` (`OBJECTIVES`); every
module of this package is imported, so a new objective is one module here (or of `plugins=`) and its config."""

from vitsinks.objectives.objective import OBJECTIVES, Objective, Runtime, build_objective
from vitsinks.objectives.penalty import CommonModePenalty
from vitsinks.utils.registry import import_members

import_members(__name__)  # each objective's module registers it

__all__ = ["OBJECTIVES", "CommonModePenalty", "Objective", "Runtime", "build_objective"]
