"""Typed results: what one producer (diagnostics, interventions, a probe) writes into a run directory, and the
leaderboard columns it contributes. `@RESULTS.register` adds a `Result` type to the registry that the leaderboard
(`vitsinks.report`) iterates, in the order of the types' `rank`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from vitsinks.utils.columns import Column
from vitsinks.utils.registry import Registry
from vitsinks.utils.rundir import RunDir


@dataclass(frozen=True)
class Probed:
    """How one probe value of a run was made: the probe's seed and the checkpoint's file name (None: unknown)."""

    seed: int | None
    checkpoint: str | None


R = TypeVar("R", bound="Result")


class Result(ABC):
    """A typed result of one producer. `kind` names it; `rank` places its columns on the leaderboard."""

    kind: ClassVar[str]
    rank: ClassVar[int]

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The JSON object written to disk."""

    @classmethod
    @abstractmethod
    def from_json(cls: type[R], obj: dict[str, Any]) -> R:
        """The result from its JSON (also what older versions of the producer wrote)."""

    @classmethod
    @abstractmethod
    def columns(cls) -> list[Column]:
        """The leaderboard columns this result contributes."""

    @classmethod
    @abstractmethod
    def collect(cls, run: RunDir) -> dict[str, Any]:
        """This result's leaderboard values for `run`: every column key (NaN without the result), and extra fields."""

    @classmethod
    def extra_columns(cls, keys: set[str]) -> list[Column]:
        """Columns for values `collect` found beyond `columns()` (`keys`: every key collected over the runs)."""
        return []

    @classmethod
    def probed(cls, run: RunDir) -> dict[str, Probed]:
        """How each of `run`'s values in this result's probe columns (`Column.probe`) was made, by column key, so that
        the leaderboard compares a derived run with its source only where both were measured alike."""
        return {}

    @classmethod
    def missing(cls) -> dict[str, Any]:
        """The values of a run without this result."""
        return {c.key: math.nan for c in cls.columns()}


RESULTS: Registry[type[Result]] = Registry(
    "result type", "a `Result` registered with `@RESULTS.register` in the module of its producer "
    "(docs/extending.md)", key="kind")


def result_types() -> list[type[Result]]:
    """Every registered result type, by rank."""
    return sorted(RESULTS.values(), key=lambda c: c.rank)
