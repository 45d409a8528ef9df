"""Training objectives, one module each behind `base.Objective`, selected by `objective.name` (`OBJECTIVES`)."""

from vitsinks.objectives import lejepa, supervised
from vitsinks.objectives.base import OBJECTIVES, Objective, Runtime, build_objective, register
from vitsinks.objectives.penalty import CommonModePenalty

__all__ = ["OBJECTIVES", "CommonModePenalty", "Objective", "Runtime", "build_objective", "lejepa", "register",
           "supervised"]
