"""A leaderboard column as a result type (`vitsinks.utils.results`) or a block mitigation declares it; the leaderboard
(`vitsinks.report`) renders each in its table (`SECTIONS`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ColumnGroup = Literal["quality", "mechanism", "causal"]
GROUPS: tuple[ColumnGroup, ...] = ("quality", "mechanism", "causal")  # the order of the CSV's columns
# The leaderboard's tables, in the order it shows them: a column sits in its `section`, or else in its group's.
SECTIONS: dict[str, str] = {"quality": "Quality", "monitors": "SSL monitors (validation, during training)",
                            "quantization": "Quantization", "sinks": "Sinks per image",
                            "mechanism": "Strongest head, gates and pathways", "residual": "Residual stream",
                            "causal": "Causal edits"}


@dataclass(frozen=True)
class Column:
    """One leaderboard column: `key` (CSV header, unique), `label` (table header), `group` (the CSV's order; only
    quality columns are marked), `fmt` (`f`: fixed decimals, `g`: significant digits), which direction is better
    (None: neither), `section` (its table, a key of SECTIONS; empty: its group's) and `probe` (the protocol of the
    probe that measured every value in it; empty: none)."""

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
