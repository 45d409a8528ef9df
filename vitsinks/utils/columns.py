"""A column of a results table: what a result type, or a block mitigation, declares it measures (key, label,
group, number style, better direction), without knowing the results or the leaderboard that read it.

`vitsinks.utils.results` (the typed results) and the models' mitigations both declare their columns with `Column`;
the leaderboard (`vitsinks.report`) renders them, each in its table (`SECTIONS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
