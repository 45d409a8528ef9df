"""Typed results: what one producer (diagnostics, interventions, a probe) writes into a run directory, and the
leaderboard columns it contributes. The leaderboard only collects registered results and renders their columns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ColumnGroup = Literal["quality", "mechanism", "causal"]


@dataclass(frozen=True)
class Column:
    """One leaderboard column: `key` (CSV header, unique), `label` (table header), the table it belongs to, its
    number format, and which direction is better (None: neither; the leaderboard marks nothing)."""

    key: str
    label: str
    group: ColumnGroup
    fmt: str = ".3f"
    higher_is_better: bool | None = None
    doc: str = ""
