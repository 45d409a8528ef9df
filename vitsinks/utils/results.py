"""Typed results: what one producer (diagnostics, interventions, a probe) writes into a run directory, and the
leaderboard columns it contributes. The leaderboard only collects registered results and renders their columns.

A result type subclasses `Result`: `to_json()` / `from_json()` (the file on disk, unchanged from what the producer
wrote before the type existed), `columns()` (its leaderboard columns) and `collect(run)` (its leaderboard values
for one run: every column's key, NaN where the run has no such result). A column a probe measured names that
probe's protocol (`Column.probe`: one protocol per column), and `probed(run)` says how each such value of the run
was made (`Probed`: the probe's seed and the checkpoint it read), so that the leaderboard compares a derived run
with its source only where both were measured alike. `@RESULTS.register` adds a type to the registry that
`vitsinks.report` iterates, in the order of the types' `rank`.
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
    """How one probe value of a run was made: the probe's seed and the file name of the checkpoint it read (None:
    not recorded)."""

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
        """This result's leaderboard values for `run`: every column key (NaN without the result) and any extra
        fields the leaderboard reads (e.g. where the strongest sink sits)."""

    @classmethod
    def extra_columns(cls, keys: set[str]) -> list[Column]:
        """Columns for values `collect` found beyond `columns()` (`keys`: every key collected over the runs)."""
        return []

    @classmethod
    def probed(cls, run: RunDir) -> dict[str, Probed]:
        """How each of `run`'s values in this result's probe columns (`Column.probe`) was made, by column key; a key
        left out is one whose seed and checkpoint are unknown."""
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
