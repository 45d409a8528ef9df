"""Typed results: what one producer (diagnostics, interventions, a probe) writes into a run directory, and the
leaderboard columns it contributes. The leaderboard only collects registered results and renders their columns.

A result type subclasses `Result`: `to_json()` / `from_json()` (the file on disk, unchanged from what the producer
wrote before the type existed), `columns()` (its leaderboard columns) and `collect(run)` (its leaderboard values
for one run: every column's key, NaN where the run has no such result). A column a probe measured names that
probe's protocol (`Column.probe`: one protocol per column), and `probed(run)` says how each such value of the run
was made (`Probed`: the probe's seed and the checkpoint it read), so that the leaderboard compares a derived run
with its source only where both were measured alike. `register_result` adds a type to the registry that
`vitsinks.report` iterates, in the order of the types' `rank`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from vitsinks.utils.rundir import RunDir

ColumnGroup = Literal["quality", "mechanism", "causal"]
GROUPS: tuple[ColumnGroup, ...] = ("quality", "mechanism", "causal")  # the order of the CSV's columns
# The leaderboard's tables, in the order it shows them: a column sits in its `section`, or else in its group's.
# Quantization: every format's columns (each header names its format: W8A8, W4A4, ...) and the float model's inputs.
# Monitors: the SSL monitors of training (k-NN, RankMe), apart from the probes.
SECTIONS: dict[str, str] = {"quality": "Quality", "monitors": "SSL monitors (validation, during training)",
                            "quantization": "Quantization", "sinks": "Sinks per image",
                            "mechanism": "Strongest head, gates and pathways", "residual": "Residual stream",
                            "causal": "Causal edits"}


@dataclass(frozen=True)
class Column:
    """One leaderboard column: `key` (CSV header, unique), `label` (table header), its group (the CSV's order, the
    default table, and which columns can be marked: only quality ones), its number style (`f`: fixed decimals, `g`:
    significant digits, for values spanning decades; each table picks the precision), which direction is better
    (None: neither; the leaderboard marks nothing), the leaderboard table it is shown in (`section`, a key of
    SECTIONS; empty: its group's) and `probe`: the protocol of the probe whose measurement it holds (empty: no
    probe's), the one protocol of every value in the column."""

    key: str
    label: str
    group: ColumnGroup
    fmt: str = "f"
    higher_is_better: bool | None = None
    doc: str = ""
    section: str = ""
    probe: str = ""

    def __post_init__(self) -> None:
        if self.table not in SECTIONS:
            raise ValueError(f"column {self.key!r}: no leaderboard table {self.table!r}; use one of {list(SECTIONS)}")

    @property
    def table(self) -> str:
        """The key of the leaderboard table (SECTIONS) this column is shown in."""
        return self.section or self.group


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


_REGISTRY: dict[str, type[Result]] = {}


def register_result(cls: type[R]) -> type[R]:
    """Class decorator: add a result type to the registry (its `kind` unique)."""
    if _REGISTRY.get(cls.kind, cls) is not cls:
        raise ValueError(f"two result types are registered as {cls.kind!r}")
    _REGISTRY[cls.kind] = cls
    return cls


def result_types() -> list[type[Result]]:
    """Every registered result type, by rank."""
    return sorted(_REGISTRY.values(), key=lambda c: c.rank)
