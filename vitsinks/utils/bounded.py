"""Allowed ranges of numeric config fields, kept on the dataclass field: every `int` / `float` field of a config
dataclass (and every `list[int]` / `list[float]`) declares its range with `bounded` instead of `dataclasses.field`,
and `vitsinks.configs.checks.check_config` checks each one after composition. Imports nothing from vitsinks, so that
every package (models included) can use it:

    depth: int | None = bounded(None, ge=1)  # None: the default, never checked
    linear_lrs: list[float] = bounded(factory=lambda: [1e-3, 0.1], gt=0)  # each entry is checked
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

RANGE = "vitsinks.range"  # the metadata key


@dataclass(frozen=True)
class Range:
    """Bounds of a finite number: `ge` / `gt` below, `le` / `lt` above (None: no bound on that side)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def __post_init__(self) -> None:
        if self.ge is not None and self.gt is not None or self.le is not None and self.lt is not None:
            raise TypeError("give at most one lower bound (ge or gt) and one upper bound (le or lt)")

    def describe(self) -> str:
        """`>= 0 and <= 1`, `> 0`, ... (`finite` when no bound is given)."""
        return " and ".join(f"{op} {v:g}" for op, v in self.bounds()) or "finite"

    def admits(self, value: float) -> bool:
        """Whether `value` is a finite number inside the bounds."""
        return (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
                and (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def problem(self, key: str, value: Any, is_list: bool = False) -> str | None:
        """`key=value (must be ...)` when `value` (every entry of a list, `is_list`) is out of the range, else None."""
        values = list(value) if is_list else [value]
        if all(self.admits(v) for v in values):
            return None
        allowed = self.describe()
        if allowed != "finite" and any(isinstance(v, float) and not math.isfinite(v) for v in values):
            allowed = f"finite and {allowed}"  # inf is > 0 and nan compares to nothing: say why it is out
        return f"{key}={values} (every entry must be {allowed})" if is_list else f"{key}={value} (must be {allowed})"

    def bounds(self) -> list[tuple[str, float]]:
        """The bounds as (operator, value) pairs, e.g. [(">=", 0), ("<=", 1)]."""
        return [(op, v) for op, v in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
                if v is not None]


def bounded(default: Any = dataclasses.MISSING, *, ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None, factory: Callable[[], Any] | None = None,
            metadata: Mapping[str, Any] | None = None) -> Any:
    """A dataclass field whose value (or, for a list, each entry) must lie in the range; None is never checked
    (it means "the default"). `factory` instead of `default` for lists; `metadata`: further entries (other keys)."""
    meta = {**(metadata or {}), RANGE: Range(ge=ge, gt=gt, le=le, lt=lt)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def range_of(f: dataclasses.Field) -> Range | None:
    """The range declared on a dataclass field with `bounded` (None: none declared)."""
    return f.metadata.get(RANGE)
